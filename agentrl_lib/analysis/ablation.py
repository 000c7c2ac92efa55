"""Ablation grids over the GRPO family: named configs ("arms") trained from one start model at
several task difficulties, with learning curves of held-out accuracy and training reward.

The grid of Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning"
(arXiv:2508.08221): start from GRPO, switch one trick at a time (batch-level std, no std, token-level
aggregation, clip-higher, overlong filtering), and compare with REINFORCE, Lite-PPO (group-mean +
batch-std advantages with token-level aggregation, as ROLL's LitePPO config runs it: with its KL
loss, advantage whitening and clipping and dual-clip) and DAPO (with verl's refill of dynamic
sampling); "Lite-PPO (plain)" and "DAPO (no refill)" are the same without those.

Every arm of one (difficulty, train seed) cell starts from a copy of the same model and uses the same
``cfg.seed``, so the first prompts and the first samples are shared (common random numbers): two arms
that do the same computation give identical numbers, and differences between arms are paired.
The start model's accuracy is measured once per difficulty (greedy decoding is deterministic), not
once per arm.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field, replace

from agentrl_lib.algorithms.grpo import GRPOConfig, budget_spent, completion_sampler, evaluate, \
    preset, train

GRPO_BASE = "GRPO"


CONTROL = "control (lr 0)"


def trick_arms(clip_eps_high: float = 0.28, **shared) -> dict[str, GRPOConfig]:
    """The arms of the grid, in display order; ``shared`` (lr, num_iters, ...) goes into every one.
    After the tricks and the named methods come the matrix's other presets (``grpo.PRESETS``:
    REINFORCE++, GSPO, CISPO), the two named variants "Lite-PPO (plain)" (``lite_ppo_plain``: the
    two tricks alone, beta = 0) and "DAPO (no refill)" (``max_num_gen_batches=1``), and
    ``CONTROL``, GRPO at lr = 0, which must fail every "matches" claim.

    One trick at a time is switched on top of GRPO (group mean/std advantage, sequence-mean loss).
    ``clip_eps_high`` = 0.28 is DAPO's value (Yu et al. 2025), also the default of the library preset.

    >>> arms = trick_arms(num_iters=3)
    >>> list(arms)[:3], arms["Lite-PPO"].estimator, arms["Lite-PPO"].loss_agg
    (['REINFORCE', 'GRPO', 'GRPO + batch std'], 'lite_ppo', 'token_mean')
    >>> {a.num_iters for a in arms.values()}
    {3}
    """
    grpo = preset("grpo", **shared)
    return {
        "REINFORCE": preset("reinforce", **shared),  # batch-mean baseline, no std
        GRPO_BASE: grpo,
        "GRPO + batch std": replace(grpo, estimator="lite_ppo"),  # group mean, batch std
        "GRPO - std": replace(grpo, estimator="dr_grpo"),  # group mean only
        "GRPO + token-mean": replace(grpo, loss_agg="token_mean"),
        "GRPO + clip-higher": replace(grpo, clip_eps_high=clip_eps_high),
        "GRPO + overlong filter": replace(grpo, overlong_filter=True),
        "Lite-PPO": preset("lite_ppo", **shared),
        "DAPO": preset("dapo", **{"clip_eps_high": clip_eps_high, **shared}),
        "REINFORCE++": preset("reinforce_pp", **shared),
        "GSPO": preset("gspo", **shared),
        "CISPO": preset("cispo", **shared),
        "Lite-PPO (plain)": preset("lite_ppo_plain", **shared),
        "DAPO (no refill)": preset("dapo", **{"clip_eps_high": clip_eps_high, **shared,
                                              "max_num_gen_batches": 1}),
        CONTROL: replace(grpo, lr=0.0),  # a trainer that does nothing: the negative control
    }


@dataclass
class ArmRun:
    """One arm trained once at one difficulty."""

    arm: str
    difficulty: int
    train_seed: int
    cfg: GRPOConfig
    rows: list[dict] = field(repr=False)
    """the rows logged by ``grpo.train`` (rollout/reward, rollout/kept_frac, losses/clipfrac, ...)"""
    eval_steps: list[int]
    """updates done when each accuracy was measured; 0 is the start model"""
    eval_acc: list[float]
    wall_s: float
    task_reward: list[float] = field(default_factory=list)
    """mean of the reward functions per update, before any shaping ``train`` adds (DAPO's overlong
    penalty is in ``rows[i]["rollout/reward"]`` but not here), so arms compare on the same scale"""

    @property
    def start_acc(self) -> float:
        return self.eval_acc[0]

    @property
    def final_acc(self) -> float:
        return self.eval_acc[-1]

    @property
    def gain(self) -> float:
        """held-out accuracy after training minus before"""
        return self.final_acc - self.start_acc

    def curve(self, key: str) -> list[float]:
        """A per-update column of ``rows`` (NaN where an update did not log it), e.g.
        ``"losses/clipfrac"``."""
        return [float(r.get(key, math.nan)) for r in self.rows if "rollout/reward" in r]


def run_arm(start_model, tokenizer, cfg: GRPOConfig, train_problems: list[dict], reward_funcs: list,
            eval_problems: list[dict], eval_reward, start_acc: float, eval_every: int,
            arm: str = "", difficulty: int = 0, eval_max_new_tokens: int | None = None) -> ArmRun:
    """Train a deep copy of ``start_model`` with ``cfg`` and measure greedy held-out accuracy every
    ``eval_every`` updates and after the last (``start_acc`` is the value at update 0; the last
    is the one that spends ``cfg.max_groups``, when set). ``start_model`` is the reference of the
    KL term when ``cfg.beta`` != 0."""
    model = copy.deepcopy(start_model)
    steps, accs, task_reward, scored = [0], [float(start_acc)], [], []
    max_new = eval_max_new_tokens or cfg.max_new_tokens

    def recorded(completions, **columns):
        # ``train`` scores each generation round once with its reward functions (a refill: several)
        total = [0.0] * len(completions)
        for f in reward_funcs:
            total = [t + v for t, v in zip(total, f(completions, **columns))]
        scored.extend(total)
        return total

    def on_step(row):
        task_reward.append(sum(scored) / len(scored))  # over every completion of the update
        scored.clear()
        done = row["iter"]  # updates finished (``loop.run``'s rows)
        if done % eval_every == 0 or done == cfg.num_iters or budget_spent(cfg, row):
            steps.append(done)
            accs.append(evaluate(model, tokenizer, eval_problems, eval_reward, max_new)["acc"])

    t0 = time.time()
    sample = completion_sampler(tokenizer, train_problems, [recorded], cfg)
    rows = train(model, sample, cfg, on_step=on_step, eos_id=tokenizer.eos_token_id,
                 ref_model=start_model if cfg.beta != 0.0 else None)
    return ArmRun(arm, difficulty, cfg.seed, cfg, rows, steps, accs, time.time() - t0, task_reward)


def run_grid(start_model, tokenizer, arms: dict[str, GRPOConfig], difficulties: list[int],
             data: dict, reward_funcs: list, eval_reward, eval_every: int,
             train_seeds: list[int] = (0,), per_difficulty: dict | None = None,
             start_accs: dict | None = None, progress=print) -> list[ArmRun]:
    """Every arm at every difficulty for every train seed.

    data: {difficulty: (train_problems, eval_problems)}; per_difficulty: {difficulty: {field: value}}
    config overrides (e.g. ``max_new_tokens``); each run's ``cfg.seed`` is its train seed.
    start_accs: {difficulty: accuracy of start_model} when already measured (else measured here).
    """
    per_difficulty = per_difficulty or {}
    start_accs = start_accs or {}
    runs = []
    for d in difficulties:
        train_problems, eval_problems = data[d]
        over = per_difficulty.get(d, {})
        max_new = over.get("max_new_tokens", next(iter(arms.values())).max_new_tokens)
        start_acc = start_accs.get(d)
        if start_acc is None:
            start_acc = evaluate(start_model, tokenizer, eval_problems, eval_reward, max_new)["acc"]
        for s in train_seeds:
            for name, cfg in arms.items():
                run = run_arm(start_model, tokenizer, replace(cfg, seed=s, **over), train_problems,
                              reward_funcs, eval_problems, eval_reward, start_acc, eval_every,
                              arm=name, difficulty=d)
                runs.append(run)
                if progress:
                    progress(f"d={d} seed={s} {name:24s} acc {run.start_acc:.3f} -> "
                             f"{run.final_acc:.3f} ({run.wall_s:.1f} s)")
    return runs


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (ddof=1) of a list; the error of a single value is NaN.

    >>> m, se = mean_se([1.0, 2.0, 3.0]); m, round(se, 6)
    (2.0, 0.57735)
    >>> mean_se([0.5])
    (0.5, nan)
    """
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, math.nan
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


def gains(runs: list[ArmRun]) -> dict[tuple[str, int], list[float]]:
    """{(arm, difficulty): [gain per train seed]} in the order the runs came."""
    out: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        out.setdefault((r.arm, r.difficulty), []).append(r.gain)
    return out


def trick_effects(runs: list[ArmRun], baseline: str = GRPO_BASE) -> dict[tuple[str, int], list[float]]:
    """Paired effect of each arm against ``baseline``: gain(arm) - gain(baseline) for each train
    seed at each difficulty (the two share the seed, the start model and the panel).

    >>> from agentrl_lib.algorithms.grpo import GRPOConfig
    >>> mk = lambda a, acc: ArmRun(a, 2, 0, GRPOConfig(), [], [0, 5], [0.5, acc], 0.0)
    >>> trick_effects([mk("GRPO", 0.6), mk("X", 0.7)])
    {('X', 2): [0.09999999999999998]}
    """
    base = {(r.difficulty, r.train_seed): r.gain for r in runs if r.arm == baseline}
    out: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        if r.arm != baseline and (r.difficulty, r.train_seed) in base:
            out.setdefault((r.arm, r.difficulty), []).append(r.gain - base[(r.difficulty, r.train_seed)])
    return out
