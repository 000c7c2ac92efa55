"""SPA-RL: stepwise progress attribution (Wang et al. 2025, "SPA-RL: Reinforcing LLM Agents via
Stepwise Progress Attribution", arXiv:2505.20732).

A *progress estimator* c_phi(s_t, a_t) is fitted so that the per-step contributions of an episode
sum to its outcome reward R (reward redistribution)::

    L(phi) = mean_i ( sum_t c_phi(s_t^i, a_t^i) - R_i )^2                         (sum-to-outcome)

The step reward fuses the contribution with a *grounding* signal g_t = 1[a_t was executable]::

    r_hat_t = alpha * c_t + beta * g_t

and the policy is trained on the step rewards (the paper uses PPO). ``spa_advantages`` returns one
advantage per turn, A_t = sum_{k >= t} gamma^(k-t) r_hat_k, whitened over the batch, in the
shape convention of ``credit.py`` (a list of (T_i,) float64 arrays), so it plugs into
``agent_pg.train(credit_fn=...)`` and into the credit arena against A*.

The MLP estimator (``SPAConfig(model="mlp")`` with a ``features`` function, e.g.
``ShopEnv.relative_features``) is the one an LM agent uses here: ``SPACredit`` is also a
``credit_fn`` for ``grpo.train`` (it refits on the batch and returns the turn advantages). All of
its tensors live on the cpu (host-side float64 bookkeeping), whatever torch's default device is.

Taken from the paper / reference code (github WangHanLinHenry/SPA-RL-Agent): the sum-of-turn-
values MSE loss (``prm/train_our_progress_model.py``: a linear head on the last token of each
turn, summed over turns, MSE against the final reward); the grounding value 0.5 for an executable
step and 0 for a "Nothing happens" step (``prm/rl_data_org.py``; here beta = 0.5). Inferred: the
estimator's form here (ridge regression on one-hot or given features, or a small MLP), refitting
online on a replay buffer, the return-to-go with ``gamma`` and the batch whitening of PPO-style
advantages. Note: with an exact fit and gamma = 1, sum_{k>=t} c_k = R - sum_{k<t} c_k, i.e.
REINFORCE with the progress made so far as a baseline; with gamma = 0 the contribution itself is the
advantage (RUDDER's view: after an ideal redistribution the expected future reward is 0).

The fit is identified only up to a potential: c'(s, a) = c(s, a) + Phi(s') - Phi(s) with
Phi(start) = Phi(terminal) = 0 gives the same sums on every finished episode. Ridge picks the
minimum-norm decomposition; truncated episodes (R = 0 with the state s_T not terminal) pin part of
the freedom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from agentrl_lib.core import discounted_returns, whiten
from agentrl_lib.models.policies import KeyRows
from agentrl_lib.utils import optimizer_step


@dataclass
class SPAConfig:
    model: str = "linear"
    """progress estimator: 'linear' (closed-form ridge on the features; one-hot = a table) or 'mlp'"""
    l2: float = 1e-3
    """ridge penalty of the linear fit (weight decay of the MLP)"""
    hidden: int = 32
    """MLP hidden width"""
    num_epochs: int = 300
    """MLP full-batch Adam steps per fit"""
    lr: float = 0.01
    """MLP Adam learning rate"""
    alpha: float = 1.0
    """weight of the progress contribution c_t in the step reward"""
    beta: float = 0.5
    """weight of the grounding term g_t = 1[valid]; the reference code adds 0.5 per executable step"""
    gamma: float = 1.0
    """discount of the step rewards' return-to-go (0: the step reward alone is the advantage)"""
    norm_adv: bool = True
    """whiten the advantages over all turns of the batch (PPO-style, ddof 0); False: raw"""
    buffer_size: int = 1024
    """SPACredit: most recent episodes kept for refitting the estimator"""

    def __post_init__(self):
        if self.model not in ("linear", "mlp"):
            raise ValueError(f"model must be 'linear' or 'mlp', got {self.model!r}")


def outcomes(episodes) -> np.ndarray:
    """R_i: the episode's (undiscounted) return, the target of the sum-to-outcome fit. (B,)"""
    return np.array([ep.ret for ep in episodes], dtype=np.float64)


def grounding(episodes) -> list[np.ndarray]:
    """g_t = 1 if turn t's action was executable (``info['valid']``), else 0. (T_i,) each."""
    return [np.asarray(ep.valid, dtype=np.float64) for ep in episodes]


def fused_rewards(contributions, ground, alpha: float, beta: float) -> list[np.ndarray]:
    """r_hat_t = alpha * c_t + beta * g_t per episode."""
    return [alpha * np.asarray(c, dtype=np.float64) + beta * g
            for c, g in zip(contributions, ground)]


def sum_to_outcome_loss(contributions, targets) -> float:
    """mean_i (sum_t c_t^i - R_i)^2."""
    sums = np.array([np.sum(c) for c in contributions])
    return float(np.mean((sums - np.asarray(targets)) ** 2))


def mlp_init(in_features: int, hidden: int, seed: int) -> nn.Sequential:
    """c_phi's network, Linear(D, H) - tanh - Linear(H, 1) in float64 on the cpu, every weight and
    bias drawn U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (``nn.Linear``'s default bounds) from a
    generator seeded with ``seed``: the global torch RNG is left alone."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    kw = dict(dtype=torch.float64, device="cpu")  # skip_init: no draw from the global RNG
    net = nn.Sequential(nn.utils.skip_init(nn.Linear, in_features, hidden, **kw), nn.Tanh(),
                        nn.utils.skip_init(nn.Linear, hidden, 1, **kw))
    with torch.no_grad():
        for layer in (net[0], net[2]):
            bound = 1.0 / math.sqrt(layer.in_features)
            layer.weight.uniform_(-bound, bound, generator=gen)
            layer.bias.uniform_(-bound, bound, generator=gen)
    return net


def sum_to_outcome_mse(c_n: torch.Tensor, owner_n: torch.Tensor, targets_b: torch.Tensor):
    """The differentiable loss, mean_i (sum_{t in episode i} c_t - R_i)^2, on flat per-step
    contributions c_n (N,) with ``owner_n`` (N,) the episode index of each step and targets (B,)."""
    sums = torch.zeros(len(targets_b), dtype=c_n.dtype, device=c_n.device).index_add(0, owner_n, c_n)  # (B,)
    return ((sums - targets_b) ** 2).mean()


class ProgressModel:
    """c_phi(s, a): per-step contribution of action a in state s, fitted by sum-to-outcome MSE.

    features: (state_key, action_text) -> 1-D float array. When None, one-hot features over the
    keys ``key(state_key, action_text)`` seen at fit time (default key: the pair itself), i.e. a
    table; an unseen pair contributes 0. Works for any env with hashable state keys.
    """

    def __init__(self, cfg: SPAConfig | None = None, features=None, key=None, seed: int = 0):
        self.cfg = cfg or SPAConfig()
        self.features, self.key = features, key or (lambda s, a: (s, a))
        self.index = KeyRows(owner="ProgressModel")  # feature key -> one-hot column
        self.w: np.ndarray | None = None
        self.net: nn.Module | None = None
        self.seed = seed
        self._cache: dict = {}  # id(episode) -> (episode, its (T, D) feature rows or keys)

    # --- features -----------------------------------------------------------------------------
    def _phi(self, steps) -> np.ndarray:
        """(N, D) feature rows of (state_key, action) steps from the given features function."""
        return np.stack([np.asarray(self.features(s, a), dtype=np.float64) for s, a in steps])

    @staticmethod
    def steps(ep) -> list[tuple]:
        return list(zip(ep.state_keys, ep.actions))

    def _keys(self, ep) -> list:
        """key(s_t, a_t) of every turn, cached per episode object (features can be slow)."""
        hit = self._cache.get(id(ep))
        if hit is None or hit[0] is not ep:
            hit = (ep, [self.key(s, a) for s, a in self.steps(ep)])
            if len(self._cache) > 200_000:
                self._cache.clear()
            self._cache[id(ep)] = hit
        return hit[1]

    def _rows(self, ep) -> np.ndarray:
        """(T, D) feature rows of one episode."""
        if self.features is not None:
            return self._phi(self.steps(ep))
        out = np.zeros((len(ep), len(self.index)))
        for t, k in enumerate(self._keys(ep)):
            j = self.index.get(k)
            if j is not None:
                out[t, j] = 1.0
        return out

    # --- fit and predict ----------------------------------------------------------------------
    def fit(self, episodes, targets=None) -> dict:
        """Fit on episodes (targets default to their returns). Returns {'fit_mse', 'num_features'}."""
        targets = outcomes(episodes) if targets is None else np.asarray(targets, dtype=np.float64)
        if self.features is None:
            for ep in episodes:
                for k in self._keys(ep):
                    self.index.row(k)
        rows = [self._rows(ep) for ep in episodes]  # each (T_i, D)
        D = rows[0].shape[1] if rows else 0
        if self.cfg.model == "linear":
            X = np.stack([r.sum(0) if len(r) else np.zeros(D) for r in rows])  # (B, D)
            # ridge: w = (X^T X + l2 I)^-1 X^T R = X^T (X X^T + l2 I)^-1 R (the smaller solve);
            # the minimum-norm least-squares solution as l2 -> 0
            if D <= len(X):
                self.w = np.linalg.solve(X.T @ X + self.cfg.l2 * np.eye(D), X.T @ targets)
            else:
                self.w = X.T @ np.linalg.solve(X @ X.T + self.cfg.l2 * np.eye(len(X)), targets)
        else:
            self._fit_mlp(rows, targets, D)
        mse = sum_to_outcome_loss(self.contributions(episodes), targets)
        return {"fit_mse": mse, "num_features": D}

    def _fit_mlp(self, rows, targets, D):
        """``cfg.num_epochs`` full-batch Adam steps on ``sum_to_outcome_mse``; the network is
        kept between fits (warm start), made by ``mlp_init(D, hidden, seed)`` at the first."""
        if self.net is None or self.net[0].in_features != D:
            self.net = mlp_init(D, self.cfg.hidden, self.seed)
        x = torch.as_tensor(np.concatenate(rows), dtype=torch.float64, device="cpu")  # (N, D)
        owner = torch.as_tensor(np.repeat(np.arange(len(rows)), [len(r) for r in rows]),
                                device="cpu")  # (N,)
        y = torch.as_tensor(targets, dtype=torch.float64, device="cpu")  # (B,)
        with torch.device("cpu"):  # Adam's step counters too, whatever the default device
            opt = torch.optim.Adam(self.net.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.l2)
            for _ in range(self.cfg.num_epochs):
                loss = sum_to_outcome_mse(self.net(x).squeeze(-1), owner, y)
                optimizer_step(opt, loss)

    def contributions(self, episodes) -> list[np.ndarray]:
        """c_t for every turn of every episode, (T_i,) each; zeros before the first fit."""
        out = []
        for ep in episodes:
            if len(ep) == 0:
                out.append(np.zeros(0))
                continue
            if self.w is None and self.net is None:
                out.append(np.zeros(len(ep)))
                continue
            phi = self._rows(ep)  # (T, D)
            if self.cfg.model == "linear":
                D = len(self.w)
                out.append(phi[:, :D] @ self.w)
            else:
                with torch.no_grad():
                    x = torch.as_tensor(phi, dtype=torch.float64, device="cpu")  # (T, D)
                    out.append(self.net(x).squeeze(-1).numpy())
        return out

    def progress(self, episodes) -> list[np.ndarray]:
        """Estimated progress after each turn, P_t = sum_{k <= t} c_k. (T_i,) each."""
        return [np.cumsum(c) for c in self.contributions(episodes)]


def spa_advantages(episodes, progress_model, cfg: SPAConfig | None = None) -> list[np.ndarray]:
    """SPA-RL turn advantages: A_t = sum_{k>=t} gamma^(k-t) (alpha c_k + beta g_k), whitened over
    the batch when cfg.norm_adv. (T_i,) per episode.

    progress_model: a fitted ``ProgressModel``, or any callable episodes -> contributions (e.g. the
    env's true progress increments, the oracle)."""
    cfg = cfg or SPAConfig()
    contrib = (progress_model.contributions(episodes) if hasattr(progress_model, "contributions")
               else progress_model(episodes))
    rewards = fused_rewards(contrib, grounding(episodes), cfg.alpha, cfg.beta)
    adv = [discounted_returns(torch.as_tensor(r, dtype=torch.float64, device="cpu"), cfg.gamma).numpy()
           for r in rewards]
    if cfg.norm_adv:
        flat = np.concatenate(adv) if adv else np.zeros(0)
        if len(flat) > 1:
            flat = whiten(torch.as_tensor(flat, device="cpu"), ddof=0, eps=1e-8).numpy()
            adv = np.split(flat, np.cumsum([len(a) for a in adv])[:-1])
    return adv


class SPACredit:
    """A ``credit_fn`` for ``agent_pg.train`` and ``grpo.train``: keeps the last
    ``cfg.buffer_size`` episodes, refits the progress model on them each call (online; the paper fits once on exploration
    data), then returns ``spa_advantages``. ``history`` records the fit MSE per call."""

    def __init__(self, model: ProgressModel, cfg: SPAConfig | None = None, refit: bool = True):
        self.model, self.cfg, self.refit = model, cfg or model.cfg, refit
        self.buffer: list = []
        self.history: list[dict] = []

    def __call__(self, episodes) -> list[np.ndarray]:
        if self.refit:
            self.buffer = (self.buffer + list(episodes))[-self.cfg.buffer_size:]
            self.history.append(self.model.fit(self.buffer))
        return spa_advantages(episodes, self.model, self.cfg)
