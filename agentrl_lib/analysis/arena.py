"""Scoring turn-level advantage estimators against the exact advantage (the credit arena).

In a tabular environment the exact advantage A^pi(s_t, a_t) of every turn of a sampled episode
is known, so an estimator's per-turn output can be scored directly:

- ``pearson`` / ``spearman``: does the estimate rank turns like the exact advantage does?
  Both are invariant to a positive affine map, so they are fair across estimators whose scales
  differ (GRPO divides by the group std, REINFORCE does not).
- ``sign_agreement``: on turns with |A| > tol, the fraction where sign(estimate) = sign(A); the
  direction a policy-gradient step pushes each taken action. An estimate of exactly 0 counts as
  a miss (it pushes nowhere).
- ``affine_mse``: the error left after the best affine fit a * est + b ~ A within the batch,
  var(A) (1 - r^2). Optimistic: it rescales every batch with the ground truth.
- ``global_scale`` / ``scaled_mse``: one scale c per estimator, fitted by least squares on all
  batches pooled (no intercept), then mean (c est - A)^2. The fair error: a global scale is what a
  learning rate can absorb; per-batch scale noise and offsets still count as error.

Across repeated batches at a fixed budget, the policy gradient each batch implies is compared
with the exact one (tabular softmax policy, so grad_theta(s) log pi(a|s) = onehot(a) - pi(s)):

- ``pg_direction``: g = (1/num_episodes) sum_i sum_t A_it (onehot(a_it) - pi(s_it)).
- ``exact_pg_direction``: E[g] with the exact A_t, sum_t sum_s d_t(s) pi(b|s) A_t(s, b), with
  d_t the probability of being alive in s at turn t.
- ``relative_variance``: tr Cov(g) / ||E g||^2 over batches (scale-free: noise per unit signal),
  and ``cosine`` for the bias of E g (or of each batch's g) against the exact direction.

The exact targets (``finite_horizon_advantages``: A^pi_t(s, a) of a stationary policy when the
episode is cut after ``horizon`` turns; ``alive_distribution``; ``exact_pg_direction``) are exact
dynamic programming and live in ``agentrl_lib.algorithms.dp``. ``mc_critic`` is the tabular
Monte-Carlo critic fitted on one batch (mean return-to-go per key). All functions are pure
(numpy/torch in, numbers out), except ``lm_action_probs``, which reads a language-model agent's
policy: the probability of each action text (and its end-of-turn token) after a context,
renormalised over the legal actions, so an LM agent's exact A^pi can be computed in a tabular form.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from agentrl_lib.algorithms.credit import episode_returns_to_go
from agentrl_lib.rollout import action_logps


def flat(turn_values) -> np.ndarray:
    """Concatenate per-episode arrays [(T_i,)] into one (N,) float64 array."""
    arrs = [np.asarray(v, dtype=np.float64).reshape(-1) for v in turn_values]
    return np.concatenate(arrs) if arrs else np.zeros(0)


def turn_lookup(episodes, lookup) -> list[np.ndarray]:
    """[(T_i,)] of lookup(ep, t) for every turn: e.g. the exact A(s_t, a_t) of each turn."""
    return [np.array([float(lookup(ep, t)) for t in range(len(ep))]) for ep in episodes]


def pearson(x, y) -> float:
    """Pearson correlation cov(x, y) / (std x std y); nan when either is constant or N < 2.

    >>> round(pearson([1, 2, 3], [2, 4, 7]), 4)
    0.9934
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2:
        return float("nan")
    xc, yc = x - x.mean(), y - y.mean()
    den = np.sqrt((xc * xc).sum() * (yc * yc).sum())
    return float((xc * yc).sum() / den) if den > 1e-12 else float("nan")


def ranks(x) -> np.ndarray:
    """Ranks 0..N-1 with ties given their average rank. (N,) -> (N,)

    >>> ranks([10, 30, 20, 20]).tolist()
    [0.0, 3.0, 1.5, 1.5]
    """
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x), dtype=np.float64)
    for v in np.unique(x):
        tied = x == v
        if tied.sum() > 1:
            r[tied] = r[tied].mean()
    return r


def spearman(x, y) -> float:
    """Spearman rank correlation: Pearson of the (tie-averaged) ranks."""
    return pearson(ranks(x), ranks(y))


def sign_agreement(est, exact, tol: float = 1e-3) -> float:
    """Fraction of turns with |exact| > tol where sign(est) == sign(exact); est == 0 is a miss.
    nan when no turn has |exact| > tol.

    >>> sign_agreement([1.0, -2.0, 0.0, 5.0], [0.5, 0.1, -0.3, 0.0])
    0.3333333333333333
    """
    est, exact = np.asarray(est, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    m = np.abs(exact) > tol
    if not m.any():
        return float("nan")
    return float(np.mean(np.sign(est[m]) == np.sign(exact[m])))


def affine_mse(est, exact) -> float:
    """min_{a, b} mean (a est + b - exact)^2 = var(exact) (1 - r^2) (ddof 0); var(exact) when est
    is constant."""
    est, exact = np.asarray(est, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    if len(est) == 0:
        return float("nan")
    ec, xc = est - est.mean(), exact - exact.mean()
    see = (ec * ec).sum()
    if see < 1e-12:
        return float((xc * xc).mean())
    a = (ec * xc).sum() / see
    return float(((a * ec - xc) ** 2).mean())


def global_scale(ests, exacts) -> float:
    """c = argmin_c sum (c est - exact)^2 = sum est exact / sum est^2, over all batches pooled
    (lists of (N_b,) arrays or single arrays); 0 when every estimate is 0."""
    e = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in _as_list(ests)])
    x = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in _as_list(exacts)])
    see = (e * e).sum()
    return float((e * x).sum() / see) if see > 1e-12 else 0.0


def _as_list(v):
    return v if isinstance(v, (list, tuple)) else [v]


def scaled_mse(est, exact, c: float) -> float:
    """mean (c est - exact)^2 for a scale c fitted once per estimator (``global_scale``)."""
    est, exact = np.asarray(est, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    return float(((c * est - exact) ** 2).mean()) if len(est) else float("nan")


def score(est, exact, tol: float = 1e-3) -> dict:
    """Per-batch scores of flat estimates (N,) against flat exact advantages (N,)."""
    return {"pearson": pearson(est, exact), "spearman": spearman(est, exact),
            "sign": sign_agreement(est, exact, tol), "affine_mse": affine_mse(est, exact)}


def mc_critic(episodes, gamma: float) -> dict:
    """Tabular Monte-Carlo critic of one batch: V(k) = mean of G_t over the turns taken in key k
    (every visit)."""
    sums, counts = defaultdict(float), defaultdict(int)
    for ep, rtg in zip(episodes, episode_returns_to_go(episodes, gamma)):
        for k, g in zip(ep.state_keys, rtg):
            sums[k] += g
            counts[k] += 1
    return {k: sums[k] / counts[k] for k in sums}


def pg_direction(rows, actions, adv, probs, num_rows: int, num_episodes: int) -> np.ndarray:
    """g = (1/num_episodes) sum_n adv_n (onehot(a_n) - probs[rows_n]): the tabular softmax policy
    gradient one batch implies. rows, actions, adv: (N,); probs: (num_rows, A). -> (num_rows, A)"""
    rows, actions = np.asarray(rows, dtype=np.int64), np.asarray(actions, dtype=np.int64)
    adv = np.asarray(adv, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    g = np.zeros((num_rows, probs.shape[1]))
    np.add.at(g, (rows, actions), adv)
    np.add.at(g, rows, -adv[:, None] * probs[rows])
    return g / max(num_episodes, 1)


def cosine(a, b) -> float:
    """<a, b> / (|a| |b|) of flattened arrays; nan if either is zero."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / den) if den > 1e-12 else float("nan")


def relative_variance(grads) -> float:
    """tr Cov(g) / ||mean g||^2 over repeated batches; grads (num_batches, D). Invariant to a
    global scale of the estimator: noise per unit of signal (ddof 1)."""
    g = np.asarray(grads, dtype=np.float64).reshape(len(grads), -1)  # (R, D)
    mean = g.mean(0)
    tr = float(g.var(0, ddof=1).sum()) if len(g) > 1 else float("nan")
    den = float(mean @ mean)
    return tr / den if den > 1e-12 else float("inf")


def lm_action_probs(model, tokenizer, contexts: list[list[int]], actions: list[str],
                    batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """A language-model agent's policy over a fixed action set. For each context (token ids ending
    where the agent's answer starts, e.g. ``rollout.prompt_text`` of an observation, or an
    ``lm_rollout`` conversation up to turn t), p(a) = the model's probability of ``a``'s tokens
    followed by the end-of-turn token (temperature 1; ``rollout.action_logps``).

    Returns (probs (N, A): p renormalised over ``actions``; mass (N,): sum_a p(a), the probability
    that a free sample is exactly one of the legal texts). float64 numpy on the host.
    """
    logp = action_logps(model, tokenizer, contexts, actions, batch_size).numpy()  # (N, A)
    p = np.exp(logp)
    mass = p.sum(-1)
    return p / mass[:, None], mass
