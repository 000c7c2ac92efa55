"""The positive control every LM comparison stands on (issue 26, section 4): for each environment an
LM rung uses, its BPE agent base's sampled success on a fixed panel, and what plain GRPO makes of it
within one arm's `cpu` budget.

For each environment (``CONTROLS``):
1. the base (``sft.BASE_MODELS[name]``, built on first use and cached; shipped in ``bases/``);
2. its **sampled** success (temperature 1) on the judged panel: ``panel_seeds`` task seeds x
   ``samples`` episodes (>= 256 episodes), seeds 10**6 + i, the same draws at every evaluation;
3. the lr of plain GRPO, picked by the library's one rule (``pipeline.tuning.pick_lr``) on tuning
   seeds: every lr of ``LRS``, ``TUNING_ITERS`` updates, scored by the final success on a tuning
   panel (seeds 2 * 10**6 + i) that is not the judged one;
4. plain GRPO (the episode-level estimator, token-mean loss, no KL) from the base with that lr,
   ``iters`` updates of ``prompts`` x ``group`` episodes, training seed 0, timed;
5. the judged panel again. Standard errors are binomial, sqrt(p (1 - p) / n) over the n panel
   episodes; the lift is (final - start) / sqrt(SE_start^2 + SE_final^2).
Targets (fixed before any run): start in [0.2, 0.7]; lift >= 3 SE; the final run <= 5 minutes.

Run one environment (writes ``controls/<env>.json``) or assemble the table (``positive_controls.md``):

    python reproductions/bases/positive_controls.py grid5
    python reproductions/bases/positive_controls.py --table
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from agentrl_lib.algorithms import grpo, sft
from agentrl_lib.algorithms.grpo import GRPOConfig
from agentrl_lib.pipeline.tuning import pick_lr

HERE = Path(__file__).resolve().parent
LRS = (3e-4, 1e-3, 3e-3)
TUNING_SEEDS = (1000, 2000)
TUNING_ITERS = 10
PANEL, TUNING_PANEL = 10**6, 2 * 10**6


@dataclass
class Control:
    base: str
    """a name of ``sft.BASE_MODELS`` (a BPE agent base)"""
    max_new_tokens: int
    """token budget of one action"""
    iters: int = 30
    prompts: int = 8
    group: int = 8
    panel_seeds: int = 128
    samples: int = 2


CONTROLS = {
    "grid": Control("grid-agent-bpe", max_new_tokens=4),
}
"""environment name -> its control (filled as each environment's base is built)"""


def make_env_of(base: str):
    cfg = sft.BASE_MODELS[base]
    return lambda: sft.sft_env(cfg.env, **cfg.env_kwargs), cfg


def panel(model, tok, make_env, cfg, ctl: Control, first: int, seed: int = 0) -> dict:
    seeds = [first + i for i in range(ctl.panel_seeds)]
    return grpo.evaluate_agent(model, tok, make_env, seeds, cfg.max_turns, ctl.max_new_tokens,
                               ctl.samples, seed=seed, system_prompt=cfg.system_prompt)


def train(model, tok, make_env, cfg, ctl: Control, lr: float, iters: int, seed: int):
    gcfg = GRPOConfig(num_iters=iters, num_prompts=ctl.prompts, group_size=ctl.group, lr=lr,
                      max_turns=cfg.max_turns, max_new_tokens=ctl.max_new_tokens,
                      loss_agg="token_mean", eval_every=iters, seed=seed)
    train_seeds = list(range(10_000, 20_000))
    sample = grpo.episode_sampler(tok, make_env, train_seeds, gcfg, cfg.system_prompt)
    return grpo.train(model, sample, gcfg)


def run(name: str) -> dict:
    torch.set_num_threads(1)
    ctl = CONTROLS[name]
    make_env, cfg = make_env_of(ctl.base)
    t0 = time.time()
    base, tok = sft.load_base(ctl.base, verbose=False)
    build_s = time.time() - t0
    start = panel(base, tok, make_env, cfg, ctl, PANEL)
    sweep = {}
    for lr in LRS:
        scores = []
        for s in TUNING_SEEDS:
            model = copy.deepcopy(base)
            train(model, tok, make_env, cfg, ctl, lr, TUNING_ITERS, s)
            scores.append(panel(model, tok, make_env, cfg, ctl, TUNING_PANEL)["success"])
        sweep[lr] = scores
    lr = pick_lr(sweep)
    model = copy.deepcopy(base)
    t1 = time.time()
    train(model, tok, make_env, cfg, ctl, lr, ctl.iters, 0)
    train_min = (time.time() - t1) / 60
    final = panel(model, tok, make_env, cfg, ctl, PANEL)
    n = ctl.panel_seeds * ctl.samples
    se = lambda p: math.sqrt(max(p * (1 - p), 1e-12) / n)  # noqa: E731
    p0, p1 = start["success"], final["success"]
    row = dict(env=name, base=ctl.base, panel_episodes=n, start=p0, final=p1, se_start=se(p0),
               se_final=se(p1), lift_se=(p1 - p0) / math.hypot(se(p0), se(p1)), lr=lr,
               sweep={str(k): v for k, v in sweep.items()}, train_min=train_min,
               episodes=ctl.iters * ctl.prompts * ctl.group, build_s=build_s,
               start_invalid=start["invalid"], final_invalid=final["invalid"])
    (HERE / "controls").mkdir(exist_ok=True)
    (HERE / "controls" / f"{name}.json").write_text(json.dumps(row, indent=1) + "\n")
    return row


def table() -> str:
    rows = [json.loads(p.read_text()) for p in sorted((HERE / "controls").glob("*.json"))]
    lines = ["| environment | base | panel episodes | start (SE) | GRPO final (SE) | lift, SE | lr | "
             "episodes | minutes | start in [0.2, 0.7] | lift >= 3 SE | <= 5 min |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = lambda b: "yes" if b else "no"  # noqa: E731
        lines.append(f"| {r['env']} | {r['base']} | {r['panel_episodes']} | {r['start']:.3f} "
                     f"({r['se_start']:.3f}) | {r['final']:.3f} ({r['se_final']:.3f}) | "
                     f"{r['lift_se']:.1f} | {r['lr']:g} | {r['episodes']} | {r['train_min']:.1f} | "
                     f"{ok(0.2 <= r['start'] <= 0.7)} | {ok(r['lift_se'] >= 3)} | "
                     f"{ok(r['train_min'] <= 5)} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("envs", nargs="*", help=f"environments: {', '.join(CONTROLS)}")
    ap.add_argument("--table", action="store_true", help="print the table of the controls run")
    args = ap.parse_args()
    unknown = [e for e in args.envs if e not in CONTROLS]
    if unknown:
        raise SystemExit(f"unknown environment(s) {unknown}; choose from {list(CONTROLS)}")
    for name in args.envs:
        print(json.dumps(run(name)))
    if args.table:
        print(table())


if __name__ == "__main__":
    main()
