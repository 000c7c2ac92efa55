"""Small policies for exact analysis: a softmax table, an MLP, and CleanRL's actor-critic."""

from __future__ import annotations

import math

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
