"""HGPO: Hierarchy-of-Groups Policy Optimization (He et al. 2026, "Hierarchy-of-Groups Policy
Optimization for Long-Horizon Agentic Tasks", ICLR 2026, arXiv:2602.22817).

A stepwise agent's prompt at turn t is the task and its last few steps. GiGPO's step groups hold
the turns of a group's episodes that act from the same *state*; their prompts may still differ
(context inconsistency), which biases the group baseline. HGPO puts each turn into a hierarchy of
nested groups by the k-step context operator C_k(h_t) = ((s_{t-k}, a_{t-k}), ..., s_t)
(``envs.memory_grid.context_key``), k = 0, ..., K:

    G_k(t) = {turns j of the same task group with C_k(h_j) = C_k(h_t)},
    G_0 ⊇ G_1 ⊇ ... ⊇ G_K,

G_0 being GiGPO's anchor-state group and G_K the turns with the same whole K-step memory. In each
group the step advantage is the return-to-go normalised in the group (GiGPO's A^S),

    A_k(t) = (G_t - mean_{G_k(t)} G) / (std_{G_k(t)} G + eps),

and the levels are aggregated with adaptive weights over the levels where the group has at least
two members (a singleton carries no relative signal):

    A^H_t = sum_k w_k(t) A_k(t),
    w_k(t) = (k + 1)^alpha [|G_k(t)| >= 2] / sum_j (j + 1)^alpha [|G_j(t)| >= 2],

so deeper (more consistent, lower-bias) groups get more weight while they exist, and a turn whose
deep groups are singletons falls back on the larger shallow groups (lower variance). The turn's
advantage is GiGPO's combination A_t = A^E + omega * A^H_t with the episode-level A^E.

Taken from the paper: the nested groups by C_k, an advantage per level, a weighted aggregate, no
extra model or rollout, built on GiGPO (gamma = 0.95, omega = 1). Inferred (written before the
released code, verl-agent ``recipe/hgpo``, was read; reproductions/fidelity/36_hgpo.md compares
it): the power weights (k + 1)^alpha renormalised over the non-singleton
levels, alpha = 1 by default; ``weighting='uniform'`` is alpha = 0, ``weighting='deepest'`` takes
only the deepest non-singleton level (a hard back-off). With norm_adv=False every level is
G_t - mean, so A^H_t = G_t - b_t with the weighted baseline b_t = sum_k w_k mean_{G_k(t)} G
(``hgpo_baselines``).

**The released estimator** (``released_step_advantages``, ``released_baselines``; verl-agent
``recipe/hgpo/core_hgpo.py``, read in its copy OliverLeeXZ/SERL @ 3c63ef3: ``hgpo_advantage_estimate``
and its inner ``aggregate_items``, called by ``compute_hgpo_outcome_advantage``) differs from the
above in four ways, and is the notebook's main arm:
- the key of level kappa (kappa = 0..min(K, t) past steps) is the last kappa + 1 *observations*
  only, no actions (``clusters[(k, tuple(traj_h[ti][si-k+1:si+1]))]``, k = kappa + 1), and a turn
  has no level deeper than its whole history (``k_upper = min(max_k, si + 1)``);
- the level weight is (kappa + 2)^alpha (the code's L = k + 1 with k observations);
- a level's item is dropped when its group is a singleton (``nL <= 1``) **or its advantage is
  exactly 0**, and the weights are renormalised over the items left: w / (sum w + eps);
- there is no episode term (``base_group=False`` in every script): A_t = A^H_t. Inside a group,
  ``mode='mean_std_norm'`` is (G - mean) / (std ddof 0 + 1e-6), ``'mean_norm'`` G - mean.

    A^H_t = sum_kappa (kappa+2)^alpha A_kappa(t) 1[item kept] / (sum_kappa (kappa+2)^alpha 1[item kept] + eps)

Arena (notebook 34): ``hgpo_advantages(episodes, gamma=0.95, depth=2)``; the history is read from
``ep.state_keys`` and ``ep.action_ids`` (or ``ep.actions`` when there are no action ids). On a
batch of a Markov policy (``KeyTablePolicy(key='state')``) the deeper levels only split the
anchor groups: a consistent context never helps there, so the arena measures the variance cost.

``WindowTablePolicy`` is the tabular stepwise agent pi(a | C_W(h_t)) that the notebook trains;
its exact values are ``envs.memory_grid.WindowOracle``'s.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from agentrl_lib.algorithms.credit import episode_advantages, episode_returns_to_go, \
    normalise_within
from agentrl_lib.envs.memory_grid import context_key
from agentrl_lib.models.policies import KeyTablePolicy

WEIGHTINGS = ("power", "uniform", "deepest")


def _actions_of(ep) -> list:
    return ep.action_ids if ep.action_ids is not None and None not in ep.action_ids else ep.actions


def history_groups(episodes, k: int | None) -> dict:
    """{(group_id, C_k(h_t)): [(episode index, turn), ...]}: level k of the hierarchy. k = 0 is
    ``credit.anchor_groups`` (the state key); k = None the whole history."""
    groups = defaultdict(list)
    for i, ep in enumerate(episodes):
        acts = _actions_of(ep)
        for t in range(len(ep)):
            groups[(ep.group_id, context_key(ep.state_keys, acts, t, k))].append((i, t))
    return dict(groups)


def level_stats(episodes, k: int | None, gamma: float = 0.95):
    """Per turn, the size and the mean return-to-go of its level-k group: two lists of (T_i,)."""
    rtg = episode_returns_to_go(episodes, gamma)
    size = [np.zeros(len(ep), dtype=int) for ep in episodes]
    mean = [np.zeros(len(ep)) for ep in episodes]
    for members in history_groups(episodes, k).values():
        m = float(np.mean([rtg[i][t] for i, t in members]))
        for i, t in members:
            size[i][t], mean[i][t] = len(members), m
    return size, mean


def level_advantages(episodes, k: int | None, gamma: float = 0.95, norm_adv: bool = True,
                     ddof: int = 1, eps: float = 1e-4) -> list[np.ndarray]:
    """A_k: each turn's discounted return-to-go normalised in its level-k group (0 in a group of
    one or of equal returns). k = 0 equals ``credit.step_advantages``."""
    return normalise_within(episode_returns_to_go(episodes, gamma),
                            history_groups(episodes, k).values(), norm_adv, ddof, eps)


def hierarchy_weights(sizes, weighting: str = "power", alpha: float = 1.0) -> np.ndarray:
    """w_k over the levels k = 0..K of one turn from its group sizes |G_k| (K + 1,): (k + 1)^alpha
    on the levels with |G_k| >= 2, normalised to sum 1; all zero when every level is a singleton.

    >>> hierarchy_weights([5, 3, 1]).tolist()  # level 2 is a singleton: weights 1 and 2 of 3
    [0.3333333333333333, 0.6666666666666666, 0.0]
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    sizes = np.asarray(sizes)
    ok = sizes >= 2  # (K+1,)
    if not ok.any():
        return np.zeros(len(sizes))
    if weighting == "deepest":
        w = np.zeros(len(sizes))
        w[np.flatnonzero(ok)[-1]] = 1.0
        return w
    a = 0.0 if weighting == "uniform" else alpha
    w = (np.arange(len(sizes)) + 1.0) ** a * ok
    return w / w.sum()


def _hierarchy(episodes, depth: int, gamma, weighting, alpha, norm_adv, ddof, eps):
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    levels = [level_advantages(episodes, k, gamma, norm_adv, ddof, eps) for k in range(depth + 1)]
    sizes = [level_stats(episodes, k, gamma)[0] for k in range(depth + 1)]
    weights = []
    for i, ep in enumerate(episodes):
        w = np.array([hierarchy_weights([sizes[k][i][t] for k in range(depth + 1)], weighting,
                                        alpha)
                      for t in range(len(ep))]).reshape(len(ep), depth + 1)  # (T, K+1)
        weights.append(w)
    return levels, weights


def hgpo_step_advantages(episodes, gamma: float = 0.95, depth: int = 2, weighting: str = "power",
                         alpha: float = 1.0, norm_adv: bool = True, ddof: int = 1,
                         eps: float = 1e-4) -> list[np.ndarray]:
    """A^H_t = sum_k w_k(t) A_k(t) over the levels k = 0..depth; (T_i,) per episode."""
    levels, weights = _hierarchy(episodes, depth, gamma, weighting, alpha, norm_adv, ddof, eps)
    return [(w * np.stack([lv[i] for lv in levels], -1)).sum(-1) if len(episodes[i])
            else np.zeros(0) for i, w in enumerate(weights)]


def hgpo_advantages(episodes, gamma: float = 0.95, depth: int = 2, weighting: str = "power",
                    alpha: float = 1.0, omega: float = 1.0, norm_adv: bool = True, ddof: int = 1,
                    eps: float = 1e-4) -> list[np.ndarray]:
    """HGPO: A_t = A^E + omega * A^H_t. The episode term is GiGPO's (the undiscounted return
    normalised in the task group); the hierarchy's step term uses the discounted return-to-go.
    With depth = 0 this is ``credit.gigpo_advantages``."""
    a_e = episode_advantages(episodes, 1.0, norm_adv, ddof, eps)
    a_h = hgpo_step_advantages(episodes, gamma, depth, weighting, alpha, norm_adv, ddof, eps)
    return [a + omega * h for a, h in zip(a_e, a_h)]


def hgpo_baselines(episodes, gamma: float = 0.95, depth: int = 2, weighting: str = "power",
                   alpha: float = 1.0, values=None) -> tuple[list, list | None]:
    """The baseline of the unnormalised hierarchy, b_t = sum_k w_k(t) mean_{G_k(t)} G (= G_t, no
    signal, where every level is a singleton), so A^H_t = G_t - b_t with norm_adv=False. With
    ``values`` (per turn, e.g. the exact V^pi(h_t), (T_i,) each) also its expectation given the
    members' histories, bbar_t = sum_k w_k(t) mean_{j in G_k(t)} V(h_j) (= V(h_t) with no signal):
    bbar_t - V(h_t) is the context-inconsistency bias of the baseline, b_t - bbar_t its noise.
    ``level_baselines`` is the same for one level alone."""
    rtg = episode_returns_to_go(episodes, gamma)
    stats = [level_stats(episodes, k, gamma) for k in range(depth + 1)]
    vmeans = None if values is None else [_group_means(episodes, k, values)
                                          for k in range(depth + 1)]
    b, bbar = [], [] if values is not None else None
    for i, ep in enumerate(episodes):
        bi = np.array(rtg[i], dtype=float)
        bbi = None if values is None else np.array(values[i], dtype=float)
        for t in range(len(ep)):
            w = hierarchy_weights([stats[k][0][i][t] for k in range(depth + 1)], weighting, alpha)
            if w.sum() > 0:
                bi[t] = sum(w[k] * stats[k][1][i][t] for k in range(depth + 1))
                if values is not None:
                    bbi[t] = sum(w[k] * vmeans[k][i][t] for k in range(depth + 1))
        b.append(bi)
        if values is not None:
            bbar.append(bbi)
    return b, bbar


def level_baselines(episodes, k: int | None, gamma: float = 0.95, values=None):
    """``hgpo_baselines`` of the level-k groups alone (k = 0: GiGPO's anchor state; k = None:
    the whole history): b_t = mean_{G_k(t)} G (G_t in a singleton), and bbar_t likewise of
    ``values``."""
    rtg = episode_returns_to_go(episodes, gamma)
    size, mean = level_stats(episodes, k, gamma)
    b = [np.where(s >= 2, m, g) for s, m, g in zip(size, mean, rtg)]
    if values is None:
        return b, None
    vm = _group_means(episodes, k, values)
    bbar = [np.where(s >= 2, m, np.asarray(v, float)) for s, m, v in zip(size, vm, values)]
    return b, bbar


def _group_means(episodes, k, values) -> list[np.ndarray]:
    out = [np.zeros(len(ep)) for ep in episodes]
    for members in history_groups(episodes, k).values():
        m = float(np.mean([values[i][t] for i, t in members]))
        for i, t in members:
            out[i][t] = m
    return out


def hierarchy_share(episodes, depth: int = 2) -> np.ndarray:
    """The fraction of the batch's turns in a group of two or more at each level k = 0..depth,
    (depth + 1,): how far down the hierarchy a relative signal exists."""
    turns = sum(len(ep) for ep in episodes)
    out = np.zeros(depth + 1)
    if turns == 0:
        return out
    for k in range(depth + 1):
        size, _ = level_stats(episodes, k)
        out[k] = sum(int((s >= 2).sum()) for s in size) / turns
    return out


class WindowTablePolicy(KeyTablePolicy):
    """pi(a | C_W(h_t)) = softmax(theta[C_W(h_t)]): a tabular stepwise agent whose prompt is the
    task and its last ``window`` steps (HGPO's memory agent). Plays
    ``envs.memory_grid.MemoryGridEnv`` (reads ``env.context(window)``); ``agent_pg.train`` trains
    it like any ``KeyTablePolicy``.
    init_scale > 0 draws the logits of every row N(0, init_scale^2) (a behaviour policy whose
    actions depend on the context); 0 starts uniform."""

    def __init__(self, num_actions: int, window: int = 1, capacity: int = 50_000, seed: int = 0,
                 init_scale: float = 0.0):
        super().__init__(num_actions, key="state", capacity=capacity, seed=seed)
        if window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        self.key, self.window = "window", int(window)
        if init_scale > 0:
            g = torch.Generator().manual_seed(int(seed))
            with torch.no_grad():
                self.logits.normal_(0.0, float(init_scale), generator=g)

    def keys_of(self, ep) -> list:
        acts = _actions_of(ep)
        return [context_key(ep.state_keys, acts, t, self.window) for t in range(len(ep))]

    @torch.no_grad()
    def act(self, envs, observations) -> list[int]:
        p = self.probs([e.context(self.window) for e in envs]).numpy()  # (N, A)
        return [int(self.rng.choice(p.shape[1], p=pi / pi.sum())) for pi in p]

    def probs_fn(self, greedy: bool = False):
        """A frozen numpy view for ``WindowOracle``: context -> (A,) probabilities (one-hot on the
        first argmax when greedy). Rows of unseen contexts are assigned as they are asked for."""
        logits = self.logits.detach().numpy().copy()  # (capacity, A)

        def fn(ctx):
            z = logits[self.row(ctx)]
            if greedy:
                out = np.zeros_like(z)
                out[int(np.argmax(z))] = 1.0
                return out
            e = np.exp(z - z.max())
            return e / e.sum()
        return fn


# --- the released estimator (verl-agent recipe/hgpo/core_hgpo.py: hgpo_advantage_estimate) ------
RELEASED_MODES = ("mean_std_norm", "mean_norm")


def obs_context_key(state_keys, t: int, kappa: int) -> tuple:
    """The code's level-kappa key: the last kappa + 1 observations up to turn t (no actions),
    kappa <= t. ``traj_h[ti][si - k + 1 : si + 1]`` with k = kappa + 1.

    >>> obs_context_key(["a", "b", "c"], 2, 1)
    ('b', 'c')
    """
    if not 0 <= kappa <= t:
        raise ValueError(f"level {kappa} does not exist at turn {t} (0 <= kappa <= t)")
    return tuple(state_keys[t - kappa:t + 1])


def released_items(episodes, gamma: float = 0.95, history_length: int = 2,
                   mode: str = "mean_std_norm", eps: float = 1e-6) -> list[list[list]]:
    """Per episode, per turn, the list of (kappa, A_kappa, group mean of G, member turns): one
    item per level whose group has two or more members (before the zero filter)."""
    if mode not in RELEASED_MODES:
        raise ValueError(f"mode must be one of {RELEASED_MODES}, got {mode!r}")
    rtg = episode_returns_to_go(episodes, gamma)
    clusters = defaultdict(list)
    for i, ep in enumerate(episodes):
        for t in range(len(ep)):
            for kappa in range(min(history_length, t) + 1):
                key = obs_context_key(ep.state_keys, t, kappa)
                clusters[(ep.group_id, kappa, key)].append((i, t))
    items = [[[] for _ in range(len(ep))] for ep in episodes]
    for (_, kappa, _), members in clusters.items():
        if len(members) <= 1:
            continue
        r = np.array([rtg[i][t] for i, t in members])  # (n,)
        a = r - r.mean()
        if mode == "mean_std_norm":
            a = a / (r.std(ddof=0) + eps)
        for (i, t), a_j in zip(members, a):
            items[i][t].append((kappa, float(a_j), float(r.mean()), members))
    return items


def released_weights(kappas, advantages, alpha: float = 1.0, eps: float = 1e-6) -> np.ndarray:
    """``aggregate_items``' weights over one turn's items: (kappa + 2)^alpha on the items whose
    advantage is not exactly 0, over their sum + eps; all zero when none is left.

    >>> released_weights([0, 1, 2], [0.5, 0.0, -1.0], eps=0.0).tolist()  # 2 and 4, of 6
    [0.3333333333333333, 0.0, 0.6666666666666666]
    """
    adv = np.asarray(advantages, dtype=float)
    w = (np.asarray(kappas, dtype=float) + 2.0) ** alpha * (adv != 0)
    return w / (w.sum() + eps) if w.any() else np.zeros(len(adv))


def released_step_advantages(episodes, gamma: float = 0.95, history_length: int = 2,
                             alpha: float = 1.0, mode: str = "mean_std_norm",
                             eps: float = 1e-6) -> list[np.ndarray]:
    """The released HGPO advantage A_t = A^H_t (no episode term), (T_i,) per episode."""
    out = [np.zeros(len(ep)) for ep in episodes]
    for i, per_turn in enumerate(released_items(episodes, gamma, history_length, mode, eps)):
        for t, its in enumerate(per_turn):
            if its:
                adv = [a for _, a, _, _ in its]
                out[i][t] = float(released_weights([k for k, *_ in its], adv, alpha, eps) @ adv)
    return out


def released_baselines(episodes, gamma: float = 0.95, history_length: int = 2,
                       alpha: float = 1.0, values=None, eps: float = 1e-6):
    """``hgpo_baselines`` of the released estimator with ``mode='mean_norm'``: A^H_t = G_t - b_t,
    so b_t = (1 - sum w) G_t + sum_kappa w_kappa mean_{G_kappa(t)} G (= G_t where no item is
    kept), and with ``values`` bbar_t, the same with the members' values in place of G."""
    rtg = episode_returns_to_go(episodes, gamma)
    items = released_items(episodes, gamma, history_length, "mean_norm", eps)
    b, bbar = [], [] if values is not None else None
    for i, ep in enumerate(episodes):
        bi = np.array(rtg[i], dtype=float)
        bbi = None if values is None else np.array(values[i], dtype=float)
        for t, its in enumerate(items[i]):
            if not its:
                continue
            w = released_weights([k for k, *_ in its], [a for _, a, _, _ in its], alpha, eps)
            bi[t] = (1 - w.sum()) * bi[t] + sum(wk * m for wk, (_, _, m, _) in zip(w, its))
            if values is not None:
                vm = [np.mean([values[j][u] for j, u in mem]) for *_, mem in its]
                bbi[t] = (1 - w.sum()) * bbi[t] + float(w @ np.array(vm))
        b.append(bi)
        if values is not None:
            bbar.append(bbi)
    return b, bbar
