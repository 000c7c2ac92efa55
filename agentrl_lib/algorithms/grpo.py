"""The critic-free policy-gradient family for language models, single- and multi-turn: REINFORCE,
RLOO, GRPO, Dr. GRPO, DAPO, Lite-PPO, REINFORCE++, GSPO and CISPO as one loss chosen by a few
orthogonal config fields (``matrix()`` shows them as a table), GiGPO's turn-level advantages for
agents, and the one training loop around them.

The knobs (as AReaL's algorithm configuration matrix):
- the advantage, ``estimator``: a named point of ``core.ESTIMATORS``, i.e. a mean level (group /
  batch / none), a std level (group / batch / none) and leave-one-out
  (``core.normalised_advantages``);
- the importance ratio, ``is_level``: per token, or one per sequence (GSPO);
- the clip, ``clip``: 'ppo' (the clipped surrogate, zero gradient outside [1 - clip_eps,
  1 + clip_eps_high]) or 'cispo' (the detached weight is capped to that range, every token keeps
  its gradient), with ``clip_eps`` and ``clip_eps_high`` (clip-higher);
- the aggregation, ``loss_agg``; and DAPO's ``dynamic_sampling`` and overlong shaping.
With ``num_epochs=1`` the batch is trained on at the policy that sampled it (rho = 1), where GSPO's
gradient equals GRPO's and CISPO's equals the token-mean PPO one: those knobs act off-policy only.

The loop (``train``, on ``loop.run``) is fed by a *sampling function* ``sample(model, it) -> Batch``:
- ``completion_sampler``: single-turn RLVR, ``num_prompts`` problems x ``group_size`` completions,
  scored by reward functions in TRL's signature;
- ``episode_sampler``: multi-turn agents, ``num_prompts`` task seeds x ``group_size`` episodes of a
  text environment played by the LM on a persistent KV cache (``rollout.lm_rollout``).
``advantages`` turns a batch into per-sequence (single-turn: ``core.group_advantages``) or
per-token (multi-turn: ``credit`` turn advantages spread over each action's tokens) advantages,
and ``update`` takes ``num_epochs`` clipped steps on them. ``ppo_lm.train`` reuses the same
sampling functions and ``loop.run`` with its critic's update.

Papers (each preset's values, ``PRESETS``, say where they come from):
- GRPO: Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300 (group mean/std advantage, per-sequence
  token mean, k3 KL to a reference).
- RLOO: Ahmadian et al. 2024, arXiv:2402.14740 (leave-one-out baseline).
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783 (no std
  division; sum over tokens divided by a constant, B * max_completion_length).
- DAPO: Yu et al. 2025, arXiv:2503.14476 (clip-higher eps_high = 0.28, dynamic sampling,
  token-level aggregation, overlong reward shaping).
- Lite-PPO: Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
  arXiv:2508.08221 (group-mean advantage with batch-level std, token-level aggregation, the plain
  PPO clipped loss).
- REINFORCE++: Hu 2025, arXiv:2501.03262 (no critic; the advantage normalised over the whole
  batch, mean and std; PPO's clip at 0.2). Inferred or simplified here: the batch statistics are
  over sequences (OpenRLHF whitens per token, so longer completions weigh more, with ddof=0 and
  eps inside the sqrt); the loss is the token mean (OpenRLHF's default); its KL penalty sits in
  the per-token reward (k1, coefficient 0.01 in OpenRLHF); the preset has ``beta=0``, ``beta``
  adds a KL term to the loss, and ``kl_in_reward`` puts it in the reward summed per completion
  (verl's GRPO placement, not OpenRLHF's per-token whitening of it). Its "REINFORCE++-baseline"
  (group mean, then batch whitening) is close to, not equal to, Lite-PPO's advantage.
- GSPO: Zheng et al. 2025, arXiv:2507.18071 (sequence-level ratio s_i = exp(mean_t log rho_t),
  clipped with eps = 3e-4, eps_high = 4e-4 (paper v2, sec. 5.1, as quoted by TRL's paper index),
  group-normalised advantages, per-sequence mean, no KL).
- CISPO: MiniMax 2025, "MiniMax-M1", arXiv:2506.13585 (the IS weight clipped and detached,
  group-normalised advantages, token-level mean over the batch; no lower bound on the weight: the
  paper sets eps_low "to a large value", here clip_eps = 1, a bound of 0). The paper gives no
  eps_high: 4.0 (a cap of 5) is ScaleRL's eps_max (Khatri et al. 2025, arXiv:2510.13786), the
  value TRL's docs recommend for ``loss_type="cispo"``.
- GiGPO: Feng et al. 2025, arXiv:2505.10978 (episode advantage + omega x anchor-state step
  advantage, gamma = 0.95, omega = 1; ``credit.gigpo_advantages``).

Aggregation names follow TRL's GRPOTrainer ``loss_type`` (1.16): ``seq_mean`` is TRL's "grpo",
``token_mean`` is "bnpo" (and "dapo" for a single process), ``const_norm`` is "dr_grpo".
TRL 1.16's ``importance_sampling_level`` is ``is_level``; its ``loss_type="cispo"`` is
``clip='cispo'`` with ``loss_agg='token_mean'``, ``clip_eps >= 1`` (no lower bound) and TRL's
``epsilon_high`` = 1 + ``clip_eps_high`` (TRL's cap is on rho itself). ``tests/test_grpo.py``
checks the loss and its gradient against TRL's ``_compute_loss`` on the same inputs for each.

Logged rows (``loop.run``: ``iter`` 0 with the start's evaluation, then one per update, ``iter`` =
updates done): ``eval/*`` (the ``evaluate`` callback's dict at 0, every ``eval_every`` updates and
after the last), ``rollout/*`` (reward, completion_len,
kept_frac; multi-turn: success, turns, invalid), ``losses/*`` (loss, entropy, clipfrac, approx_kl,
kl), ``time/*`` (gen_s, step_s, eval_s).
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

from agentrl_lib import core
from agentrl_lib.algorithms import credit, empg, loop, turn_credit
from agentrl_lib.algorithms.turn_credit import CRITIC_ESTIMATORS, GROUP_ESTIMATORS, TURN_ESTIMATORS
from agentrl_lib.rollout import Generation, concat_generations, episode_stats, format_prompts, \
    generate, generation_logps, lm_rollout, model_device, pad_episodes, token_generator
from agentrl_lib.utils import check_schedule, optimizer_step, progress, scheduled

Tensor = torch.Tensor


@dataclass
class GRPOConfig:
    estimator: str = "grpo"
    """the advantage: single-turn one of ``core.ESTIMATORS`` ('reinforce', 'batch_mean', 'rloo',
    'grpo', 'dr_grpo', 'lite_ppo', 'reinforce_pp'); multi-turn one of
    ``turn_credit.TURN_ESTIMATORS``, the table agents' list: 'grpo' (the episode return
    normalised in its group, on every turn), 'gigpo' (plus omega x the anchor-state step
    advantage), 'salt' (trajectory-graph step advantages), 'hgpo' (GiGPO with a hierarchy of
    history-consistent step groups), 'reinforce' (the return, no baseline), and, through
    ``lm_credit(cfg, model)`` (``train`` builds it when no ``credit_fn`` is given), 'turn_gae' and
    'hiper' (a tabular critic over the environment's state keys) and 'empg' (the model's turn
    entropies); any other turn-level estimator through ``credit_fn``"""
    std_ddof: int = 1
    """ddof of the std in 'grpo', 'lite_ppo' and 'reinforce_pp' (1 as torch.std and TRL)"""
    loss_agg: str = "seq_mean"
    """'seq_mean' (mean over each sequence's tokens, then over sequences: GRPO), 'token_mean' (mean
    over every token of the batch: DAPO, Lite-PPO), 'const_norm' (sum / (B * max_new_tokens): Dr. GRPO)"""
    clip_eps: float = 0.2
    """clip range, lower side: rho is clipped to [1 - clip_eps, 1 + clip_eps_high] (also the upper
    side unless clip_eps_high is set); 1 or more leaves the weight without a lower bound"""
    clip_eps_high: float | None = None
    """upper clip (DAPO's clip-higher: 0.28)"""
    is_level: str = "token"
    """the importance ratio: 'token' (rho_t per token: PPO, GRPO) or 'sequence' (GSPO: one ratio per
    sequence, exp of the mean of its tokens' log-ratios, clipped as a whole)"""
    clip: str = "ppo"
    """'ppo' (-min(rho A, clip(rho) A): no gradient where the clip is active) or 'cispo'
    (-sg(clip(rho)) A log pi: the weight is capped and detached, every token keeps its gradient)"""
    beta: float = 0.0
    """weight of the KL penalty to the reference (initial) policy; 0 skips the reference model
    (``train`` makes the reference, ``make_reference``, when none is given)"""
    kl_estimator: str = "k3"
    """'k1', 'k2', 'k3' (GRPO uses k3) or 'low_var_kl' (verl's: k3 clamped to [-10, 10]);
    ``core.kl_estimate``"""
    kl_in_reward: bool = False
    """where the beta KL goes. False: a term of the loss, beta KL_t per token aggregated with the
    policy loss (DeepSeekMath's GRPO; verl's ``actor.use_kl_loss=True``). True: into each
    completion's reward before the advantages, r - beta sum_t KL_t of the sampling policy's
    log-probs against the reference's (``core.kl_penalised_rewards``; verl's
    ``algorithm.use_kl_in_reward``, or ``actor.use_kl_loss=False`` in older verl, where
    ``apply_kl_penalty`` runs with ``algorithm.kl_ctrl.kl_coef``). Single-turn"""
    adv_eps: float = 1e-4
    """single-turn: eps of the std in the group advantage (r - mean) / (std + eps): 1e-4 as TRL,
    1e-6 in verl's ``compute_grpo_outcome_advantage``"""
    dynamic_sampling: bool = False
    """drop groups whose task rewards (before overlong shaping: verl's ``filter_groups.metric``
    'acc') are all equal, they carry no gradient, before the update (DAPO)"""
    max_num_gen_batches: int = 1
    """dynamic sampling's refill (DAPO; verl's ``filter_groups.max_num_gen_batches``, 10 in its
    DAPO recipes): ``completion_sampler`` generates up to this many rounds of ``num_prompts``
    prompts for one update, keeping the groups whose task rewards differ, until ``num_prompts``
    are kept (``core.first_informative``; verl raises when the rounds run out, here the update
    trains on what it has); 1: no refill, the update trains on the informative groups of one
    round. Single-turn"""
    max_groups: int | None = None
    """the rollout budget in groups (prompts x G completions) over the whole run: training stops
    after the update that leaves less than one round of ``num_prompts`` groups (``budget_spent``),
    and a refill never generates past it; with refill a run under the budget num_iters x
    num_prompts makes fewer updates than num_iters. None: no budget"""
    whiten_adv: bool = False
    """ROLL's ``whiten_advantages`` (its LitePPO config: true): after the estimator, whiten the
    advantages over every real token of the batch (``core.whiten_clip_advantages``)"""
    adv_clip: float | None = None
    """ROLL's ``advantage_clip`` (LitePPO: 2.0): clamp the (whitened) advantages to +-adv_clip"""
    dual_clip: float | None = None
    """dual-clip PPO's c (ROLL's ``dual_clip_loss``, LitePPO: true, with c = 1 + 2 clip_eps = 1.4):
    where A < 0 the per-token loss is capped at -c A (``core.clipped_token_loss``)"""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment: length window before max_new_tokens where a linear penalty
    grows to ``overlong_penalty``; 0 turns it off (single-turn)"""
    overlong_penalty: float = 1.0
    overlong_filter: bool = False
    """leave truncated completions (no end-of-sequence within max_new_tokens) out of the loss
    (DAPO's overlong filtering; one of the tricks ablated in Tricks or Traps; single-turn)"""
    num_prompts: int = 16
    """groups per update: prompts (single-turn) or task seeds (multi-turn)"""
    group_size: int = 8
    """completions or episodes per prompt (G)"""
    num_iters: int = 100
    """updates (one sampling round each)"""
    num_epochs: int = 1
    """optimizer steps on each sampling round (>1 makes the ratio and clipping matter)"""
    lr: float = 1e-3
    """AdamW learning rate, constant, no weight decay"""
    max_new_tokens: int = 8
    """token budget of a completion (single-turn) or of one action (multi-turn)"""
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    eval_every: int = 10
    """updates between evaluations (and after the last)"""
    max_turns: int = 6
    """multi-turn: turn cap of an episode (the environment's own cap applies too)"""
    max_context: int | None = None
    """multi-turn: end an episode whose next turn could pass this many tokens (``lm_rollout``;
    e.g. 512, the positions the tiny LM was trained on); None: no cap"""
    horizon_schedule: tuple | None = None
    """multi-turn: ((from_iter, max_turns), ...): from sampling round ``from_iter`` (0-based,
    ascending, the first 0) episodes are cut at that many turns; replaces ``max_turns``
    (AgentGym-RL's ScalingInter-RL)"""
    entropy_coef: float = 0.0
    """weight of a constant entropy bonus: loss -= entropy_coef * masked mean token entropy (the
    entropy of the temperature-scaled distribution, with gradient; verl's ``entropy_coeff``,
    ``dp_actor.update_policy``: ``pg_loss - agg_loss(entropy) * entropy_coeff``, the same
    number under ``loss_agg='token_mean'``; other aggregations still take the token mean)"""
    invalid_penalty: float = 0.0
    """multi-turn 'grpo', 'gigpo': subtracted from the score of each turn whose action was
    invalid (verl-agent's ``invalid_action_penalty_coef``; ``credit.step_scores``); needs
    ``cross_steps``"""
    cross_steps: bool = False
    """multi-turn 'grpo', 'gigpo': normalise per-turn scores over every turn of the group's
    episodes (verl-agent's per-step rows, ``compute_mean_std_cross_steps=True``) instead of one
    return per episode (``credit.grpo_broadcast``)"""
    gamma: float = 0.95
    """multi-turn: discount of GiGPO's step-level returns (the paper's 0.95)"""
    omega: float = 1.0
    """multi-turn: weight of GiGPO's step advantage (the paper's 1)"""
    norm_adv: bool = True
    """multi-turn: divide group-centred values by the group std (std_ddof); False = mean-only.
    Single-turn estimators name their std instead ('dr_grpo' is 'grpo' without it)"""
    lam: float = 0.95
    """multi-turn: GAE lambda ('turn_gae', 'hiper')"""
    hgpo_depth: int = 2
    """multi-turn 'hgpo': the deepest history level K of the group hierarchy"""
    segment_len: int | None = None
    """multi-turn 'hiper': executor segments of this many turns; None: one per stage of the
    state key"""
    critic_lr: float = 0.5
    """multi-turn 'turn_gae', 'hiper': step of the tabular critic toward the returns-to-go
    (``lm_credit``, ``credit.fit_critic``)"""
    report_to: str | None = None
    """'tensorboard' copies the logged rows to TensorBoard (``tblog``), 'none' does not; None:
    ``$AGENTRL_REPORT_TO`` (``agentrl run --report-to``), else 'none'. As TRL's ``report_to``"""
    logging_dir: str | None = None
    """TensorBoard's folder; None: ``$AGENTRL_RUN_DIR/tensorboard``, else ``runs/tensorboard``"""
    seed: int = 0
    """seeds the prompt draws and the sampling"""

    def __post_init__(self):
        if self.estimator not in tuple(core.ESTIMATORS) + TURN_ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; choose one of "
                             f"{tuple(core.ESTIMATORS)} (single-turn) or {TURN_ESTIMATORS} "
                             "(multi-turn)")
        if self.kl_estimator not in core.KL_ESTIMATORS:
            raise ValueError(f"unknown kl_estimator {self.kl_estimator!r}; choose one of "
                             f"{core.KL_ESTIMATORS}")
        if self.loss_agg not in core.AGGREGATIONS:
            raise ValueError(f"unknown loss_agg {self.loss_agg!r}; choose one of {core.AGGREGATIONS}")
        if self.is_level not in core.IS_LEVELS:
            raise ValueError(f"unknown is_level {self.is_level!r}; choose one of {core.IS_LEVELS}")
        if self.clip not in core.CLIPS:
            raise ValueError(f"unknown clip {self.clip!r}; choose one of {core.CLIPS}")
        if not self.clip_eps > 0:
            raise ValueError(f"clip_eps must be > 0, got {self.clip_eps!r}")
        if self.clip_eps_high is not None and not self.clip_eps_high > 0:
            raise ValueError(f"clip_eps_high must be > 0 or None, got {self.clip_eps_high!r}")
        if self.dual_clip is not None and not (self.dual_clip > 1 and self.clip == "ppo"):
            raise ValueError(f"dual_clip must be > 1 (with clip='ppo') or None, got "
                             f"{self.dual_clip!r}")
        if self.adv_clip is not None and not self.adv_clip > 0:
            raise ValueError(f"adv_clip must be > 0 or None, got {self.adv_clip!r}")
        if self.max_num_gen_batches < 1 or (self.max_num_gen_batches > 1
                                            and not self.dynamic_sampling):
            raise ValueError(f"max_num_gen_batches must be >= 1, and > 1 only with "
                             f"dynamic_sampling; got {self.max_num_gen_batches!r}")
        if self.max_groups is not None and self.max_groups < self.num_prompts:
            raise ValueError(f"max_groups={self.max_groups} is less than one round of "
                             f"num_prompts={self.num_prompts}")
        if self.horizon_schedule is not None:
            check_schedule(self.horizon_schedule)
        credit.check_step_options(self.invalid_penalty, self.cross_steps)
        knobs = core.ESTIMATORS.get(self.estimator, {})
        if self.group_size < 2 and (self.estimator in GROUP_ESTIMATORS
                                    or "group" in knobs.values()):
            raise ValueError(f"estimator {self.estimator!r} needs group_size >= 2")


# The named methods as config values; every value that is not a GRPOConfig default is the paper's
# (module docstring; DAPO's overlong_buffer is scaled down to the tiny LM's completion lengths).
# DAPO as verl's recipe runs it (recipe/dapo: run_dapo_*.sh, dapo_ray_trainer.py): dynamic sampling
# refills the batch over up to 10 generation rounds. Lite-PPO as ROLL's LitePPO config runs it
# (docs "LitePPO": use_kl_loss, kl_loss_coef 0.001, whiten_advantages, advantage_clip 2.0,
# dual_clip_loss; the KL is k3, ActorWorker.loss_func); 'lite_ppo_plain' is its two tricks alone
# (TRL's scale_rewards="batch", loss_type="bnpo"), this library's Lite-PPO before issue 27.
PRESETS = {
    "reinforce": dict(estimator="batch_mean", loss_agg="seq_mean"),
    "rloo": dict(estimator="rloo", loss_agg="seq_mean"),
    "grpo": dict(estimator="grpo", loss_agg="seq_mean"),
    "dr_grpo": dict(estimator="dr_grpo", loss_agg="const_norm"),
    "dapo": dict(estimator="grpo", loss_agg="token_mean", clip_eps_high=0.28,
                 dynamic_sampling=True, max_num_gen_batches=10, overlong_buffer=2),
    "lite_ppo": dict(estimator="lite_ppo", loss_agg="token_mean", beta=0.001, kl_estimator="k3",
                     whiten_adv=True, adv_clip=2.0, dual_clip=1.4),
    "lite_ppo_plain": dict(estimator="lite_ppo", loss_agg="token_mean"),
    "reinforce_pp": dict(estimator="reinforce_pp", loss_agg="token_mean"),  # OpenRLHF's token mean
    "gspo": dict(estimator="grpo", loss_agg="seq_mean", is_level="sequence", clip_eps=3e-4,
                 clip_eps_high=4e-4),  # GSPO v2, sec. 5.1
    "cispo": dict(estimator="grpo", loss_agg="token_mean", clip="cispo", clip_eps=1.0,
                  clip_eps_high=4.0),  # no lower bound (MiniMax-M1); cap 5 (ScaleRL, inferred)
}
# The columns of ``matrix()``: the fields that tell the presets apart.
MATRIX_FIELDS = ("estimator", "is_level", "clip", "clip_eps", "clip_eps_high", "dual_clip",
                 "loss_agg", "whiten_adv", "adv_clip", "dynamic_sampling", "max_num_gen_batches",
                 "overlong_buffer", "beta")


def max_turns_at(cfg: GRPOConfig, it: int) -> int:
    """The turn cap of sampling round ``it`` (0-based): the schedule's, else ``cfg.max_turns``."""
    return scheduled(cfg.horizon_schedule, it, cfg.max_turns)


def preset(name: str, **overrides) -> GRPOConfig:
    """The named methods as config values (each paper's choices, see the module docstring)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {tuple(PRESETS)}")
    return replace(GRPOConfig(**PRESETS[name]), **overrides)


def matrix() -> dict[str, dict]:
    """The presets as a table, variant -> knobs: the advantage's ``mean_level``, ``std_level`` and
    ``leave_one_out`` (``core.ESTIMATORS``) after its ``estimator``, then the loss's fields
    (``MATRIX_FIELDS``). ``pandas.DataFrame(matrix()).T`` shows one row per variant.

    >>> row = matrix()["gspo"]
    >>> row["mean_level"], row["std_level"], row["is_level"], row["clip_eps"]
    ('group', 'group', 'sequence', 0.0003)
    """
    rows = {}
    for name in PRESETS:
        cfg = preset(name)
        knobs = {f: getattr(cfg, f) for f in MATRIX_FIELDS}
        rows[name] = {"estimator": cfg.estimator, **core.ESTIMATORS[cfg.estimator], **knobs}
    return rows


# --- pure pieces ---------------------------------------------------------------------------------
def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (eq. 13): 0 up to max_len - buffer, then falling linearly
    to -penalty at max_len.

    >>> overlong_penalty(torch.tensor([4, 7, 8]), max_len=8, buffer=2).tolist()
    [0.0, -0.5, -1.0]
    """
    if buffer <= 0:
        return torch.zeros(lengths.shape)
    over = (lengths.float() - (max_len - buffer)).clamp(min=0.0)
    return 0.0 - penalty * (over / buffer).clamp(max=1.0)  # 0.0 - x: no negative zeros


def policy_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor,
                cfg: GRPOConfig, ref_logps: Tensor | None = None,
                max_len: int | None = None) -> tuple[Tensor, dict]:
    """The clipped loss with the chosen ratio, clip and aggregation, plus beta * KL.

    logps, old_logps, mask: (B, T); advantages: (B,) one per sequence or (B, T) per token.
    per-token loss l_t = -min(rho A, clip(rho, 1 - eps, 1 + eps_high) A) + beta * KL_t ('ppo',
    capped at -c A where A < 0 with ``cfg.dual_clip`` = c), or
    -sg(clip(rho, 1 - eps, 1 + eps_high)) A log pi_t + beta * KL_t ('cispo'), with rho = rho_t or
    the sequence's s_i (``cfg.is_level``, ``core.clipped_token_loss``), aggregated by
    ``core.aggregate`` (const_norm divides by B * max_len, default T).
    Returns (loss, {clipfrac, approx_kl[, kl]}). With ``cfg.kl_in_reward`` the KL is in the rewards
    (``advantages``), not here.
    """
    per_token = core.clipped_token_loss(logps, old_logps, advantages, cfg.clip_eps,
                                        cfg.clip_eps_high, mask, cfg.is_level, cfg.clip,
                                        cfg.dual_clip)  # (B, T)
    kl = None
    if cfg.beta != 0.0 and not cfg.kl_in_reward:
        if ref_logps is None:
            raise ValueError("beta != 0 needs ref_logps")
        kl = core.kl_estimate(logps, ref_logps, cfg.kl_estimator)  # (B, T)
        per_token = per_token + cfg.beta * kl
    loss = core.aggregate(per_token, mask, cfg.loss_agg, max_len)
    metrics = core.clip_stats(logps, old_logps, advantages, mask, cfg.clip_eps, cfg.clip_eps_high,
                              cfg.is_level, cfg.clip, cfg.dual_clip)
    if kl is not None:
        with torch.no_grad():
            metrics["kl"] = core.masked_mean(kl, mask).item()
    return loss, metrics


def score(reward_funcs, texts: list[str], problems: list[dict]) -> Tensor:
    """Sum of the reward functions (TRL signature) over aligned completions and problem columns."""
    columns = {k: [p.get(k) for p in problems] for k in problems[0] if k != "prompt"}
    total = torch.zeros(len(texts), device="cpu")
    for f in reward_funcs:
        total += torch.tensor(f(texts, **columns), dtype=torch.float32, device="cpu")
    return total


def turn_advantages(episodes, cfg: GRPOConfig, critic: dict | None = None,
                    entropies=None) -> list[np.ndarray]:
    """One advantage per turn of each episode by ``cfg.estimator``: ``turn_credit.turn_advantages``
    with the config's settings (ddof = ``std_ddof``), the same numbers as ``agent_pg.estimate``
    on the same episodes. critic: dict state key -> V ('turn_gae', 'hiper'); entropies: per
    episode, the policy's entropy at each turn ('empg'); ``lm_credit`` supplies both."""
    if cfg.estimator not in TURN_ESTIMATORS:
        raise ValueError(f"estimator {cfg.estimator!r} has no multi-turn form; choose one of "
                         f"{TURN_ESTIMATORS}")
    return turn_credit.turn_advantages(
        episodes, cfg.estimator, gamma=cfg.gamma, lam=cfg.lam, omega=cfg.omega,
        norm_adv=cfg.norm_adv, ddof=cfg.std_ddof, hgpo_depth=cfg.hgpo_depth,
        segment_len=cfg.segment_len, critic=critic, entropies=entropies,
        invalid_penalty=cfg.invalid_penalty, cross_steps=cfg.cross_steps)


def lm_credit(cfg: GRPOConfig, model=None, critic: dict | None = None):
    """A ``train(credit_fn=...)`` for the multi-turn estimators that need more than the batch:
    ``turn_advantages`` with a tabular Monte-Carlo critic kept across updates ('turn_gae',
    'hiper': V over the environment's state keys, which text environments record per turn,
    fitted by ``credit.fit_critic`` with ``cfg.gamma`` and ``cfg.critic_lr`` after each batch's
    advantages, as ``agent_pg.train`` does) and the current ``model``'s turn entropies ('empg':
    ``empg.lm_turn_entropies``, the mean token entropy over each action, one forward pass).
    Any other estimator is ``turn_advantages`` as is. ``credit_fn.critic`` is the critic dict;
    ``credit_fn.metrics`` the number of keys it holds (``train`` logs it as
    ``credit/critic_keys``)."""
    if cfg.estimator == "empg" and model is None:
        raise ValueError("lm_credit for 'empg' needs the model whose turn entropies it reads")
    state = {} if critic is None else critic

    def credit_fn(episodes):
        ents = empg.lm_turn_entropies(model, episodes) if cfg.estimator == "empg" else None
        adv = turn_advantages(episodes, cfg, critic=state, entropies=ents)
        if cfg.estimator in CRITIC_ESTIMATORS:
            credit.fit_critic(state, episodes, cfg.gamma, cfg.critic_lr)
        credit_fn.metrics = {"critic_keys": len(state)} if state else {}
        return adv
    credit_fn.critic, credit_fn.metrics = state, {}
    return credit_fn


# --- sampling ------------------------------------------------------------------------------------
@dataclass
class Batch:
    """One sampling round, what an update trains on."""

    seqs: Generation
    """prompts (B, P), completions or conversations (B, T), masks and the sampling log-probs"""
    rewards: Tensor
    """(B,) the score of each completion, or the return of each episode"""
    metrics: dict = field(default_factory=dict)
    """``rollout/*`` and ``time/gen_s`` of the round"""
    episodes: list | None = None
    """multi-turn: the ``Episode`` record of each row"""
    advantages: Tensor | None = None
    """(B,) per sequence or (B, T) per token, set by ``advantages``"""
    max_len: int | None = None
    """the constant of 'const_norm' (the completion budget); None: T"""


def sampler_generators(population, cfg, what: str):
    """The two generators of a sampler, seeded by ``cfg.seed``: which prompts (python's random)
    and which tokens (``tokens(model)``: a torch generator made on the model's device at the first
    call, ``rollout.token_generator``)."""
    if len(population) < cfg.num_prompts:
        raise ValueError(f"num_prompts={cfg.num_prompts} is more than the {len(population)} "
                         f"training {what}")
    made = []

    def tokens(model) -> torch.Generator:
        if not made:
            made.append(token_generator(model, cfg.seed))
        return made[0]
    return random.Random(cfg.seed), tokens


def completion_sampler(tokenizer, train_problems: list[dict], reward_funcs: list, cfg):
    """``sample(model, it=0) -> Batch``: draw ``cfg.num_prompts`` problems (seeded by ``cfg.seed``),
    generate ``cfg.group_size`` completions of each at ``cfg.temperature`` within
    ``cfg.max_new_tokens``, score them with the sum of ``reward_funcs``.

    With ``cfg.dynamic_sampling`` and ``cfg.max_num_gen_batches`` > 1 (DAPO's refill, as verl's
    ``RayDAPOTrainer.fit``): more rounds of ``num_prompts`` problems until ``num_prompts`` groups
    with unequal rewards are in hand (or the rounds, or ``cfg.max_groups``, run out); the batch is
    the first ``num_prompts`` of them (``core.first_informative``). Rows log ``samples`` (the
    completions generated so far, the budget's count), ``rollout/gen_batches`` (rounds of this
    update) and ``rollout/informative_frac`` (of its groups, those with unequal rewards); the
    other ``rollout/*`` are over every completion generated."""
    rng, tokens = sampler_generators(train_problems, cfg, "problems")
    # other trainers' configs (ppo_lm's) share this sampler and have no refill fields
    rounds_max = getattr(cfg, "max_num_gen_batches", 1)
    max_groups = getattr(cfg, "max_groups", None)
    G, refill = cfg.group_size, getattr(cfg, "dynamic_sampling", False) and rounds_max > 1
    spent = [0]  # groups generated so far

    def one_round(model) -> tuple[Generation, Tensor]:
        batch = rng.sample(train_problems, cfg.num_prompts)
        problems = [p for p in batch for _ in range(G)]  # (B*G) prompt-major
        gen = generate(model, tokenizer, format_prompts(tokenizer, problems), cfg.max_new_tokens,
                       temperature=cfg.temperature, generator=tokens(model))
        spent[0] += cfg.num_prompts
        return gen, score(reward_funcs, gen.texts, problems).to(gen.logps.device)  # (B*G,)

    def more(rounds) -> bool:
        found = sum(int((~core.all_equal(r.view(-1, G))).sum()) for _, r in rounds)
        room = max_groups is None or max_groups - spent[0] >= cfg.num_prompts
        return found < cfg.num_prompts and len(rounds) < rounds_max and room

    def sample(model, it: int = 0) -> Batch:
        t0 = time.time()
        model.eval()
        rounds = [one_round(model)]
        while refill and more(rounds):
            rounds.append(one_round(model))
        t_gen = time.time() - t0
        gen = concat_generations([g for g, _ in rounds], tokenizer.pad_token_id)  # (R*B*G, T)
        rewards = torch.cat([r for _, r in rounds])  # (R*B*G,)
        informative = ~core.all_equal(rewards.view(-1, G))  # (R*B,)
        metrics = {"samples": spent[0] * G, "rollout/reward": rewards.mean().item(),
                   "rollout/completion_len": gen.completion_mask.sum(-1).float().mean().item(),
                   "rollout/gen_batches": len(rounds),
                   "rollout/informative_frac": informative.float().mean().item(),
                   "time/gen_s": t_gen}
        if refill:
            keep = core.first_informative(rewards.view(-1, G), cfg.num_prompts)  # (R*B,)
            idx = keep.repeat_interleave(G).nonzero().squeeze(-1)
            gen, rewards = gen.select(idx), rewards[idx]
        return Batch(gen, rewards, metrics, max_len=cfg.max_new_tokens)
    return sample


def budget_spent(cfg: GRPOConfig, row: dict) -> bool:
    """Whether the rollout budget ``cfg.max_groups`` leaves less than one more round of
    ``num_prompts`` groups after this row (``samples`` / G groups generated); False without one."""
    if cfg.max_groups is None:
        return False
    return cfg.max_groups - row["samples"] // cfg.group_size < cfg.num_prompts


def episode_sampler(tokenizer, make_env, train_seeds: list[int], cfg,
                    system_prompt: str | None = None):
    """``sample(model, it=0) -> Batch``: draw ``cfg.num_prompts`` task seeds (seeded by
    ``cfg.seed``), play ``cfg.group_size`` episodes of each with ``rollout.lm_rollout`` (at most
    ``max_turns_at(cfg, it)`` turns of ``cfg.max_new_tokens`` tokens; ``it``: updates done). The rows are whole conversations; the loss mask covers
    the agent's tokens. system_prompt: None uses the environment's."""
    rng, tokens = sampler_generators(train_seeds, cfg, "task seeds")
    if getattr(cfg, "max_num_gen_batches", 1) > 1 or getattr(cfg, "max_groups", None) is not None:
        raise ValueError("max_num_gen_batches and max_groups are single-turn options")

    def sample(model, it: int = 0) -> Batch:
        t0 = time.perf_counter()
        seeds = rng.sample(list(train_seeds), cfg.num_prompts)
        max_turns = max_turns_at(cfg, it)
        eps = lm_rollout(model, tokenizer, make_env, seeds, cfg.group_size, max_turns,
                         cfg.max_new_tokens, cfg.temperature, tokens(model), system_prompt,
                         max_context=cfg.max_context)
        t_gen = time.perf_counter() - t0
        device = model_device(model)
        seqs = pad_episodes(eps, tokenizer.pad_token_id, device)
        returns = torch.tensor([ep.ret for ep in eps], dtype=torch.float32, device=device)
        return Batch(seqs, returns, {"rollout/reward": float(np.mean([ep.ret for ep in eps])),
                                     **episode_stats(eps, "rollout/"), "rollout/max_turns": max_turns,
                                     "time/gen_s": t_gen},
                     episodes=eps)
    return sample


# --- advantages and the update -------------------------------------------------------------------
def advantages(batch: Batch, cfg: GRPOConfig, eos_id: int | None = None,
               credit_fn=None, ref_logps: Tensor | None = None) -> Batch:
    """The batch with ``advantages`` set and the rows the update should not see removed.

    Single-turn: DAPO's overlong penalty is added to the rewards (then ``rollout/reward`` is the
    shaped mean), with ``cfg.kl_in_reward`` the KL penalty too (``core.kl_penalised_rewards`` of
    the sampling log-probs against ``ref_logps``, (B, T), the reference's; ``rollout/kl`` is the
    mean per-token estimate), ``core.group_advantages`` of the (num_prompts, group_size) rewards
    (eps ``cfg.adv_eps``), then overlong
    filtering (needs ``eos_id``) and dynamic sampling (on the rewards before shaping) drop rows.
    Multi-turn: ``turn_advantages``, or ``credit_fn(episodes) -> list of (T_i,) arrays`` when given (an ArCHer critic, a SPA-RL
    progress model: any turn-level estimator, which may update its own state on the batch), spread
    over each turn's action tokens (``credit.to_token_advantages``), (B, T).
    ``rollout/kept_frac`` is the fraction of rows kept. Last, with ``cfg.whiten_adv`` or
    ``cfg.adv_clip`` (ROLL's Lite-PPO), the kept rows' advantages are whitened over their tokens
    and clipped (``core.whiten_clip_advantages``), (B, T).
    """
    g, metrics = batch.seqs, dict(batch.metrics)
    if batch.episodes is not None:
        if cfg.overlong_buffer > 0 or cfg.overlong_filter or cfg.kl_in_reward:
            raise ValueError("overlong_buffer, overlong_filter and kl_in_reward are single-turn "
                             "options")
        turn_adv = (credit_fn or (lambda eps: turn_advantages(eps, cfg)))(batch.episodes)
        tok_adv = credit.to_token_advantages(batch.episodes, turn_adv)
        T = g.completion_ids.shape[1]
        adv = torch.stack([F.pad(a, (0, T - len(a))) for a in tok_adv]).to(g.logps.device)  # (B, T)
        rewards = task_rewards = batch.rewards
    else:
        if credit_fn is not None:
            raise ValueError("credit_fn is a multi-turn option (the batch has no episodes)")
        if not cfg.norm_adv:
            raise ValueError("norm_adv=False is a multi-turn option; a single-turn estimator names "
                             "its std ('dr_grpo' is 'grpo' without it)")
        rewards = batch.rewards
        task_rewards = rewards  # what dynamic sampling filters on (verl: metric 'acc')
        if cfg.overlong_buffer > 0:
            lengths = g.completion_mask.sum(-1)
            rewards = rewards + overlong_penalty(lengths, cfg.max_new_tokens, cfg.overlong_buffer,
                                                 cfg.overlong_penalty).to(rewards.device)
            metrics["rollout/reward"] = rewards.mean().item()
        if cfg.kl_in_reward and cfg.beta != 0.0:  # verl's apply_kl_penalty, before the advantage
            if ref_logps is None:
                raise ValueError("kl_in_reward with beta != 0 needs ref_logps")
            rewards = core.kl_penalised_rewards(rewards, g.logps, ref_logps, g.loss_mask,
                                                cfg.beta, cfg.kl_estimator)
            metrics["rollout/kl"] = core.masked_mean(
                core.kl_estimate(g.logps, ref_logps, cfg.kl_estimator), g.loss_mask).item()
        adv = core.group_advantages(rewards.view(-1, cfg.group_size), cfg.estimator,
                                    ddof=cfg.std_ddof, eps=cfg.adv_eps).reshape(-1) \
            if rewards.numel() else \
            rewards.clone()  # (B*G,); a refill that found no informative group is empty
    keep = torch.ones_like(rewards, dtype=torch.bool)
    if cfg.overlong_filter and batch.episodes is None:
        if eos_id is None:
            raise ValueError("overlong_filter needs eos_id")
        keep &= (g.completion_ids == eos_id).any(-1)
    if cfg.dynamic_sampling:  # groups whose task rewards are all equal carry no gradient
        keep &= ~core.all_equal(task_rewards.view(-1, cfg.group_size)).repeat_interleave(
            cfg.group_size)
    metrics["rollout/kept_frac"] = keep.float().mean().item()
    idx = keep.nonzero().squeeze(-1)
    episodes = batch.episodes if keep.all() or batch.episodes is None else \
        [batch.episodes[i] for i in idx.tolist()]
    seqs, adv = g if keep.all() else g.select(idx), adv[idx]
    if cfg.whiten_adv or cfg.adv_clip is not None:  # ROLL's compute_advantage, on the kept rows
        adv = core.whiten_clip_advantages(adv, seqs.loss_mask, cfg.whiten_adv, cfg.adv_clip)
    return replace(batch, seqs=seqs, rewards=rewards[idx], advantages=adv, metrics=metrics,
                   episodes=episodes)


def update(model, optimizer, batch: Batch, cfg: GRPOConfig, ref_model=None, regulariser=None,
           it: int = 0) -> dict:
    """``cfg.num_epochs`` steps of ``policy_loss`` on the batch (``advantages`` set), minus
    ``cfg.entropy_coef`` x the masked mean token entropy, plus ``regulariser(entropies (B, T) with
    gradient, loss_mask (B, T), it) -> (loss, metrics)`` when given (EPO). Returns the last step's
    ``losses/*`` (``grad_norm``: the gradient norm before clipping); nothing when every row was
    filtered out."""
    g = batch.seqs
    if g.completion_ids.shape[0] == 0:
        return {}
    ref_logps = None
    if cfg.beta != 0.0 and not cfg.kl_in_reward:
        ref_logps = reference_logps(ref_model, g, cfg)
    model.train()
    for _ in range(cfg.num_epochs):
        logps, ents = generation_logps(model, g, cfg.temperature)  # (B, T) each
        loss, m = policy_loss(logps, g.logps, batch.advantages, g.loss_mask, cfg, ref_logps,
                              batch.max_len)
        if cfg.entropy_coef != 0.0:
            loss = loss - cfg.entropy_coef * core.masked_mean(ents, g.loss_mask)
        if regulariser is not None:
            reg, reg_metrics = regulariser(ents, g.loss_mask, it)
            loss = loss + reg
            m.update({f"reg_{k}": v for k, v in reg_metrics.items()})
        m["grad_norm"] = optimizer_step(optimizer, loss, cfg.max_grad_norm)
    model.eval()
    return {"losses/loss": loss.item(),
            "losses/entropy": core.masked_mean(ents.detach(), g.loss_mask).item(),
            **{f"losses/{k}": v for k, v in m.items()}}


def reference_logps(ref_model, g: Generation, cfg: GRPOConfig) -> Tensor:
    """(B, T) log-probs of the sampled tokens under the reference, at the sampling temperature (as
    verl's ``compute_ref_log_prob``), without gradients."""
    if ref_model is None:
        raise ValueError("beta != 0 needs ref_model")
    with torch.no_grad():
        return generation_logps(ref_model, g, cfg.temperature)[0]


def make_reference(model):
    """A frozen copy of ``model`` (eval mode, no gradients): the reference of the KL penalty, as
    TRL's ``create_reference_model`` makes it when the trainer is given none (verl's ref worker
    loads the same start)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


# --- training ------------------------------------------------------------------------------------
def _credit_metrics(credit_fn) -> dict:
    """The numbers a stateful ``credit_fn`` reports about its last call (e.g. a critic's losses)."""
    m = getattr(credit_fn, "metrics", None)
    last = m[-1] if isinstance(m, list) and m else m if isinstance(m, dict) else {}
    return {f"credit/{k}": v for k, v in last.items() if isinstance(v, (int, float))}


def train(model, sample, cfg: GRPOConfig, evaluate=None, ref_model=None, logger=None,
          on_step=None, eos_id: int | None = None, credit_fn=None, regulariser=None,
          initial_eval: dict | None = None, stop=None) -> list[dict]:
    """GRPO-family training, single- or multi-turn by the sampling function: ``sample`` from
    ``completion_sampler`` or ``episode_sampler`` (built with this ``cfg``); AdamW at ``cfg.lr``;
    each update runs ``advantages`` then ``update``. ``ref_model``: the KL's reference when
    ``cfg.beta`` != 0 (None: a frozen copy of ``model`` as it is now, ``make_reference``; with
    ``cfg.kl_in_reward`` its log-probs go into the rewards before ``advantages``), ``eos_id`` (the tokenizer's) when ``cfg.overlong_filter``; ``credit_fn`` replaces the multi-turn
    estimator (``advantages``; 'turn_gae', 'hiper' and 'empg' get ``lm_credit(cfg, model)`` when
    none is given), and its ``metrics`` (a dict, or a list whose last dict is the latest
    call's), if it has any, are logged under ``credit/``; ``regulariser`` adds a term of the token
    entropies to the loss (``update``); ``initial_eval``: the start's evaluation, when known;
    ``stop(row) -> bool`` ends training after the update whose row it is (evaluated then), before
    ``cfg.num_iters`` (a budget of tool calls, as ``arpo.train``'s); so does the rollout budget
    ``cfg.max_groups`` (``budget_spent``). Returns the logged rows
    (``loop.run``)."""
    if ref_model is model:
        raise ValueError("model and ref_model are the same object; pass a copy (make_reference)")
    if cfg.beta != 0.0 and ref_model is None:
        ref_model = make_reference(model)  # the start, frozen
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    if credit_fn is None and cfg.estimator in (*CRITIC_ESTIMATORS, "empg"):
        credit_fn = lm_credit(cfg, model)  # its critic, or the model's turn entropies

    def update_fn(batch: Batch, it: int) -> dict:
        ref_lp = reference_logps(ref_model, batch.seqs, cfg) \
            if cfg.kl_in_reward and cfg.beta != 0.0 and batch.episodes is None else None
        batch = advantages(batch, cfg, eos_id, credit_fn, ref_lp)
        return {**batch.metrics, **_credit_metrics(credit_fn),
                **update(model, opt, batch, cfg, ref_model, regulariser, it)}

    def stop_fn(row: dict) -> bool:  # the caller's stop, or the rollout budget ``cfg.max_groups``
        return (stop is not None and bool(stop(row))) or budget_spent(cfg, row)

    return loop.run(model, sample, update_fn, cfg.num_iters, evaluate=evaluate,
                    eval_every=cfg.eval_every, initial_eval=initial_eval, stop=stop_fn,
                    logger=logger, on_step=on_step, desc="grpo", report_to=cfg.report_to,
                    logging_dir=cfg.logging_dir)


# --- evaluation ------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, tokenizer, problems: list[dict], reward_fn, max_new_tokens: int,
             batch_size: int = 256, samples: int = 0, temperature: float = 1.0,
             seed: int = 0) -> dict:
    """Accuracy on a panel: {'acc': mean of ``reward_fn`` over its completions}. samples=0: greedy,
    one completion a problem; else ``samples`` completions of each at ``temperature``, drawn with a
    generator seeded by ``seed`` (the same draws at every call)."""
    model.eval()
    rows = [p for p in problems for _ in range(max(samples, 1))]
    draws = token_generator(model, seed) if samples else None
    total = 0.0
    for i in progress(range(0, len(rows), batch_size), desc="eval panel", unit="batch"):
        chunk = rows[i:i + batch_size]
        gen = generate(model, tokenizer, format_prompts(tokenizer, chunk), max_new_tokens,
                       temperature=temperature, greedy=samples == 0, generator=draws)
        total += score([reward_fn], gen.texts, chunk).sum().item()
    return {"acc": total / len(rows)}


@torch.no_grad()
def evaluate_agent(model, tokenizer, make_env, seeds: list[int], max_turns: int,
                   max_new_tokens: int, samples: int = 1, temperature: float = 1.0,
                   seed: int = 0, system_prompt: str | None = None,
                   max_context: int | None = None) -> dict:
    """Success rate, mean return, turns and invalid-action rate on a fixed panel of task seeds.
    samples=0: greedy, one episode per seed; else ``samples`` episodes per seed, sampled with a
    generator seeded by ``seed`` (the same draws at every call)."""
    eps = lm_rollout(model, tokenizer, make_env, seeds, max(samples, 1), max_turns, max_new_tokens,
                     temperature, token_generator(model, seed), system_prompt,
                     greedy=samples == 0, max_context=max_context, desc="eval panel")
    return episode_stats(eps)
