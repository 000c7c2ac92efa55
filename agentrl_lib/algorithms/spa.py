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

The released pipeline (github WangHanLinHenry/SPA-RL-Agent, commit ed20087; the notebook's main
arm) differs from that description in two places, and this module has both:
- ``prm/rl_data_org.py`` overwrites the estimator's per-turn values: every turn of sample i of a
  task gets R_i - mean_{j != i} R_j (the other samples of the same task), plus the grounding score
  0.5 when the next observation is not "Nothing happens" (the last turn: always 0.5):
  ``loo_contributions``, ``released_grounding``, ``step_scores``;
- ``ppo/step_ppotrainer.py`` (``StepPPOTrainer``, from yuyq18/StepTool) runs TRL's PPO on those
  fixed trajectories: per token -kl_coef * (log pi - log pi_ref), and at the last token of turn k
  + s_k * (T - k - 1) (``compute_rewards``: ``released_token_rewards``, per turn
  ``released_turn_rewards``); TRL's GAE over the tokens with a value head, whitened (``trl_gae``);
  the adaptive KL coefficient (``AdaptiveKLController``); ``ppo_train`` is that step on
  ``loop.run`` with pre-collected batches (``collect``, ``offline_sampler``) and
  ``ppo_lm.ppo_update``; ``ReleasedCredit`` is the same advantage on a table (a tabular critic
  in place of the value head). gamma 0.99 and kl_coef 0.3 are StepTool's
  ``config/llama3-1/StepTool_ppo.json`` (the path ``train_ppo.sh`` names; SPA's repository
  lacks it), lam 0.95 and the clip ranges TRL's defaults.

Taken from the paper / reference code for the estimator: the sum-of-turn-values MSE loss
(``prm/train_our_progress_model.py``: a linear head on the last token of each turn, summed over
turns, MSE against the final reward). Inferred: the estimator's form here (ridge regression on
one-hot or given features, or a small MLP). ``SPACredit`` and ``spa_advantages`` are our earlier,
online reading (refit on a replay buffer, return-to-go of alpha c + beta g with ``gamma``,
whitened), kept as a named variant: with an exact fit and gamma = 1, sum_{k>=t} c_k = R -
sum_{k<t} c_k, i.e. REINFORCE with the progress made so far as a baseline, but the grounding
term's return-to-go grows with the valid steps still to come and pays an agent for stalling.

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

from agentrl_lib import core
from agentrl_lib.algorithms import loop, ppo_lm
from agentrl_lib.core import discounted_returns, whiten
from agentrl_lib.models.policies import KeyRows
from agentrl_lib.rollout import (Episode, _contiguous, _packs, packed_sequence_logps,
                                 sequence_logps)
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
    grounding_value: float = 0.5
    """the released pipeline's grounding score of an executable turn (``prm/rl_data_org.py``)"""
    kl_target: float = 6.0
    """target of TRL's adaptive KL controller (StepTool's ``config/llama3-1/StepTool_ppo.json``)"""
    kl_horizon: int = 10000
    """horizon of TRL's adaptive KL controller (the same config)"""

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


# --- the released pipeline: prm/rl_data_org.py and ppo/step_ppotrainer.py ----------------------
def task_ids(episodes) -> list:
    """The id ``rl_data_org.py`` groups samples by (the task): each episode's ``task``."""
    return [ep.task for ep in episodes]


def loo_contributions(episodes, ids=None) -> list[np.ndarray]:
    """The c_t the released RL data carry (``prm/rl_data_org.py``): every turn of episode i gets
    R_i - mean_{j != i, id_j = id_i} R_j (R_i itself when no other episode has its id); the
    estimator's per-turn values are overwritten. ids: one hashable per episode (default the task).

    >>> [c.tolist() for c in loo_contributions([Episode.of("ab", [0, 1]), Episode.of("a", [0])],
    ...                                          ids=[0, 0])]
    [[1.0, 1.0], [-1.0]]
    """
    ids = task_ids(episodes) if ids is None else list(ids)
    R = outcomes(episodes)
    by_id: dict = {}
    for i, k in enumerate(ids):
        by_id.setdefault(k, []).append(i)
    out = []
    for i, (ep, k) in enumerate(zip(episodes, ids)):
        others = [R[j] for j in by_id[k] if j != i]
        c = R[i] - float(np.mean(others)) if others else R[i]
        out.append(np.full(len(ep), c, dtype=np.float64))
    return out


def released_grounding(episodes, value: float = 0.5) -> list[np.ndarray]:
    """``rl_data_org.py``'s grounding score: ``value`` at turn t < T-1 when the observation after
    a_t is not "Nothing happens" (here: a_t was executable), else 0; the last turn always ``value``.

    >>> released_grounding([Episode.of("abc", [0, 0, 1], valid=[False, True, False])])[0].tolist()
    [0.0, 0.5, 0.5]
    """
    out = []
    for ep in episodes:
        g = value * np.asarray(ep.valid, dtype=np.float64)
        if len(g):
            g[-1] = value
        out.append(g)
    return out


def step_scores(episodes, contributions=None, ids=None, grounding_value: float = 0.5):
    """The released step scores s_t = c_t + g_t, (T_i,) each: ``loo_contributions`` (or the given
    contributions, e.g. a fitted estimator's or the true progress) plus ``released_grounding``."""
    c = loo_contributions(episodes, ids) if contributions is None else contributions
    return [np.asarray(ci, dtype=np.float64) + gi
            for ci, gi in zip(c, released_grounding(episodes, grounding_value))]


def released_turn_rewards(scores) -> list[np.ndarray]:
    """What ``StepPPOTrainer.compute_rewards`` pays at the end of turn k: s_k * (T - k - 1)
    (the first turn's score counts T - 1 times, the last turn's 0 times). (T_i,) each.

    >>> released_turn_rewards([np.array([1.0, 2.0, 3.0])])[0].tolist()
    [2.0, 2.0, 0.0]
    """
    out = []
    for s in scores:
        s = np.asarray(s, dtype=np.float64)
        out.append(s * (len(s) - np.arange(len(s)) - 1))
    return out


def released_token_rewards(scores, loss_mask: torch.Tensor, kl: torch.Tensor | None = None,
                           kl_coef: float = 0.0) -> torch.Tensor:
    """``StepPPOTrainer.compute_rewards``, per row: r = -kl_coef * kl on every token, then walking
    back over the runs of 1s in the row's mask (one run per turn's action tokens), the last token
    of run k gets += score[k] * (len(score) - k - 1). loss_mask, kl: (B, T); scores: B sequences.
    Returns (B, T), zero off the mask (TRL's ``compute_advantages`` multiplies by the mask)."""
    m = loss_mask.to(torch.float64)  # (B, T)
    r = torch.zeros_like(m) if kl is None else -kl_coef * kl.to(torch.float64) * m
    for b, score in enumerate(scores):
        score = [float(x) for x in score]
        last_mask = m[b].clone()
        for k in reversed(range(len(score))):  # the released loop, index by index
            if len(last_mask.nonzero()) == 0:
                break
            last_1 = int(last_mask.nonzero()[-1])
            r[b, last_1] += score[k] * (len(score) - k - 1)
            last_mask = last_mask[:last_1 + 1]
            if len((last_mask == 0).nonzero()) == 0:
                break
            last_0 = int((last_mask == 0).nonzero()[-1])
            last_mask = last_mask[:last_0 + 1]
    return r


def trl_gae(r_t: torch.Tensor, v_t: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float,
            norm_adv: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's ``PPOTrainer.compute_advantages`` (the released trainer does not override it):
    values and rewards zeroed off the mask, then GAE over *every* position (the discount runs
    through observation tokens too), no bootstrap past the end:

    delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1},   G_t = A_t + V_t

    and A whitened over the mask (``masked_whiten``: unbiased variance, rsqrt(var + 1e-8)).
    r_t, v_t, mask: (B, T). Returns (advantages, returns), (B, T); advantages 0 off the mask."""
    m = mask.to(v_t.dtype)
    v = v_t * m
    zeros = torch.zeros_like(v)
    adv, _ = core.gae_advantages(r_t.to(v.dtype) * m, v, zeros, zeros[:, 0], gamma, lam)
    returns = adv + v
    adv = core.whiten(adv, m, ddof=1, eps=1e-8, eps_in_sqrt=True) if norm_adv else adv * m
    return adv, returns


class AdaptiveKLController:
    """TRL's adaptive KL coefficient (Ziegler et al. 2019): after each step,
    value *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon."""

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        self.value, self.target, self.horizon = init_kl_coef, target, horizon

    def update(self, current: float, n_steps: int) -> float:
        err = float(np.clip(current / self.target - 1, -0.2, 0.2))
        self.value *= 1 + err * n_steps / self.horizon
        return self.value


class ReleasedCredit:
    """The released pipeline's advantage on a table, a ``credit_fn`` for ``agent_pg.train`` (one
    action = one token): s_t = ``step_scores`` (leave-one-out outcome + grounding, or the given
    ``contributions``), the turn rewards s_t (T - t - 1) - kl_coef KL_t (``released_turn_rewards``;
    KL_t = log pi_old(a_t|s_t) - log pi_ref(a_t|s_t) from ``logp_fn``/``ref_logp_fn``, flat (N,)
    functions of the episodes; TRL's adaptive coefficient), ``trl_gae`` with a tabular critic
    V(state key) (the value head's stand-in; moved toward the GAE returns by ``critic_lr`` after
    each batch). The batch's groups share a task: the leave-one-out runs within the batch."""

    def __init__(self, cfg: SPAConfig | None = None, contributions=None, logp_fn=None,
                 ref_logp_fn=None, kl_coef: float = 0.3, gamma: float = 0.99, lam: float = 0.95,
                 critic_lr: float = 0.5, norm_adv: bool = True):
        self.cfg = cfg or SPAConfig()
        self.contributions, self.logp_fn, self.ref_logp_fn = contributions, logp_fn, ref_logp_fn
        self.kl = AdaptiveKLController(kl_coef, self.cfg.kl_target, self.cfg.kl_horizon)
        self.gamma, self.lam, self.critic_lr, self.norm_adv = gamma, lam, critic_lr, norm_adv
        self.critic: dict = {}
        self.metrics: dict = {}

    def __call__(self, episodes) -> list[np.ndarray]:
        c = None if self.contributions is None else self.contributions(episodes)
        scores = step_scores(episodes, c, grounding_value=self.cfg.grounding_value)
        lens = [len(ep) for ep in episodes]
        B, T = len(episodes), max(lens + [1])
        mask = torch.zeros(B, T, dtype=torch.float64, device="cpu")
        kl = torch.zeros(B, T, dtype=torch.float64, device="cpu")
        v = torch.zeros(B, T, dtype=torch.float64, device="cpu")
        flat_kl = None
        if self.logp_fn is not None and self.kl.value != 0.0:
            with torch.no_grad():
                flat_kl = (self.logp_fn(episodes) - self.ref_logp_fn(episodes)).to(torch.float64)
        at = 0
        for b, ep in enumerate(episodes):
            mask[b, :lens[b]] = 1.0
            v[b, :lens[b]] = torch.tensor([self.critic.get(k, 0.0) for k in ep.state_keys],
                                          dtype=torch.float64)
            if flat_kl is not None:
                kl[b, :lens[b]] = flat_kl[at:at + lens[b]]
            at += lens[b]
        r = -self.kl.value * kl * mask  # (B, T); a turn is one token: its score at that token
        for b, rb in enumerate(released_turn_rewards(scores)):
            r[b, :lens[b]] += torch.as_tensor(rb, dtype=torch.float64)
        adv, ret = trl_gae(r, v, mask, self.gamma, self.lam, self.norm_adv)  # (B, T) each
        for b, ep in enumerate(episodes):  # the critic's regression toward the GAE returns
            for t, k in enumerate(ep.state_keys):
                old = self.critic.get(k, 0.0)
                self.critic[k] = old + self.critic_lr * (float(ret[b, t]) - old)
        mean_kl = float((kl * mask).sum(-1).mean())
        self.metrics = {"kl": mean_kl, "kl_coef": self.kl.value,
                        "score_mean": float(np.mean(np.concatenate(scores)))}
        self.kl.update(mean_kl, B)
        return [adv[b, :lens[b]].numpy().copy() for b in range(B)]


def collect(sample, model, num_iters: int) -> list:
    """The released pipeline's exploration: ``num_iters`` batches from ``sample(model, it)`` (e.g.
    ``grpo.episode_sampler`` at the SFT base), drawn once; PPO then runs on them as they are."""
    return [sample(model, it) for it in range(num_iters)]


def offline_sampler(batches):
    """``sample(model, it)`` for ``loop.run`` that hands out the pre-collected batches in order
    (one pass, the released ``--epochs 1``): the policy never generates its training data."""
    def sample(model, it: int = 0):
        return batches[it % len(batches)]
    return sample


def episode_logps_values(model, critic, g, temperature: float = 1.0):
    """log pi, entropies and V(s_t) on the agent's tokens of a multi-turn ``Generation`` (B, T),
    zero elsewhere, with gradients: one packed pass of the shared trunk
    (``rollout.packed_sequence_logps`` with the value head) when the model allows it, else
    ``ppo_lm.logps_values`` (padded; a separate critic runs its own pass)."""
    args = (g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)
    if critic.shares_trunk_with(model) and _packs(model) and _contiguous(g.prompt_mask,
                                                                          g.completion_mask):
        return packed_sequence_logps(model, *args, temperature, g.loss_mask,
                                     value_head=critic.head)
    return ppo_lm.logps_values(model, critic, *args, temperature, g.loss_mask)


def ppo_train(model, sample, cfg, scores_fn, ref_model, spa_cfg: SPAConfig | None = None,
              evaluate=None, critic=None, initial_eval: dict | None = None, logger=None,
              on_step=None) -> list[dict]:
    """SPA-RL's RL step as released (``ppo/step_ppotrainer.py: StepPPOTrainer.step``) on the one
    loop: each update takes a batch of fixed multi-turn episodes from ``sample`` (usually
    ``offline_sampler``); the current policy's log-probs and values on them (the step's first
    forward pass, here shared with the first epoch's: the same parameters, so ratio 1) and the
    reference's; per-token rewards ``released_token_rewards(scores_fn(episodes), loss_mask, KL,
    kl_coef)``; ``trl_gae``; then ``cfg.num_epochs`` steps of ``ppo_lm.ppo_lm_losses`` (clipped
    policy and value losses, token means over the agent's tokens) on the whole batch (TRL's
    backward batch: ``num_minibatches`` must be 1). The KL coefficient adapts as TRL's
    (``AdaptiveKLController``, from ``cfg.beta``). cfg: a ``ppo_lm.PPOLMConfig``. The model stays
    in eval mode (no dropout), so the first pass is the old policy's. Returns the logged rows.

    KL on data from the reference: the batches come from pi_ref, so the mean of
    log pi - log pi_ref estimates -KL(pi_ref || pi) <= 0 (TRL warns when it goes negative); per
    token the penalty still pulls pi back toward the data's tokens."""
    if cfg.num_minibatches != 1:
        raise ValueError("ppo_train runs the released step on the whole batch: num_minibatches=1")
    spa_cfg = spa_cfg or SPAConfig()
    critic = critic if critic is not None else ppo_lm.make_value_model(model, cfg.critic)
    opt = ppo_lm.make_optimizer(model, critic, cfg)
    params = list(model.parameters()) + ppo_lm.critic_parameters(model, critic)
    groups = [params] if critic.shares_trunk_with(model) else \
        [list(model.parameters()), ppo_lm.critic_parameters(model, critic)]
    kl_ctl = AdaptiveKLController(cfg.beta, spa_cfg.kl_target, spa_cfg.kl_horizon)
    model.eval()
    critic.eval()

    def update(batch, it: int) -> dict:
        g = batch.seqs
        m = g.loss_mask  # (B, T) the agent's tokens: the released frag_mask
        with torch.no_grad():
            ref_logps, _ = sequence_logps(ref_model, g.prompt_ids, g.prompt_mask,
                                          g.completion_ids, g.completion_mask, cfg.temperature, m)
        scores = scores_fn(batch.episodes)
        sums: dict = {}
        for epoch in range(cfg.num_epochs):
            logps, ents, values = episode_logps_values(model, critic, g, cfg.temperature)
            if epoch == 0:  # the step's first forward pass: old log-probs, values, rewards
                old_logps, old_values = logps.detach(), values.detach()
                kl = (old_logps - ref_logps) * m  # (B, T) TRL's kl_penalty "kl"
                r = released_token_rewards(scores, m.cpu(), kl.cpu(), kl_ctl.value)
                adv, returns = trl_gae(r.to(old_values.device), old_values.double(), m,
                                       cfg.gamma, cfg.lam, cfg.norm_adv)
                adv, returns = adv.to(values.dtype), returns.to(values.dtype)
            loss, mt = ppo_lm.ppo_lm_losses(logps, old_logps, adv, values, old_values, returns,
                                            m, cfg)
            optimizer_step(opt, loss, cfg.max_grad_norm, groups)
            mt["loss"] = loss.item()
            for k, v in mt.items():
                sums[k] = sums.get(k, 0.0) + v / cfg.num_epochs
        mean_kl = kl.sum(-1).mean().item()
        row = {f"losses/{k}": v for k, v in sums.items()}
        row.update({"losses/entropy": core.masked_mean(ents.detach(), m).item(),
                    "losses/kl": mean_kl, "losses/kl_coef": kl_ctl.value,
                    "rollout/score_mean": float(np.mean(np.concatenate(scores)))})
        kl_ctl.update(mean_kl, len(scores))
        return row

    return loop.run(model, sample, update, cfg.num_iters, evaluate=evaluate,
                    eval_every=cfg.eval_every, initial_eval=initial_eval, logger=logger,
                    on_step=on_step, desc="spa_ppo")
