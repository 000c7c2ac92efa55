"""Multi-turn policy gradient for non-LM policies, with a pluggable turn-level advantage.

One loop for every credit-assignment notebook at the tabular level: play a batch of episode
groups with ``play_episodes`` (group i = ``group_size`` episodes of one task seed), turn the
record into one advantage per turn (``cfg.estimator`` or your own ``advantage_fn``), and take
PPO-clipped steps on  L = -mean_t min(rho_t A_t, clip(rho_t) A_t)  over all turns of the batch
(turn-level aggregation; with ``num_inner_epochs=1`` this is plain REINFORCE with A_t, since
rho = 1 at the first step).

Estimators (strings, see ``credit.py``): 'reinforce' (the episode's return, no baseline, on
every turn), 'grpo' (return normalised within its group, broadcast), 'gigpo' (episode +
anchor-state step groups), 'turn_gae' (GAE over turns with a tabular critic V(key) fitted to
returns-to-go each iteration).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from agentrl_lib.algorithms import credit
from agentrl_lib.core import ppo_clip_loss
from agentrl_lib.rollout import play_episodes

ESTIMATORS = ("reinforce", "grpo", "gigpo", "turn_gae")


class KeyTablePolicy(nn.Module):
    """pi(a | k) = softmax(theta[k]) over ``env.actions``, one row of logits per key k, zeros
    (uniform) until trained. ``key='state'`` uses the environment's true state key (a Markov
    policy); ``key='observation'`` uses the observation text (what an agent that sees only the
    current turn can condition on). Rows are assigned at first sight, up to ``capacity``."""

    def __init__(self, num_actions: int, key: str = "state", capacity: int = 4096,
                 seed: int = 0):
        super().__init__()
        if key not in ("state", "observation"):
            raise ValueError(f"key must be 'state' or 'observation', got {key!r}")
        self.key, self.capacity = key, capacity
        self.logits = nn.Parameter(torch.zeros(capacity, num_actions, dtype=torch.float64))
        self.rows: dict = {}
        self.rng = np.random.default_rng(seed)

    def row(self, k) -> int:
        if k not in self.rows:
            if len(self.rows) >= self.capacity:
                raise RuntimeError(f"KeyTablePolicy is full ({self.capacity} keys); raise capacity")
            self.rows[k] = len(self.rows)
        return self.rows[k]

    def keys_of(self, ep) -> list:
        return ep.state_keys if self.key == "state" else ep.observations

    def probs(self, keys) -> torch.Tensor:
        idx = torch.tensor([self.row(k) for k in keys], dtype=torch.long)
        return torch.softmax(self.logits[idx], -1)  # (N, A)

    @torch.no_grad()
    def act(self, envs, observations) -> list[int]:
        """A ``play_episodes`` policy: sample one action index per running environment."""
        keys = [e.state_key() for e in envs] if self.key == "state" else observations
        p = self.probs(keys).numpy()  # (N, A)
        return [int(self.rng.choice(p.shape[1], p=pi / pi.sum())) for pi in p]

    def episode_logps(self, episodes) -> torch.Tensor:
        """log pi(a_t | k_t) of every turn of every episode, concatenated, (sum_i T_i,)."""
        keys = [k for ep in episodes for k in self.keys_of(ep)]
        actions = torch.tensor([a for ep in episodes for a in ep.action_ids], dtype=torch.long)
        idx = torch.tensor([self.row(k) for k in keys], dtype=torch.long)
        return torch.log_softmax(self.logits[idx], -1).gather(-1, actions[:, None]).squeeze(-1)


@dataclass
class AgentPGConfig:
    num_iters: int = 50
    """rollout batches"""
    num_tasks: int = 8
    """groups per batch: task seeds drawn from ``train_seeds``"""
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
    scale: bool = True
    """divide group-centred returns by the group std (GRPO/GiGPO); False = mean-only"""
    clip_eps: float = 0.2
    """PPO clip range (matters only with num_inner_epochs > 1)"""
    num_inner_epochs: int = 1
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
        return credit.grpo_broadcast(episodes, scale=cfg.scale)
    if cfg.estimator == "gigpo":
        return credit.gigpo_advantages(episodes, gamma=cfg.gamma, omega=cfg.omega, scale=cfg.scale)
    critic = {} if critic is None else critic
    values = [np.array([critic.get(k, 0.0) for k in ep.state_keys]) for ep in episodes]
    last = [critic.get(ep.next_state_key, 0.0) for ep in episodes]
    return credit.turn_gae(episodes, values, cfg.gamma, cfg.lam, last_values=last)


def fit_critic(critic: dict, episodes, gamma: float, step: float) -> dict:
    """Tabular Monte-Carlo critic: V(k) += step * (G_t - V(k)) for every visited (k, G_t)."""
    for ep in episodes:
        for k, g in zip(ep.state_keys, credit.returns_to_go(ep.rewards, gamma)):
            v = critic.get(k, 0.0)
            critic[k] = v + step * (g - v)
    return critic


def update(policy: KeyTablePolicy, optimizer, episodes, advantages, cfg: AgentPGConfig) -> dict:
    """PPO-clipped steps on one batch, turn-level mean. Returns metrics of the last step."""
    adv = torch.as_tensor(np.concatenate(advantages), dtype=torch.float64)  # (N,)
    with torch.no_grad():
        old = policy.episode_logps(episodes)  # (N,)
    metrics = {}
    for _ in range(cfg.num_inner_epochs):
        logps = policy.episode_logps(episodes)  # (N,)
        loss, metrics = ppo_clip_loss(logps, old, adv, clip_eps=cfg.clip_eps)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        metrics["loss"] = loss.item()
    return metrics


def train(make_env, policy: KeyTablePolicy, cfg: AgentPGConfig, train_seeds, advantage_fn=None,
          eval_fn=None, log=None) -> list[dict]:
    """Train ``policy`` for ``cfg.num_iters`` batches. Returns one row per iteration: episodes so
    far, batch success rate and return, mean |A|, and eval_fn(policy)'s dict every eval_every.

    advantage_fn(episodes) -> list of (T_i,) arrays replaces ``cfg.estimator`` (plug in ArCHer's
    critic, SPA-RL's progress, or anything else). log: optional MetricsLogger.
    """
    rng = np.random.default_rng(cfg.seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    critic: dict = {}
    history, num_episodes = [], 0
    for it in range(cfg.num_iters):
        seeds = rng.choice(np.asarray(train_seeds), size=cfg.num_tasks)
        episodes = play_episodes(make_env, policy.act, list(seeds), cfg.group_size, cfg.max_turns)
        num_episodes += len(episodes)
        if advantage_fn is not None:
            adv = advantage_fn(episodes)
        else:
            adv = estimate(episodes, cfg, critic)
            if cfg.estimator == "turn_gae":
                fit_critic(critic, episodes, cfg.gamma, cfg.critic_lr)
        metrics = update(policy, optimizer, episodes, adv, cfg)
        row = {"iteration": it + 1, "episodes": num_episodes,
               "success": float(np.mean([ep.success for ep in episodes])),
               "return": float(np.mean([ep.ret for ep in episodes])),
               "turns": float(np.mean([len(ep) for ep in episodes])),
               "abs_adv": float(np.mean(np.abs(np.concatenate(adv)))), **metrics}
        if eval_fn is not None and ((it + 1) % cfg.eval_every == 0 or it == 0
                                    or it + 1 == cfg.num_iters):
            row.update(eval_fn(policy))
        history.append(row)
        if log is not None:
            log.log(**row)
    return history


def evaluate(make_env, policy: KeyTablePolicy, seeds, greedy: bool = True,
             max_turns: int | None = None) -> dict:
    """Success rate and mean return on fixed task seeds (one episode each), greedy by default."""
    if greedy:
        def act(envs, observations):
            keys = [e.state_key() for e in envs] if policy.key == "state" else observations
            with torch.no_grad():
                return policy.probs(keys).argmax(-1).tolist()
    else:
        act = policy.act
    episodes = play_episodes(make_env, act, list(seeds), 1, max_turns)
    return {"eval_success": float(np.mean([ep.success for ep in episodes])),
            "eval_return": float(np.mean([ep.ret for ep in episodes]))}
