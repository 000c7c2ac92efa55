"""Multi-turn policy gradient for non-LM policies, with a pluggable turn-level advantage.

One loop for every credit-assignment notebook at the tabular level: play a batch of episode
groups with ``play_episodes`` (group i = ``group_size`` episodes of one task seed), turn the
record into one advantage per turn (``cfg.estimator`` or your own ``advantage_fn``), and take
PPO-clipped steps on  L = -mean_t min(rho_t A_t, clip(rho_t) A_t)  over all turns of the batch
(turn-level aggregation; with ``num_epochs=1`` this is plain REINFORCE with A_t, since
rho = 1 at the first step). The policy is any table of ``models.policies`` with ``act``, ``probs``
and ``episode_logps`` (``KeyTablePolicy``).

Logged rows: ``iter``, ``episodes`` (played so far), ``rollout/*`` (success, return, turns,
invalid, abs_adv, entropy: the mean policy entropy over the batch's turns, max_turns: the turn cap
used), ``losses/*`` (loss, clipfrac, approx_kl, grad_norm: the gradient's L2 norm before the step)
and ``eval/*`` (``eval_fn``'s dict).

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
plug in through ``advantage_fn``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentrl_lib.algorithms import empg, turn_credit
from agentrl_lib.algorithms.credit import fit_critic
from agentrl_lib.algorithms.turn_credit import CRITIC_ESTIMATORS, TURN_ESTIMATORS
from agentrl_lib.core import ppo_clip_loss
from agentrl_lib.rollout import episode_stats, play_episodes
from agentrl_lib.utils import check_schedule, progress, scheduled


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
    """one of ``turn_credit.TURN_ESTIMATORS`` (ignored when advantage_fn is given)"""
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
    """iterations between eval_fn calls"""
    seed: int = 0
    """seed of the task draws (the policy has its own rng)"""

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


def grad_norm(parameters) -> float:
    """The L2 norm of the gradients of ``parameters`` together (0 where none)."""
    sq = [p.grad.detach().pow(2).sum() for p in parameters if p.grad is not None]
    return float(torch.stack(sq).sum().sqrt()) if sq else 0.0


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
    params = [p for g in optimizer.param_groups for p in g["params"]]
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
        optimizer.zero_grad()
        loss.backward()
        metrics["grad_norm"] = grad_norm(params)
        optimizer.step()
        metrics["loss"] = loss.item()
    return {f"losses/{k}": v for k, v in metrics.items()}


def train(make_env, policy, cfg: AgentPGConfig, train_seeds, advantage_fn=None,
          eval_fn=None, log=None, regulariser=None) -> list[dict]:
    """Train ``policy`` for ``cfg.num_iters`` batches. Returns one row per iteration: episodes so
    far, batch success rate and return, mean |A|, the loss metrics, and ``eval_fn(policy)``'s dict
    (under ``eval/``) every eval_every iterations, the first and the last.

    train_seeds: the task seeds, drawn uniformly with replacement; or a function
    ``(it, rng, n) -> (n,) seeds`` that draws iteration ``it``'s seeds (a curriculum:
    ``curriculum.curriculum_seed_fn``).
    advantage_fn(episodes) -> list of (T_i,) arrays replaces ``cfg.estimator`` (plug in ArCHer's
    critic, SPA-RL's progress, or anything else). log: optional MetricsLogger. regulariser:
    fn(turn entropies (N,), iteration) -> (loss term, metrics), added to the loss (``update``).
    """
    rng = np.random.default_rng(cfg.seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    critic: dict = {}
    history, num_episodes = [], 0
    for it in progress(range(cfg.num_iters), desc="agent_pg"):
        seeds = (train_seeds(it, rng, cfg.num_prompts) if callable(train_seeds)
                 else rng.choice(np.asarray(train_seeds), size=cfg.num_prompts))
        max_turns = cfg.max_turns_at(it)
        episodes = play_episodes(make_env, policy.act, list(seeds), cfg.group_size, max_turns)
        num_episodes += len(episodes)
        if advantage_fn is not None:
            adv = advantage_fn(episodes)
        else:
            adv = estimate(episodes, cfg, critic, policy)
            if cfg.estimator in CRITIC_ESTIMATORS:
                fit_critic(critic, episodes, cfg.gamma, cfg.critic_lr)
        metrics = update(policy, optimizer, episodes, adv, cfg, regulariser, it)
        row = {"iter": it + 1, "episodes": num_episodes, **episode_stats(episodes, "rollout/"),
               "rollout/abs_adv": float(np.mean(np.abs(np.concatenate(adv)))), **metrics}
        if max_turns is not None:
            row["rollout/max_turns"] = max_turns
        if hasattr(policy, "episode_entropies"):
            with torch.no_grad():
                row["rollout/entropy"] = float(policy.episode_entropies(episodes).mean())
        close_row(row, it, cfg, eval_fn, policy, history, log)
    return history


def close_row(row: dict, it: int, cfg, eval_fn, policy, history: list, log=None,
              last: bool = False) -> None:
    """The end of a training iteration in every multi-turn trainer: ``eval_fn(policy)``'s dict
    under ``eval/`` every ``cfg.eval_every`` iterations, at the first and at the last (or when
    ``last``), then the row appended to ``history`` and logged."""
    if eval_fn is not None and ((it + 1) % cfg.eval_every == 0 or it == 0 or last
                                or it + 1 == cfg.num_iters):
        row.update({f"eval/{k}": v for k, v in eval_fn(policy).items()})
    history.append(row)
    if log is not None:
        log.log(**row)


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
