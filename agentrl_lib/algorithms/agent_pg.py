"""Multi-turn policy gradient for non-LM policies, with a pluggable turn-level advantage.

One loop for every credit-assignment notebook at the tabular level: play a batch of episode
groups with ``play_episodes`` (group i = ``group_size`` episodes of one task seed), turn the
record into one advantage per turn (``cfg.estimator`` or your own ``advantage_fn``), and take
PPO-clipped steps on  L = -mean_t min(rho_t A_t, clip(rho_t) A_t)  over all turns of the batch
(turn-level aggregation; with ``num_epochs=1`` this is plain REINFORCE with A_t, since
rho = 1 at the first step). The policy is any table of ``models.policies`` with ``act``, ``probs``
and ``episode_logps`` (``KeyTablePolicy``).

Logged rows: ``iter``, ``episodes`` (played so far), ``rollout/*`` (success, return, turns,
invalid, abs_adv), ``losses/*`` (loss, clipfrac, approx_kl) and ``eval/*`` (``eval_fn``'s dict).

Estimators (strings, see ``credit.py``): 'reinforce' (the episode's return, no baseline, on
every turn), 'grpo' (return normalised within its group, broadcast), 'gigpo' (episode +
anchor-state step groups), 'turn_gae' (GAE over turns with a tabular critic V(key) fitted to
returns-to-go each iteration).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentrl_lib.algorithms import credit
from agentrl_lib.core import ppo_clip_loss
from agentrl_lib.rollout import episode_stats, play_episodes
from agentrl_lib.utils import optimizer_step

ESTIMATORS = ("reinforce", "grpo", "gigpo", "turn_gae")


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
    """'reinforce' | 'grpo' | 'gigpo' | 'turn_gae' (ignored when advantage_fn is given)"""
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
    """turn_gae: step size of the tabular critic's move toward returns-to-go"""
    max_turns: int | None = None
    """cut episodes here (None: the environment's own cap)"""
    eval_every: int = 10
    """iterations between eval_fn calls"""
    seed: int = 0
    """seed of the task draws (the policy has its own rng)"""

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")


def estimate(episodes, cfg: AgentPGConfig, critic: dict | None = None) -> list[np.ndarray]:
    """Per-turn advantages of ``cfg.estimator`` (``critic`` maps state keys to V for turn_gae)."""
    if cfg.estimator == "reinforce":
        return [np.full(len(ep), ep.ret) for ep in episodes]
    if cfg.estimator == "grpo":
        return credit.grpo_broadcast(episodes, norm_adv=cfg.norm_adv)
    if cfg.estimator == "gigpo":
        return credit.gigpo_advantages(episodes, gamma=cfg.gamma, omega=cfg.omega,
                                       norm_adv=cfg.norm_adv)
    critic = {} if critic is None else critic
    values = [np.array([critic.get(k, 0.0) for k in ep.state_keys]) for ep in episodes]
    last = [critic.get(ep.next_state_key, 0.0) for ep in episodes]
    return credit.turn_gae(episodes, values, cfg.gamma, cfg.lam, last_values=last)


def fit_critic(critic: dict, episodes, gamma: float, step: float) -> dict:
    """Tabular Monte-Carlo critic: V(k) += step * (G_t - V(k)) for every visited (k, G_t)."""
    for ep, rtg in zip(episodes, credit.episode_returns_to_go(episodes, gamma)):
        for k, g in zip(ep.state_keys, rtg):
            v = critic.get(k, 0.0)
            critic[k] = v + step * (g - v)
    return critic


def update(policy, optimizer, episodes, advantages, cfg: AgentPGConfig) -> dict:
    """PPO-clipped steps on one batch, turn-level mean. Returns the last step's ``losses/*``."""
    adv = torch.as_tensor(np.concatenate(advantages), dtype=torch.float64)  # (N,)
    with torch.no_grad():
        old = policy.episode_logps(episodes)  # (N,)
    metrics = {}
    for _ in range(cfg.num_epochs):
        logps = policy.episode_logps(episodes)  # (N,)
        loss, metrics = ppo_clip_loss(logps, old, adv, clip_eps=cfg.clip_eps)
        optimizer_step(optimizer, loss)
        metrics["loss"] = loss.item()
    return {f"losses/{k}": v for k, v in metrics.items()}


def train(make_env, policy, cfg: AgentPGConfig, train_seeds, advantage_fn=None,
          eval_fn=None, log=None) -> list[dict]:
    """Train ``policy`` for ``cfg.num_iters`` batches. Returns one row per iteration: episodes so
    far, batch success rate and return, mean |A|, the loss metrics, and ``eval_fn(policy)``'s dict
    (under ``eval/``) every eval_every iterations, the first and the last.

    advantage_fn(episodes) -> list of (T_i,) arrays replaces ``cfg.estimator`` (plug in ArCHer's
    critic, SPA-RL's progress, or anything else). log: optional MetricsLogger.
    """
    rng = np.random.default_rng(cfg.seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    critic: dict = {}
    history, num_episodes = [], 0
    for it in range(cfg.num_iters):
        seeds = rng.choice(np.asarray(train_seeds), size=cfg.num_prompts)
        episodes = play_episodes(make_env, policy.act, list(seeds), cfg.group_size, cfg.max_turns)
        num_episodes += len(episodes)
        if advantage_fn is not None:
            adv = advantage_fn(episodes)
        else:
            adv = estimate(episodes, cfg, critic)
            if cfg.estimator == "turn_gae":
                fit_critic(critic, episodes, cfg.gamma, cfg.critic_lr)
        metrics = update(policy, optimizer, episodes, adv, cfg)
        row = {"iter": it + 1, "episodes": num_episodes, **episode_stats(episodes, "rollout/"),
               "rollout/abs_adv": float(np.mean(np.abs(np.concatenate(adv)))), **metrics}
        if eval_fn is not None and ((it + 1) % cfg.eval_every == 0 or it == 0
                                    or it + 1 == cfg.num_iters):
            row.update({f"eval/{k}": v for k, v in eval_fn(policy).items()})
        history.append(row)
        if log is not None:
            log.log(**row)
    return history


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
