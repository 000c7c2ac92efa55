"""Policies that are not language models: softmax tables, an MLP, CleanRL's actor-critic.

- ``TabularSoftmaxPolicy``: pi(a|s) = softmax(theta[s]) over a TabularMDP's states.
- ``TabularTreePolicy``: one softmax table per depth of a ``TokenTreeMDP`` (``PromptSetPolicy``:
  B of them stacked, one per prompt).
- ``KeyTablePolicy``: a softmax row per hashable key (a multi-turn env's state or observation),
  assigned at first sight (``KeyRows``, the key -> row lookup every keyed table shares); ``tabular_agent``: any (S, A) table as a ``play_episodes`` policy.
- ``mlp``, ``MLPPolicy``, ``ActorCritic``: CleanRL's networks.

Each is a plain ``nn.Module`` (or a function); none imports an environment.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

Tensor = torch.Tensor


class TabularSoftmaxPolicy(nn.Module):
    """pi(a|s) = softmax(theta[s])_a with theta (S, A), zeros at start (the uniform policy)."""

    def __init__(self, num_states: int, num_actions: int, dtype=torch.float64):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(num_states, num_actions, dtype=dtype))

    def probs(self) -> Tensor:
        return torch.softmax(self.logits, -1)  # (S, A)

    def dist(self, states: Tensor) -> Categorical:
        return Categorical(logits=self.logits[states])  # batch (B,)


def mlp(sizes: list[int], activation=nn.Tanh, out_std: float | None = None) -> nn.Sequential:
    """Linear layers with ``activation`` between them; orthogonal init (gain sqrt 2 inside and
    ``out_std`` on the last layer) when out_std is given, as CleanRL does."""
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        if out_std is not None:
            last = i == len(sizes) - 2
            nn.init.orthogonal_(lin.weight, out_std if last else math.sqrt(2))
            nn.init.zeros_(lin.bias)
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class MLPPolicy(nn.Module):
    """Categorical policy over ``num_actions`` from an observation vector (B, obs_dim)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64, depth: int = 2):
        super().__init__()
        self.net = mlp([obs_dim] + [hidden] * depth + [num_actions], out_std=0.01)

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs)  # (B, A) logits

    def dist(self, obs: Tensor) -> Categorical:
        return Categorical(logits=self(obs))


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (64-64 tanh), CleanRL's ``ppo.py`` Agent."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64):
        super().__init__()
        self.critic = mlp([obs_dim, hidden, hidden, 1], out_std=1.0)
        self.actor = mlp([obs_dim, hidden, hidden, num_actions], out_std=0.01)

    def value(self, obs: Tensor) -> Tensor:
        return self.critic(obs).squeeze(-1)  # (B,)

    def act(self, obs: Tensor, action: Tensor | None = None):
        """Returns (action, log_prob, entropy, value), each (B,); samples when action is None."""
        dist = Categorical(logits=self.actor(obs))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.value(obs)


# --- token trees -------------------------------------------------------------------------------
class TabularTreePolicy(torch.nn.Module):
    """A softmax table per depth: logits[d] (V^d, V), initialised to zeros (the uniform policy)."""

    def __init__(self, tree):
        super().__init__()
        self.tree = tree
        self.logits = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(tree.V**d, tree.V, dtype=torch.float64))
             for d in range(tree.H)]
        )

    def probs(self) -> list[Tensor]:
        return [torch.softmax(lg, -1) for lg in self.logits]

    def log_prob(self, nodes: Tensor, tokens: Tensor) -> Tensor:
        """Per-step log pi(a_d | node_d) for sampled paths: nodes, tokens (B, H) -> (B, H)."""
        out = [torch.log_softmax(self.logits[d][nodes[:, d]], -1).gather(-1, tokens[:, d:d + 1])
               for d in range(self.tree.H)]
        return torch.cat(out, -1)


class PromptSetPolicy(torch.nn.Module):
    """B independent TabularTreePolicy tables, stacked: logits[d] (B, V^d, V), zeros = uniform."""

    def __init__(self, num_prompts: int, vocab_size: int, depth: int):
        super().__init__()
        self.B, self.V, self.H = num_prompts, vocab_size, depth
        self.logits = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(num_prompts, vocab_size**d, vocab_size,
                                            dtype=torch.float64)) for d in range(depth)])

    def probs(self) -> list[Tensor]:
        return [torch.softmax(lg, -1) for lg in self.logits]  # H x (B, V^d, V)

    def log_prob(self, nodes: Tensor, tokens: Tensor) -> Tensor:
        """Per-step log pi(a_d | node_d): nodes, tokens (B, N, H) -> (B, N, H)."""
        out = []
        for d in range(self.H):
            logp = torch.log_softmax(self.logits[d], -1)  # (B, V^d, V)
            rows = logp.gather(1, nodes[..., d:d + 1].expand(-1, -1, self.V))  # (B, N, V)
            out.append(rows.gather(-1, tokens[..., d:d + 1]))  # (B, N, 1)
        return torch.cat(out, -1)


# --- multi-turn environments ---------------------------------------------------------------------
class KeyRows(dict):
    """key -> row index of a table keyed by hashable states, assigned 0, 1, ... at a key's first
    sight by ``row`` (reading it as a dict, ``k in rows`` or ``rows[k]``, assigns nothing); at most
    ``capacity`` keys (None: no cap). The one lookup of every such table: ``KeyTablePolicy`` (and
    ``hgpo.WindowTablePolicy``), ``oprl.ImplicitPRM``, ``archer.OneHotKeys``, ``spa``'s features.

    >>> rows = KeyRows(capacity=2)
    >>> rows.rows_of(["b", "a", "b"]), dict(rows)
    ([0, 1, 0], {'b': 0, 'a': 1})
    """

    def __init__(self, capacity: int | None = None, owner: str = "the table"):
        super().__init__()
        self.capacity, self.owner = capacity, owner

    def row(self, k) -> int:
        if k not in self:
            if self.capacity is not None and len(self) >= self.capacity:
                raise RuntimeError(f"{self.owner} is full ({self.capacity} keys); raise capacity")
            self[k] = len(self)
        return self[k]

    def rows_of(self, keys) -> list[int]:
        """``row`` of each key, in order."""
        return [self.row(k) for k in keys]


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
        self.rows = KeyRows(capacity, "KeyTablePolicy")
        self.rng = np.random.default_rng(seed)

    def row(self, k) -> int:
        return self.rows.row(k)

    def row_index(self, keys) -> torch.Tensor:
        """The table rows of ``keys`` (assigned at first sight), (N,) long."""
        return torch.tensor(self.rows.rows_of(keys), dtype=torch.long)

    def keys_of(self, ep) -> list:
        return ep.state_keys if self.key == "state" else ep.observations

    def probs(self, keys) -> torch.Tensor:
        return torch.softmax(self.logits[self.row_index(keys)], -1)  # (N, A)

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
        return torch.log_softmax(self.logits[self.row_index(keys)], -1).gather(-1, actions[:, None]).squeeze(-1)

    def episode_entropies(self, episodes) -> torch.Tensor:
        """H(pi(. | k_t)) = -sum_a pi log pi of every turn of every episode, concatenated, with
        gradient (entropy bonuses and regularisers; EMPG's step entropies). (sum_i T_i,)"""
        keys = [k for ep in episodes for k in self.keys_of(ep)]
        logp = torch.log_softmax(self.logits[self.row_index(keys)], -1)  # (N, A)
        return -(logp.exp() * logp).sum(-1)


def tabular_agent(probs, index, generator: np.random.Generator | None = None):
    """A policy for ``play_episodes`` from a table: ``probs[index(env)]`` is the action
    distribution (over ``env.actions``) in env's current state.

    probs: (S, A) array or tensor; index: env -> row (e.g. ``lambda e: e.state_index()``).
    """
    rng = generator if generator is not None else np.random.default_rng()
    table = np.asarray(probs.detach().cpu() if hasattr(probs, "detach") else probs, dtype=float)

    def act(envs, observations):
        return [int(rng.choice(table.shape[1], p=table[index(e)])) for e in envs]
    return act
