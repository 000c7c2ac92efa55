"""Stratified GRPO: advantages normalised within strata of structurally alike trajectories.

Zhu, Chen, Yu, Zhao, Jia (2025), "Stratified GRPO: Handling Structural Heterogeneity in
Reinforcement Learning of LLM Search Agents", arXiv:2510.06214.

A search agent's trajectories differ in structure (how many search calls, where, with what
result), and the structure shifts the reward distribution. GRPO compares every trajectory of a
prompt's group against one baseline, the group mean; the paper calls the error this makes
*cross-stratum bias*. Partition the group B (K trajectories of one prompt) into strata B_k (here:
by the number of search calls), with stratum means R_k and the group mean R:

    A_G(tau_i) = R_i - R                         (global, GRPO's centring)
    A_S(tau_i) = R_i - R_k,   tau_i in B_k       (stratified)
    A_G(tau_i) = A_S(tau_i) + (R_k - R)          (Proposition 1: the bias is the stratum offset)

and, by the law of total variance over the group (ddof = 0),

    Var[A_G] - Var[A_S] = (1/K) sum_k n_k (R_k - R)^2 >= 0     (Theorem 1: the between-stratum variance).

**SAN** (Stratified Advantage Normalisation) normalises inside each stratum,

    A_SAN(tau_i) = (R_i - mean(B_k)) / (std(B_k) + eps),

and, "for stability under finite samples", the paper blends it linearly with the global
(GRPO) normalisation A_GN = (R_i - mean(B)) / (std(B) + eps):

    A_blend = alpha * A_SAN + (1 - alpha) * A_GN.

``alpha = 1`` is pure SAN, ``alpha = 0`` is GRPO (``credit.grpo_broadcast`` exactly).

Conventions (this library's, ``credit.group_normalise``): std with ``ddof = 1``, ``eps = 1e-4``,
exactly 0 for a stratum (or group) of one member or of all-equal returns; ``norm_adv=False``
centres only. Inferred (not stated in what we read of the paper): the singleton-stratum rule (a
lone trajectory has no peers, so SAN gives it 0 and only the (1 - alpha) global part moves it) and
the returns being the undiscounted episode return, broadcast to every turn as GRPO does.

Functions:

- ``search_counts(episodes, tool)``: the number of calls of ``tool`` per episode (the turns whose
  ``info["tool"]`` is it), the strata of the paper's main setting.
- ``san_advantages(returns, group_ids, strata, alpha)``: the pure estimator on arrays, (B,) ->
  ((B,), metrics).
- ``stratified_advantages(episodes, strata, alpha)``: the same broadcast to every turn: the
  ``credit_fn`` of ``grpo.train`` and ``agent_pg.train``.
- ``cross_stratum_bias(returns, group_ids, strata)``: each trajectory's offset R_k - R, and the
  two sides of Theorem 1 summed over the groups.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from agentrl_lib.algorithms.credit import normalise_within


def search_counts(episodes, tool: str = "search") -> np.ndarray:
    """(B,) int: how many turns of each episode called ``tool`` (``info["tool"]``, as
    ``KGSearchEnv`` and ``KGMenuEnv`` report it; a malformed call has tool None and is not counted).

    >>> from agentrl_lib.rollout import Episode
    >>> ep = Episode.of(["a", "b", "c"], [0, 0, 1], infos=[{"tool": "search"}, {"tool": "open"},
    ...                                                     {"tool": "answer"}])
    >>> search_counts([ep]).tolist()
    [1]
    """
    return np.array([sum(1 for info in ep.infos if info.get("tool") == tool) for ep in episodes],
                    dtype=np.int64)


def _check(returns, group_ids, strata) -> tuple[np.ndarray, np.ndarray, list]:
    r = np.asarray(returns, dtype=np.float64)  # (B,)
    if r.ndim != 1:
        raise ValueError(f"returns must be one value per trajectory, (B,); got shape {r.shape}")
    g = np.asarray(group_ids)
    s = list(strata)
    if len(g) != len(r) or len(s) != len(r):
        raise ValueError(f"returns, group_ids and strata must have one entry per trajectory: got "
                         f"{len(r)}, {len(g)} and {len(s)}")
    if not np.all(np.isfinite(r)):
        raise ValueError("returns must be finite")
    return r, g, s


def san_advantages(returns, group_ids, strata, alpha: float = 1.0, norm_adv: bool = True,
                   ddof: int = 1, eps: float = 1e-4) -> tuple[np.ndarray, dict]:
    """A_blend = alpha * A_SAN + (1 - alpha) * A_GN for every trajectory, (B,).

    returns: (B,) episode returns R_i. group_ids: (B,) the prompt group of each (the paper's B(x),
    the K rollouts of one question). strata: (B,) any hashable stratum label (e.g. the number of
    search calls); strata are formed inside each group. alpha in [0, 1].

    metrics: ``singleton_share`` (trajectories alone in their stratum: SAN gives them 0),
    ``strata_per_group`` (mean number of strata in a group), ``mean_abs_bias`` (mean |R_k - R|
    over trajectories: the offset GRPO adds, unnormalised).

    >>> a, _ = san_advantages([1, 0, 1, 1], [0, 0, 0, 0], [0, 0, 1, 1], alpha=1.0)
    >>> a.round(3).tolist()  # stratum 0 = (1, 0): +-1/(0.7071 + eps); stratum 1 = (1, 1): all equal -> 0
    [0.707, -0.707, 0.0, 0.0]
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    r, g, s = _check(returns, group_ids, strata)
    groups, cells = defaultdict(list), defaultdict(list)
    for i in range(len(r)):
        groups[g[i]].append(i)
        cells[(g[i], s[i])].append(i)
    a_gn = normalise_within(r, groups.values(), norm_adv, ddof, eps)  # (B,)
    a_san = normalise_within(r, cells.values(), norm_adv, ddof, eps)  # (B,)
    bias, _ = cross_stratum_bias(r, g, s)
    metrics = {"singleton_share": float(np.mean([len(cells[(g[i], s[i])]) == 1 for i in range(len(r))]))
               if len(r) else 0.0,
               "strata_per_group": len(cells) / max(len(groups), 1),
               "mean_abs_bias": float(np.mean(np.abs(bias))) if len(r) else 0.0}
    return alpha * a_san + (1.0 - alpha) * a_gn, metrics


def stratified_advantages(episodes, strata=None, alpha: float = 1.0, norm_adv: bool = True,
                          ddof: int = 1, eps: float = 1e-4) -> list[np.ndarray]:
    """Stratified GRPO's per-turn advantages: ``san_advantages`` of the episode returns, groups by
    ``ep.group_id``, copied to every turn, (T_i,) each. ``strata`` defaults to the number of
    search calls (``search_counts``). With alpha = 0 this is ``credit.grpo_broadcast``."""
    strata = search_counts(episodes) if strata is None else strata
    adv, _ = san_advantages([ep.ret for ep in episodes], [ep.group_id for ep in episodes],
                            strata, alpha, norm_adv, ddof, eps)
    return [np.full(len(ep), a) for ep, a in zip(episodes, adv)]


def cross_stratum_bias(returns, group_ids, strata) -> tuple[np.ndarray, dict]:
    """Each trajectory's cross-stratum bias R_k - R (its stratum's mean minus its group's mean),
    (B,), so that R_i - R = (R_i - R_k) + bias_i (Proposition 1).

    metrics, summed over the groups then divided by the number of trajectories (ddof = 0, the
    population variances of Theorem 1): ``var_global`` = mean_i (R_i - R)^2, ``var_stratified`` =
    mean_i (R_i - R_k)^2, ``between`` = mean_i (R_k - R)^2 (equal to var_global - var_stratified),
    and ``bias_share`` = between / var_global (0 when var_global is 0): the share of GRPO's
    centred-return variance that is stratum offset rather than within-stratum signal.

    >>> b, m = cross_stratum_bias([1, 1, 0, 0], [0, 0, 0, 0], [2, 2, 0, 0])
    >>> b.tolist(), m["bias_share"]
    ([0.5, 0.5, -0.5, -0.5], 1.0)
    """
    r, g, s = _check(returns, group_ids, strata)
    bias = np.zeros(len(r))  # (B,)
    within = np.zeros(len(r))  # (B,) R_i - R_k
    centred = np.zeros(len(r))  # (B,) R_i - R
    groups, cells = defaultdict(list), defaultdict(list)
    for i in range(len(r)):
        groups[g[i]].append(i)
        cells[(g[i], s[i])].append(i)
    group_mean = {k: r[idx].mean() for k, idx in groups.items()}
    for (k, _), idx in cells.items():
        bias[idx] = r[idx].mean() - group_mean[k]
        within[idx] = r[idx] - r[idx].mean()
        centred[idx] = r[idx] - group_mean[k]
    n = max(len(r), 1)
    var_g, var_s, between = (float(np.sum(centred ** 2)) / n, float(np.sum(within ** 2)) / n,
                             float(np.sum(bias ** 2)) / n)
    return bias, {"var_global": var_g, "var_stratified": var_s, "between": between,
                  "bias_share": between / var_g if var_g > 0 else 0.0}
