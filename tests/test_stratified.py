"""Stratified GRPO: SAN, its blend with global normalisation, the cross-stratum bias and the
search-call strata, against hand-computed numbers and an independent implementation."""

import numpy as np
import pytest

from agentrl_lib.algorithms import stratified as st
from agentrl_lib.algorithms.credit import grpo_broadcast
from agentrl_lib.rollout import Episode

EPS = 1e-4


def ep(tools, R, group_id=0):
    """An episode whose turns call ``tools`` in order, return R on the last turn."""
    T = len(tools)
    return Episode.of([f"s{t}" for t in range(T)], [0.0] * (T - 1) + [R], group_id,
                      infos=[{"tool": x} for x in tools])


def test_search_counts():
    eps = [ep(["search", "open", "search", "open", "answer"], 1.0),
           ep(["answer"], 0.0), ep([None, "search", "answer"], 0.0)]
    assert st.search_counts(eps).tolist() == [2, 0, 1]
    assert st.search_counts(eps, tool="open").tolist() == [2, 0, 0]


def test_hand_computed_two_groups():
    # group 0: returns (1, 0, 0, 1, 0) with strata (2, 2, 0, 1, 1)
    #   global: mean 0.4, std(ddof 1) = sqrt(0.3) -> (0.6, -0.4, -0.4, 0.6, -0.4) / sqrt(0.3)
    #   strata: {1, 0} -> +-1/sqrt(0.5) = +-0.7071..; {0} alone -> 0; {1, 0} -> +-0.7071..
    # group 1: returns (1, 1) in one stratum -> all equal -> 0 everywhere
    r = [1, 0, 0, 1, 0, 1, 1]
    g = [0, 0, 0, 0, 0, 1, 1]
    s = [2, 2, 0, 1, 1, 3, 3]
    sd_g, sd_s = np.sqrt(0.3) + EPS, np.sqrt(0.5) + EPS
    a_gn = np.array([0.6, -0.4, -0.4, 0.6, -0.4, 0, 0]) / np.array([sd_g] * 5 + [1, 1])
    a_san = np.array([0.5, -0.5, 0, 0.5, -0.5, 0, 0]) / np.array([sd_s, sd_s, 1, sd_s, sd_s, 1, 1])
    for alpha in (0.0, 0.3, 1.0):
        a, m = st.san_advantages(r, g, s, alpha=alpha)
        assert np.allclose(a, alpha * a_san + (1 - alpha) * a_gn)
    assert m["singleton_share"] == pytest.approx(1 / 7)
    assert m["strata_per_group"] == pytest.approx(2.0)  # 4 (group, stratum) cells / 2 groups
    # bias: stratum means (0.5, 0, 0.5) against 0.4 -> (0.1, 0.1, -0.4, 0.1, 0.1), group 1 -> 0
    assert m["mean_abs_bias"] == pytest.approx(0.8 / 7)
    a, _ = st.san_advantages(r, g, s, alpha=1.0, norm_adv=False)
    assert np.allclose(a, [0.5, -0.5, 0, 0.5, -0.5, 0, 0])


def test_cross_stratum_bias_decomposition_and_theorem_1():
    rng = np.random.default_rng(0)
    r = rng.normal(size=40)
    g = np.repeat(np.arange(5), 8)
    s = rng.integers(0, 3, size=40)
    bias, m = st.cross_stratum_bias(r, g, s)
    a_g, _ = st.san_advantages(r, g, np.zeros(40), alpha=1.0, norm_adv=False)  # one stratum: global
    a_s, _ = st.san_advantages(r, g, s, alpha=1.0, norm_adv=False)
    # Proposition 1 (a singleton stratum's SAN is 0 = R_i - R_k, so it holds there too)
    assert np.allclose(a_g, a_s + bias)
    # Theorem 1, per group (population variances) then pooled
    assert m["var_global"] - m["var_stratified"] == pytest.approx(m["between"])
    lhs = sum(np.var(r[g == k]) * 8 for k in range(5)) / 40
    rhs = sum(np.sum(s_ == j) * (r[(g == k) & (s == j)].mean() - r[g == k].mean()) ** 2
              for k in range(5) for j in range(3) for s_ in [s[g == k]] if np.any((g == k) & (s == j))) / 40
    assert m["var_global"] == pytest.approx(lhs)
    assert m["between"] == pytest.approx(rhs)
    assert 0 < m["bias_share"] < 1
    # no bias with one stratum; all bias when the strata are the outcomes
    assert st.cross_stratum_bias(r, g, np.zeros(40))[1]["between"] == pytest.approx(0.0)
    _, m01 = st.cross_stratum_bias([0, 0, 1, 1], [0] * 4, [0, 0, 1, 1])
    assert m01["bias_share"] == pytest.approx(1.0) and m01["var_stratified"] == 0.0


def test_equals_an_independent_implementation_and_grpo_at_alpha_0():
    rng = np.random.default_rng(1)
    eps = []
    for gid in range(4):
        for _ in range(6):
            n_search = int(rng.integers(0, 3))
            tools = ["search", "open"] * n_search + ["answer"]
            eps.append(ep(tools, float(rng.integers(0, 2)) + 0.1 * n_search, gid))
    R = np.array([e.ret for e in eps])
    gid = np.array([e.group_id for e in eps])
    k = st.search_counts(eps)

    def norm(x):  # the reference: a 2-D mask written out, not group_normalise
        if len(x) < 2 or np.ptp(x) == 0:
            return np.zeros(len(x))
        return (x - x.mean()) / (x.std(ddof=1) + EPS)

    ref_gn, ref_san = np.zeros(len(R)), np.zeros(len(R))
    for gg in np.unique(gid):
        m = gid == gg
        ref_gn[m] = norm(R[m])
        for kk in np.unique(k[m]):
            mk = m & (k == kk)
            ref_san[mk] = norm(R[mk])
    for alpha in (0.0, 0.5, 0.8, 1.0):
        ours = st.stratified_advantages(eps, alpha=alpha)
        assert [len(a) for a in ours] == [len(e) for e in eps]
        want = alpha * ref_san + (1 - alpha) * ref_gn
        assert all(np.allclose(a, w) for a, w in zip(ours, want))
    grpo = grpo_broadcast(eps)
    assert all(np.allclose(a, b) for a, b in zip(st.stratified_advantages(eps, alpha=0.0), grpo))
    # explicit strata override the search counts: one stratum per group is GRPO at any alpha
    one = st.stratified_advantages(eps, strata=[0] * len(eps), alpha=0.7)
    assert all(np.allclose(a, b) for a, b in zip(one, grpo))


def test_san_invariant_to_a_per_stratum_affine_shift():
    # SAN sees only within-stratum differences: shifting and scaling one stratum's returns
    # (a positive affine map) leaves it unchanged up to eps; GRPO's advantages change
    r = np.array([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    s = np.array([0, 0, 0, 1, 1, 1])
    g = np.zeros(6)
    shifted = np.where(s == 1, 3.0 * r + 2.0, r)
    a1, _ = st.san_advantages(r, g, s, alpha=1.0, eps=0.0)
    a2, _ = st.san_advantages(shifted, g, s, alpha=1.0, eps=0.0)
    assert np.allclose(a1, a2)
    b1, _ = st.san_advantages(r, g, s, alpha=0.0)
    b2, _ = st.san_advantages(shifted, g, s, alpha=0.0)
    assert not np.allclose(b1, b2)


def test_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        st.san_advantages([1, 0], [0, 0], [0, 0], alpha=1.5)
    with pytest.raises(ValueError, match="one entry per trajectory"):
        st.san_advantages([1, 0], [0, 0], [0])
    with pytest.raises(ValueError, match="finite"):
        st.san_advantages([1, np.nan], [0, 0], [0, 0])
    with pytest.raises(ValueError, match=r"\(B,\)"):
        st.san_advantages([[1, 0]], [0], [0])
    a, m = st.san_advantages([], [], [])
    assert a.shape == (0,) and m["singleton_share"] == 0.0
