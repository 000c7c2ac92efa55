"""Multi-turn policy gradient for non-LM policies, with a pluggable turn-level advantage.

One loop for every credit-assignment notebook at the tabular level: play a batch of episode
groups with ``play_episodes`` (group i = ``group_size`` episodes of one task seed), turn the
record into one advantage per turn (``cfg.estimator`` or your own ``credit_fn``), and take
PPO-clipped steps on  L = -mean_t min(rho_t A_t, clip(rho_t) A_t)  over all turns of the batch
(turn-level aggregation; with ``num_epochs=1`` this is plain REINFORCE with A_t, since
rho = 1 at the first step). The policy is any table of ``models.policies`` with ``act``, ``probs``
and ``episode_logps`` (``KeyTablePolicy``).

Logged rows (``loop.run``): ``iter`` (updates done), ``episodes`` (played so far), ``rollout/*``
(success, return, turns, invalid, abs_adv, entropy: the mean policy entropy over the batch's turns,
max_turns: the turn cap used), ``losses/*`` (loss, clipfrac, approx_kl, grad_norm: the gradient's
L2 norm before the step) and ``eval/*`` (``evaluate``'s dict).

Hooks for the long-horizon papers: ``entropy_coef`` adds a constant entropy bonus
-coef * mean_t H(pi(.|k_t)) to the loss; ``train(..., regulariser=fn)`` adds any other term of the
turn entropies, fn(entropies (N,) with gradient, iteration) -> (loss, metrics) (EPO's smoothing
regulariser); ``horizon_schedule`` changes the turn cap during training (AgentGym-RL's
ScalingInter-RL).

Estimators (strings: ``turn_credit.TURN_ESTIMATORS``, dispatched by
``turn_credit.turn_advantages``, which the LM loop ``grpo`` shares): 'reinforce' (the episode's
return, no baseline, on every turn), 'grpo' (return normalised within its group, broadcast),
'gigpo' (episode + anchor-state step groups), 'turn_gae' (GAE over turns with a tabular critic
V(key) fitted to returns-to-go each iteration, ``credit.fit_critic``), all in ``credit.py``;
'salt' (trajectory-graph step advantages, ``salt.py``), 'hgpo' (hierarchy of history-consistent
groups, ``hgpo.py``), 'empg' (GRPO's advantage modulated by the policy's turn entropies,
``empg.py``), 'hiper' (HiPER's segment-cut GAE with turn_gae's critic, segments by stage or of
``segment_len`` turns, ``hiper.py``). The estimators that need a fitted model of their own
(ArCHer's critic, SPA-RL's progress model, OPRL's implicit PRM) or task knowledge (IGPO's p(gold))
plug in through ``credit_fn``, the name the LM loop (``grpo.train``) uses too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from agentrl_lib.algorithms import empg, loop, turn_credit
from agentrl_lib.algorithms.credit import fit_critic
from agentrl_lib.algorithms.turn_credit import CRITIC_ESTIMATORS, TURN_ESTIMATORS
from agentrl_lib.core import ppo_clip_loss
from agentrl_lib.rollout import episode_stats, play_episodes
from agentrl_lib.utils import check_schedule, optimizer_step, scheduled


@dataclass
class AgentPGConfig:
    num_iters: int = 50
    """rollout batches"""
    num_prompts: int = 8
    """groups per batch: task seeds drawn from ``train_seeds`` (a task's first observation is
    the prompt)"""
    group_size: int = 8
    """episodes per group (same seed: same task and start)"""
    lr: float = 0.1
    """Adam learning rate of the policy"""
    estimator: str = "grpo"
    """one of ``turn_credit.TURN_ESTIMATORS`` (ignored when credit_fn is given)"""
    gamma: float = 0.95
    """discount of step returns (GiGPO step groups, turn GAE); GiGPO's paper value"""
    lam: float = 0.95
    """GAE lambda (turn_gae)"""
    omega: float = 1.0
    """GiGPO's weight of the step-level advantage (paper: 1)"""
    norm_adv: bool = True
    """divide group-centred returns by the group std (GRPO/GiGPO); False = mean-only"""
    clip_eps: float = 0.2
    """PPO clip range (matters only with num_epochs > 1)"""
    num_epochs: int = 1
    """optimiser steps per batch"""
    critic_lr: float = 0.5
    """turn_gae, hiper: step size of the tabular critic's move toward returns-to-go"""
    hgpo_depth: int = 2
    """hgpo: the deepest history level K of the group hierarchy"""
    segment_len: int | None = None
    """hiper: executor segments of this many turns; None: one segment per stage of the state key
    (``SubtaskGridEnv``'s (cell, stage))"""
    max_turns: int | None = None
    """cut episodes here (None: the environment's own cap)"""
    horizon_schedule: tuple | None = None
    """((from_iter, max_turns), ...): from iteration ``from_iter`` (0-based, ascending, the first
    0) episodes are cut at that many turns; replaces ``max_turns`` (AgentGym-RL's ScalingInter-RL)"""
    entropy_coef: float = 0.0
    """weight of a constant entropy bonus: loss -= entropy_coef * mean turn entropy (needs a
    policy with ``episode_entropies``)"""
    eval_every: int = 10
    """updates between evaluations (``loop.run``)"""
    seed: int = 0
    """seed of the task draws (the policy has its own rng)"""
    report_to: str | None = None
    """'tensorboard' copies the logged rows to TensorBoard (``tblog``), 'none' does not; None:
    ``$AGENTRL_REPORT_TO`` (``agentrl run --report-to``), else 'none'. As TRL's ``report_to``"""
    logging_dir: str | None = None
    """TensorBoard's folder; None: ``$AGENTRL_RUN_DIR/tensorboard``, else ``runs/tensorboard``"""

    def __post_init__(self):
        if self.estimator not in TURN_ESTIMATORS:
            raise ValueError(f"estimator must be one of {TURN_ESTIMATORS}, "
                             f"got {self.estimator!r}")
        if self.horizon_schedule is not None:
            check_schedule(self.horizon_schedule)

    def max_turns_at(self, it: int) -> int | None:
        """The turn cap of iteration ``it`` (0-based): the schedule's, else ``max_turns``."""
        return scheduled(self.horizon_schedule, it, self.max_turns)


def estimate(episodes, cfg: AgentPGConfig, critic: dict | None = None,
             policy=None) -> list[np.ndarray]:
    """Per-turn advantages of ``cfg.estimator`` (``turn_credit.turn_advantages`` with the
    config's settings, ddof 1). ``critic`` maps state keys to V (turn_gae, hiper; None: an empty
    one, V = 0); ``policy`` is the behaviour policy whose turn entropies EMPG reads."""
    entropies = None
    if cfg.estimator == "empg":
        if policy is None or not hasattr(policy, "episode_entropies"):
            raise ValueError("estimator 'empg' needs the behaviour policy's turn entropies: pass "
                             "a policy with episode_entropies (e.g. KeyTablePolicy)")
        with torch.no_grad():
            entropies = empg.split_turns(policy.episode_entropies(episodes), episodes)
    return turn_credit.turn_advantages(
        episodes, cfg.estimator, gamma=cfg.gamma, lam=cfg.lam, omega=cfg.omega,
        norm_adv=cfg.norm_adv, hgpo_depth=cfg.hgpo_depth, segment_len=cfg.segment_len,
        critic={} if critic is None else critic, entropies=entropies)


def update(policy, optimizer, episodes, advantages, cfg: AgentPGConfig, regulariser=None,
           it: int = 0) -> dict:
    """PPO-clipped steps on one batch, turn-level mean, plus ``cfg.entropy_coef``'s bonus and
    ``regulariser``'s term. Returns the last step's ``losses/*`` (with ``grad_norm``, the norm of
    the whole loss's gradient before the step)."""
    adv = torch.as_tensor(np.concatenate(advantages), dtype=torch.float64)  # (N,)
    needs_entropy = cfg.entropy_coef != 0.0 or regulariser is not None
    if needs_entropy and not hasattr(policy, "episode_entropies"):
        raise ValueError("entropy_coef and regulariser need a policy with episode_entropies "
                         f"(e.g. KeyTablePolicy); {type(policy).__name__} has none")
    with torch.no_grad():
        old = policy.episode_logps(episodes)  # (N,)
    metrics = {}
    for _ in range(cfg.num_epochs):
        logps = policy.episode_logps(episodes)  # (N,)
        loss, metrics = ppo_clip_loss(logps, old, adv, clip_eps=cfg.clip_eps)
        if needs_entropy:
            ent = policy.episode_entropies(episodes)  # (N,)
            metrics["entropy"] = ent.mean().item()
            if cfg.entropy_coef != 0.0:
                loss = loss - cfg.entropy_coef * ent.mean()
            if regulariser is not None:
                reg, reg_metrics = regulariser(ent, it)
                loss = loss + reg
                metrics.update({f"reg_{k}": v for k, v in reg_metrics.items()})
        metrics["grad_norm"] = optimizer_step(optimizer, loss)
        metrics["loss"] = loss.item()
    return {f"losses/{k}": v for k, v in metrics.items()}


@dataclass
class EpisodeBatch:
    """One round of a multi-turn trainer on a table or MLP policy: what ``update`` trains on."""

    episodes: list
    """the ``Episode`` records, group-major"""
    metrics: dict = field(default_factory=dict)
    """the round's ``rollout/*`` statistics and counters"""
    extra: dict = field(default_factory=dict)
    """what a sampler hands its own update (a tree's nodes, a judge's rewards)"""


def draw_seeds(train_seeds, rng: np.random.Generator, it: int, n: int):
    """Iteration ``it``'s task seeds: ``n`` drawn uniformly with replacement from ``train_seeds``,
    or ``train_seeds(it, rng, n)`` when it is a function (a curriculum)."""
    if callable(train_seeds):
        return train_seeds(it, rng, n)
    return rng.choice(np.asarray(train_seeds), size=n)


def episode_sampler(make_env, cfg: AgentPGConfig, train_seeds):
    """``sample(policy, it) -> EpisodeBatch``: ``cfg.num_prompts`` task seeds (``draw_seeds``,
    seeded by ``cfg.seed``) x ``cfg.group_size`` episodes played by ``policy.act``, cut at
    ``cfg.max_turns_at(it)``. Metrics: ``episodes`` (played so far), ``rollout/*``."""
    rng = np.random.default_rng(cfg.seed)

    def sample(policy, it: int) -> EpisodeBatch:
        seeds = draw_seeds(train_seeds, rng, it, cfg.num_prompts)
        max_turns = cfg.max_turns_at(it)
        episodes = play_episodes(make_env, policy.act, list(seeds), cfg.group_size, max_turns)
        metrics = {"episodes": (it + 1) * len(episodes), **episode_stats(episodes, "rollout/")}
        if max_turns is not None:
            metrics["rollout/max_turns"] = max_turns
        return EpisodeBatch(episodes, metrics)
    return sample


def train(make_env, policy, cfg: AgentPGConfig, train_seeds, credit_fn=None, evaluate=None,
          logger=None, regulariser=None, initial_eval: dict | None = None,
          on_step=None) -> list[dict]:
    """Train ``policy`` for ``cfg.num_iters`` batches: ``episode_sampler`` and ``update`` on
    ``loop.run``. Rows: ``iter`` (updates done), ``episodes``, the batch's ``rollout/*``,
    ``rollout/abs_adv``, ``rollout/entropy`` (after the update, when the policy has
    ``episode_entropies``), ``losses/*``, and ``evaluate(policy)``'s dict under ``eval/`` at the
    start, every ``cfg.eval_every`` updates and after the last.

    train_seeds: the task seeds, drawn uniformly with replacement; or a function
    ``(it, rng, n) -> (n,) seeds`` that draws iteration ``it``'s seeds (a curriculum:
    ``curriculum.curriculum_seed_fn``).
    credit_fn(episodes) -> list of (T_i,) arrays replaces ``cfg.estimator`` (plug in ArCHer's
    critic, SPA-RL's progress, or anything else). logger: optional MetricsLogger. regulariser:
    fn(turn entropies (N,), iteration) -> (loss term, metrics), added to the loss (``update``).
    initial_eval: the start's evaluation when it is already known (``loop.run``).
    """
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    critic: dict = {}

    def update_fn(batch: EpisodeBatch, it: int) -> dict:
        episodes = batch.episodes
        if credit_fn is not None:
            adv = credit_fn(episodes)
        else:
            adv = estimate(episodes, cfg, critic, policy)
            if cfg.estimator in CRITIC_ESTIMATORS:
                fit_critic(critic, episodes, cfg.gamma, cfg.critic_lr)
        row = update(policy, optimizer, episodes, adv, cfg, regulariser, it)
        row["rollout/abs_adv"] = float(np.mean(np.abs(np.concatenate(adv))))
        if hasattr(policy, "episode_entropies"):
            with torch.no_grad():
                row["rollout/entropy"] = float(policy.episode_entropies(episodes).mean())
        return row

    return loop.run(policy, episode_sampler(make_env, cfg, train_seeds), update_fn, cfg.num_iters,
                    evaluate=evaluate, eval_every=cfg.eval_every, initial_eval=initial_eval,
                    start={"episodes": 0}, logger=logger, on_step=on_step, desc="agent_pg",
                    report_to=cfg.report_to, logging_dir=cfg.logging_dir)


def evaluate(make_env, policy, seeds, greedy: bool = True, max_turns: int | None = None) -> dict:
    """{'success', 'return'} on fixed task seeds (one episode each), greedy by default."""
    if greedy:
        def act(envs, observations):
            keys = [e.state_key() for e in envs] if policy.key == "state" else observations
            with torch.no_grad():
                return policy.probs(keys).argmax(-1).tolist()
    else:
        act = policy.act
    episodes = play_episodes(make_env, act, list(seeds), 1, max_turns)
    return {"success": float(np.mean([ep.success for ep in episodes])),
            "return": float(np.mean([ep.ret for ep in episodes]))}
