"""A DQN-style value learner whose Q-head is trained by regression (MSE) or by classification
(two-hot or HL-Gauss cross-entropy): "Stop Regressing: Training Value Functions via Classification
for Scalable Deep RL" (Farebrother et al. 2024, arXiv:2403.03950).

The TD target of a transition (s, a, r, s') (n-step: the discounted sum of n rewards and
gamma^n) is

    y = r + gamma^n (1 - terminated) max_a' Q_target(s', a'),

and the online network is fitted to it with ``estimator``:

- ``'mse'``: the head outputs one value per action, loss (Q(s, a) - y)^2 (DQN with an L2 loss);
- ``'two_hot'`` / ``'hl_gauss'``: the head outputs ``num_bins`` logits per action over the fixed
  support z_1..z_K = linspace(v_min, v_max, K); Q(s, a) = sum_k softmax(logits)_k z_k, and the loss
  is the cross-entropy between the softmax and the target distribution of y
  (``value_targets.two_hot`` / ``value_targets.hl_gauss``, sigma = ``sigma_ratio`` bin widths).

Only the loss and the head's width differ between the estimators: the network body, the replay,
the target network, the exploration and the optimiser are shared.

From the paper: the two-hot and HL-Gauss projections, the expectation read-out used both for acting
and for the bootstrap max, sigma / bin width = 0.75 (their recommended ratio), the claim that the
gap to MSE grows with target noise and network size. Inferred (the paper's settings are Atari,
ResNets, offline data and language agents): the MLP, the hard target-network update every
``target_every`` steps, Adam, the linear epsilon schedule, the support ``[v_min, v_max]`` with 51
bins, and every number in ``DQNConfig``. The classic DQN is Mnih et al. (2015).

``evaluate_grid`` scores a Q-network on ``GridAgentEnv`` exactly: the greedy policy's discounted
return from ``dp.policy_evaluation`` on each task's tabular form, and the RMSE of Q against Q*.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from agentrl_lib.algorithms import dp
from agentrl_lib.algorithms import value_targets as vt
from agentrl_lib.utils import optimizer_step, progress

ESTIMATORS = vt.KINDS  # ('mse', 'two_hot', 'hl_gauss')


@dataclass
class DQNConfig:
    estimator: str = "hl_gauss"
    """how the Q-head is trained: 'mse' (regression), 'two_hot' or 'hl_gauss' (cross-entropy)"""
    hidden: int = 64
    """width of every hidden layer of the MLP Q-network (the paper's scaling axis)"""
    num_layers: int = 2
    """hidden layers (ReLU)"""
    num_bins: int = 51
    """K, support points of the cross-entropy heads (ignored by 'mse')"""
    v_min: float = -2.0
    """lowest support point; targets below are clipped by two-hot, truncated by HL-Gauss"""
    v_max: float = 3.0
    """highest support point"""
    sigma_ratio: float = 0.75
    """HL-Gauss sigma in bin widths (the paper's recommended 0.75)"""
    gamma: float = 0.9
    """discount of the TD target"""
    n_step: int = 1
    """rewards summed before bootstrapping (1: one-step DQN)"""
    lr: float = 1e-3
    """Adam learning rate, the same for every estimator"""
    batch_size: int = 64
    """transitions per update"""
    buffer_size: int = 10_000
    """replay capacity (oldest transitions overwritten)"""
    num_iters: int = 3000
    """environment steps; after ``learning_starts`` each is followed by one update"""
    learning_starts: int = 200
    """steps of pure collection before the first update"""
    target_every: int = 100
    """steps between hard copies of the online network into the target network"""
    eps_start: float = 1.0
    """epsilon-greedy exploration at step 0"""
    eps_end: float = 0.05
    """epsilon after the linear decay"""
    eps_frac: float = 0.5
    """fraction of ``num_iters`` over which epsilon decays linearly"""
    max_grad_norm: float | None = 10.0
    """gradient-norm clip (None: none)"""
    eval_every: int = 0
    """steps between calls of the ``evaluate`` callback (0: only at the end)"""
    seed: int = 0
    """seeds the network, the replay sampling, exploration and the episodes' seeds"""


def support_of(cfg: DQNConfig) -> Tensor:
    """The fixed support (K,) of the cross-entropy heads."""
    return vt.uniform_support(cfg.v_min, cfg.v_max, cfg.num_bins)


def sigma_of(cfg: DQNConfig) -> float:
    """HL-Gauss sigma in value units: ``sigma_ratio`` x the bin width."""
    return cfg.sigma_ratio * (cfg.v_max - cfg.v_min) / (cfg.num_bins - 1)


class QNet(nn.Module):
    """MLP: features (B, D) -> head (B, A, K) logits (K = num_bins) or (B, A, 1) values (mse).
    ``q_values`` reads Q (B, A): the value itself, or the expectation of the softmax on the support.
    """

    def __init__(self, in_dim: int, num_actions: int, cfg: DQNConfig):
        super().__init__()
        if cfg.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {cfg.estimator!r}; choose one of {ESTIMATORS}")
        self.estimator, self.num_actions = cfg.estimator, num_actions
        self.out = 1 if cfg.estimator == "mse" else cfg.num_bins
        layers, d = [], in_dim
        for _ in range(cfg.num_layers):
            layers += [nn.Linear(d, cfg.hidden), nn.ReLU()]
            d = cfg.hidden
        layers.append(nn.Linear(d, num_actions * self.out))
        self.body = nn.Sequential(*layers)
        self.register_buffer("support", support_of(cfg).float())

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x).view(len(x), self.num_actions, self.out)  # (B, A, K or 1)

    def q_values(self, x: Tensor) -> Tensor:
        return head_q_values(self(x), self.estimator, self.support)


def head_q_values(head: Tensor, estimator: str, support: Tensor) -> Tensor:
    """Q (B, A) from a head (B, A, K or 1): the value ('mse') or sum_k softmax_k z_k."""
    if estimator == "mse":
        return head[..., 0]
    return torch.softmax(head, -1) @ support.to(head.dtype)  # (B, A)


def td_target(rewards: Tensor, discounts: Tensor, next_q: Tensor) -> Tensor:
    """y = r + discount * max_a' Q_target(s', a'); discount = gamma^n (1 - terminated).
    rewards, discounts (B,), next_q (B, A) -> (B,)."""
    return rewards + discounts * next_q.max(-1).values


def td_loss(head: Tensor, actions: Tensor, y: Tensor, estimator: str, support: Tensor | None = None,
            sigma: float | None = None) -> tuple[Tensor, dict]:
    """The loss of the taken actions' heads against the TD targets. head (B, A, K or 1), actions
    (B,) long, y (B,) (no gradient) -> (loss, metrics). 'mse': (Q(s,a) - y)^2; 'two_hot' /
    'hl_gauss': the cross-entropy of ``value_targets.value_loss``."""
    taken = head[torch.arange(len(actions)), actions]  # (B, K or 1)
    y = y.detach()
    if estimator == "mse":
        pred = taken[:, 0]  # (B,)
        loss = vt.value_loss(pred, y, "mse")
        q = pred
    else:
        loss = vt.value_loss(taken, y, estimator, support, sigma)
        q = torch.softmax(taken, -1) @ support.to(taken.dtype)  # (B,)
    return loss, {"loss": loss.item(), "q_mean": q.mean().item(), "target_mean": y.mean().item(),
                  "td_abs": (q - y).abs().mean().item()}


class ReplayBuffer:
    """A ring buffer of n-step transitions (x, a, r, discount, x'): discount = gamma^m (1 -
    terminated) for an m-step transition."""

    def __init__(self, capacity: int, in_dim: int):
        self.x = torch.zeros(capacity, in_dim)
        self.x2 = torch.zeros(capacity, in_dim)
        self.a = torch.zeros(capacity, dtype=torch.long)
        self.r = torch.zeros(capacity)
        self.d = torch.zeros(capacity)
        self.capacity, self.size, self.pos = capacity, 0, 0

    def add(self, x: Tensor, a: int, r: float, discount: float, x2: Tensor) -> None:
        i = self.pos
        self.x[i], self.a[i], self.r[i], self.d[i], self.x2[i] = x, a, r, discount, x2
        self.pos = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator):
        idx = torch.randint(self.size, (batch_size,), generator=generator)
        return self.x[idx], self.a[idx], self.r[idx], self.d[idx], self.x2[idx]


def n_step_transitions(pending: list, gamma: float, x2: Tensor, terminated: bool, flush: bool):
    """Turn the pending (x, a, r) steps into n-step transitions ending at x2. With ``flush``
    (episode over) every pending step is emitted with its remaining rewards; otherwise only the
    oldest, with the full window. Returns [(x, a, sum_k gamma^k r_k, discount)] and removes them."""
    out = []
    while pending:
        rets = sum(gamma ** k * r for k, (_, _, r) in enumerate(pending))
        disc = 0.0 if terminated else gamma ** len(pending)
        x, a, _ = pending.pop(0)
        out.append((x, a, rets, disc))
        if not flush:
            break
    return out


def update(qnet: QNet, target_net: QNet, optimizer, batch, cfg: DQNConfig) -> dict:
    """One gradient step on a replay batch; returns the loss metrics."""
    x, a, r, d, x2 = batch
    with torch.no_grad():
        y = td_target(r, d, target_net.q_values(x2))  # (B,)
    loss, metrics = td_loss(qnet(x), a, y, cfg.estimator, qnet.support, sigma_of(cfg))
    optimizer_step(optimizer, loss, cfg.max_grad_norm)
    return metrics


def train(env, cfg: DQNConfig, encode, evaluate=None, logger=None):
    """DQN on a multi-turn environment (``env.actions``; ``env.step(text)`` -> (obs, r, done,
    info) with ``info['truncated']``). ``encode(env)`` gives the current state's features (D,);
    ``evaluate(qnet)`` returns a dict of named floats, logged as ``eval/<name>`` every
    ``cfg.eval_every`` steps and at the end. Returns (qnet, rows)."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    A = len(env.actions)
    env.reset(seed=int(rng.integers(1 << 31)))
    x = encode(env).float()
    qnet = QNet(len(x), A, cfg)
    target_net = copy.deepcopy(qnet)
    opt = torch.optim.Adam(qnet.parameters(), lr=cfg.lr)
    buf = ReplayBuffer(cfg.buffer_size, len(x))
    pending, rows, episodes, ep_ret, metrics = [], [], 0, 0.0, {}
    for it in progress(range(1, cfg.num_iters + 1), desc="dqn"):
        eps = cfg.eps_end + (cfg.eps_start - cfg.eps_end) * max(
            0.0, 1 - (it - 1) / max(1.0, cfg.eps_frac * cfg.num_iters))
        if rng.random() < eps:
            a = int(rng.integers(A))
        else:
            with torch.no_grad():
                a = int(qnet.q_values(x[None])[0].argmax())
        _, r, done, info = env.step(env.actions[a])
        x2 = encode(env).float()
        ep_ret += r
        pending.append((x, a, float(r)))
        terminated = done and not info.get("truncated", False)
        if done or len(pending) == cfg.n_step:
            for xs, as_, rs, ds in n_step_transitions(pending, cfg.gamma, x2, terminated, done):
                buf.add(xs, as_, rs, ds, x2)
        if done:
            episodes += 1
            rows.append({"global_step": it, "episodes": episodes, "rollout/return": ep_ret})
            ep_ret = 0.0
            env.reset(seed=int(rng.integers(1 << 31)))
            x2 = encode(env).float()
        x = x2
        if it > cfg.learning_starts and buf.size >= cfg.batch_size:
            metrics = update(qnet, target_net, opt, buf.sample(cfg.batch_size, gen), cfg)
        if it % cfg.target_every == 0:
            target_net.load_state_dict(qnet.state_dict())
        last = it == cfg.num_iters
        if evaluate is not None and (last or (cfg.eval_every and it % cfg.eval_every == 0)):
            row = {"global_step": it, "episodes": episodes, "charts/epsilon": eps}
            row.update({f"losses/{k}": v for k, v in metrics.items()})
            row.update({f"eval/{k}": v for k, v in evaluate(qnet).items()})
            rows.append(row)
            if logger is not None:
                logger.log(**row)
    return qnet, rows


# --- exact scoring on GridAgentEnv ---------------------------------------------------------------
def grid_features(env, cell: tuple | None = None, goal: tuple | None = None) -> Tensor:
    """One-hot cell concatenated with one-hot goal (2 rows cols,): the goal-conditioned state of
    ``GridAgentEnv`` (its ``state_key``). Defaults: the current cell and goal."""
    cell = env.pos if cell is None else cell
    goal = env.task[1] if goal is None else goal
    n = env.rows * env.cols
    x = torch.zeros(2 * n)
    x[cell[0] * env.cols + cell[1]] = 1.0
    x[n + goal[0] * env.cols + goal[1]] = 1.0
    return x


def grid_q_table(qnet: QNet, env, goal: tuple) -> Tensor:
    """Q of every cell for one goal, in the tabular form's action order (S, A), float64."""
    cells = [(r, c) for r in range(env.rows) for c in range(env.cols)]
    with torch.no_grad():
        q = qnet.q_values(torch.stack([grid_features(env, c, goal) for c in cells]))  # (S, A)
    order = [env.actions.index(name) for name in ("left", "down", "right", "up")]
    return q[:, order].double()


def evaluate_grid(qnet: QNet, env) -> dict:
    """Exact scores over ``env.tasks`` (start, goal): ``return`` the mean discounted return of the
    greedy policy from each task's start (``dp.policy_evaluation``), ``optimal_return`` that of the
    optimum, ``norm_return`` their mean ratio, ``optimal`` the fraction of tasks where the greedy
    policy is optimal from the start (within 1e-3: slips make near-ties), ``q_rmse`` the RMSE of
    Q against Q* over the free non-goal cells of every goal in the tasks."""
    by_goal: dict[tuple, list] = {}
    for start, goal in env.tasks:
        by_goal.setdefault(tuple(goal), []).append(tuple(start))
    rets, opts, sq, n = [], [], 0.0, 0
    for goal, starts in by_goal.items():
        mdp = env.tabular_form(starts[0], goal)
        q_star = mdp.optimal_q()
        q = grid_q_table(qnet, env, goal)
        v = dp.policy_evaluation(mdp, dp.greedy(q))  # (S,)
        v_star = q_star.max(-1).values
        free = torch.tensor([env.layout[r][c] != "#" for r in range(env.rows)
                             for c in range(env.cols)]) & ~mdp.terminal
        sq += ((q - q_star)[free] ** 2).sum().item()
        n += int(free.sum()) * q.shape[1]
        for s in starts:
            i = s[0] * env.cols + s[1]
            rets.append(v[i].item())
            opts.append(v_star[i].item())
    rets, opts = np.array(rets), np.array(opts)
    return {"return": float(rets.mean()), "optimal_return": float(opts.mean()),
            "norm_return": float(np.mean(rets / opts)),
            "optimal": float(np.mean(rets >= opts - 1e-3)),
            "q_rmse": float(np.sqrt(sq / n))}
