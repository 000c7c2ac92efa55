"""HiPER's hierarchical advantage estimation and Hi-Agent's subgoal GRPO, against hand-computed
numbers and independent implementations; the chain variants of SubtaskGridEnv."""

import numpy as np
import pytest

from agentrl_lib.algorithms import credit, hiper
from agentrl_lib.envs.multiturn import SubtaskGridEnv
from agentrl_lib.rollout import Episode


def _batch():
    # two episodes of one group: 4 turns (terminated) and 3 turns (truncated)
    a = Episode.of([("x", 0), ("y", 0), ("z", 1), ("w", 1)], [0.0, 1.0, 0.0, 2.0], group_id=0)
    b = Episode.of([("x", 0), ("u", 1), ("v", 1)], [1.0, 0.0, 0.0], group_id=0, truncated=True)
    return [a, b]


def test_hae_hand_computed():
    a, b = _batch()
    va, vb = [1.0, 2.0, 0.5, 1.0], [1.0, 0.5, 0.25]
    seg = [np.array([0, 0, 1, 1]), np.array([0, 1, 1])]
    g = 0.5
    # episode a: delta = r + g V' - V with V after the terminal step 0
    # d0 = 0 + .5*2 - 1 = 0, d1 = 1 + .5*.5 - 2 = -0.75, d2 = 0 + .5*1 - .5 = 0, d3 = 2 - 1 = 1
    # lam = 1 executor: segment 0 = turns 0,1: A1 = -0.75, A0 = 0 + .5*(-0.75) = -0.375
    # segment 1 = turns 2,3: A3 = 1, A2 = 0 + .5*1 = 0.5
    # episode b (truncated, last value 2): d0 = 1 + .5*.5 - 1 = 0.25, d1 = 0 + .5*.25 - .5 = -0.375,
    # d2 = 0 + .5*2 - .25 = 0.75; segments [0], [1, 2]: A0 = .25, A2 = .75, A1 = -.375 + .5*.75 = 0
    adv = hiper.hiper_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g,
                                 lam=1.0)
    np.testing.assert_allclose(adv[0], [-0.375, -0.75, 0.5, 1.0])
    np.testing.assert_allclose(adv[1], [0.25, 0.0, 0.75])
    # executor lam = 0: each turn its own delta, except the planner turns (planner_lam = 1)
    adv0 = hiper.hiper_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g,
                                  lam=0.0, planner_lam=1.0)
    np.testing.assert_allclose(adv0[0], [-0.375, -0.75, 0.5, 1.0])
    np.testing.assert_allclose(adv0[1], [0.25, 0.0, 0.75])  # turn 1 opens segment 1: a planner turn
    adv00 = hiper.hiper_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g,
                                   lam=0.0, planner_lam=0.0)  # one-step TD errors everywhere
    np.testing.assert_allclose(adv00[0], [0.0, -0.75, 0.0, 1.0])
    np.testing.assert_allclose(adv00[1], [0.25, -0.375, 0.75])
    # planner advantages: the segment-start entries of the lam = 1 estimate
    pl = hiper.planner_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g)
    np.testing.assert_allclose(pl[0], [-0.375, 0.5])
    np.testing.assert_allclose(pl[1], [0.25, 0.0])


def _random_batch(rng, n=6, groups=2):
    eps = []
    for i in range(n):
        T = int(rng.integers(1, 9))
        keys = [(int(rng.integers(3)), int(s)) for s in np.sort(rng.integers(0, 3, T))]
        eps.append(Episode.of(keys, rng.normal(size=T).tolist(), group_id=i % groups,
                              truncated=bool(rng.integers(2))))
    return eps


def test_one_segment_is_flat_turn_gae():
    rng = np.random.default_rng(0)
    eps = _random_batch(rng)
    vals = [rng.normal(size=len(e)) for e in eps]
    last = rng.normal(size=len(eps))
    flat = [np.zeros(len(e), dtype=int) for e in eps]
    ours = hiper.hiper_advantages(eps, flat, vals, last, gamma=0.9, lam=0.7, planner_lam=0.7)
    ref = credit.turn_gae(eps, vals, gamma=0.9, lam=0.7, last_values=last)
    for x, y in zip(ours, ref):
        np.testing.assert_allclose(x, y, atol=1e-12)


def test_matches_double_sum():
    """An independent implementation: the sums of the module docstring, written out."""
    rng = np.random.default_rng(1)
    eps = _random_batch(rng, n=8)
    vals = [rng.normal(size=len(e)) for e in eps]
    last = rng.normal(size=len(eps))
    segs = hiper.stage_segments(eps)
    g, lam, plam = 0.9, 0.6, 1.0
    ours = hiper.hiper_advantages(eps, segs, vals, last, gamma=g, lam=lam, planner_lam=plam)
    for ep, v, seg, L, A in zip(eps, vals, segs, last, ours):
        T = len(ep)
        v_next = [v[t + 1] if t + 1 < T else (L if ep.truncated else 0.0) for t in range(T)]
        d = [ep.rewards[t] + g * v_next[t] - v[t] for t in range(T)]
        for t in range(T):
            e = t
            while e + 1 < T and seg[e + 1] == seg[t]:
                e += 1
            start = t == 0 or seg[t - 1] != seg[t]
            c = g * (plam if start else lam)
            want = sum(c ** (j - t) * d[j] for j in range(t, e + 1))
            assert A[t] == pytest.approx(want, abs=1e-12)


def test_segments():
    a, b = _batch()
    assert [s.tolist() for s in hiper.stage_segments([a, b])] == [[0, 0, 1, 1], [0, 1, 1]]
    assert [s.tolist() for s in hiper.fixed_segments([a, b], 3)] == [[0, 0, 0, 1], [0, 0, 0]]
    # a stage that returns to an earlier value still opens a new segment
    c = Episode.of([(0, 0), (0, 1), (0, 0)], [0, 0, 0])
    assert hiper.stage_segments([c])[0].tolist() == [0, 1, 2]
    assert hiper.segment_starts(np.array([0, 0, 1, 2, 2])).tolist() == [True, False, True, True, False]
    with pytest.raises(ValueError, match="stage"):
        hiper.stage_segments([Episode.of([3, 4], [0, 0])])  # int keys: no stage
    with pytest.raises(ValueError, match="length"):
        hiper.fixed_segments([a], 0)
    with pytest.raises(ValueError, match="never decrease"):
        hiper.hiper_advantages([a], [np.array([0, 1, 0, 1])], values=[np.zeros(4)])
    with pytest.raises(ValueError, match="shape"):
        hiper.hiper_advantages([a], [np.array([0, 0])], values=[np.zeros(4)])
    with pytest.raises(ValueError, match="values"):
        hiper.hiper_advantages([a], [np.zeros(4, dtype=int)], values=[np.zeros(3)])


def test_batch_values_and_defaults():
    a, b = _batch()
    # key ('x', 0) is visited by both at t=0; gamma = 0.5 returns-to-go:
    # a: [0 + .5*(1 + .5*(0 + .5*2)), ...] = [0.75, 1.5, 1.0, 2.0]; b: [1.0, 0.0, 0.0]
    v = hiper.batch_values([a, b], gamma=0.5)
    np.testing.assert_allclose(v[0], [0.875, 1.5, 1.0, 2.0])
    np.testing.assert_allclose(v[1], [0.875, 0.0, 0.0])
    # values=None uses them
    segs = hiper.stage_segments([a, b])
    x = hiper.hiper_advantages([a, b], segs, gamma=0.5)
    y = hiper.hiper_advantages([a, b], segs, values=v, gamma=0.5)
    for p, q in zip(x, y):
        np.testing.assert_allclose(p, q)


def test_length_one_and_norm():
    one = Episode.of([("s", 0)], [1.0], group_id=0)
    adv = hiper.hiper_advantages([one], [np.zeros(1, dtype=int)], values=[np.array([0.25])])
    np.testing.assert_allclose(adv[0], [0.75])  # r - V, terminal
    # norm_adv: a group with one turn is left as is
    adv_n = hiper.hiper_advantages([one], [np.zeros(1, dtype=int)], values=[np.array([0.25])],
                                   norm_adv=True)
    np.testing.assert_allclose(adv_n[0], [0.75])
    a, b = _batch()
    segs = hiper.stage_segments([a, b])
    vals = [np.zeros(4), np.zeros(3)]
    raw = hiper.hiper_advantages([a, b], segs, vals, gamma=0.5)
    nrm = hiper.hiper_advantages([a, b], segs, vals, gamma=0.5, norm_adv=True, ddof=1, eps=0.0)
    s = np.concatenate(raw).std(ddof=1)
    for p, q in zip(raw, nrm):
        np.testing.assert_allclose(q, p / s)


def test_hiagent_hand_computed():
    # three episodes of one group: the stage-1 segment starts at key ((0,0),1) for a and b
    a = Episode.of([((1, 1), 0), ((0, 0), 1), ((0, 1), 1)], [0.0, 0.0, 1.0],
                   infos=[{}, {}, {"success": True}])
    b = Episode.of([((1, 1), 0), ((0, 0), 1)], [0.0, 0.0], truncated=True)
    c = Episode.of([((1, 1), 0), ((1, 2), 0)], [0.0, 0.0], truncated=True)
    segs = hiper.stage_segments([a, b, c])
    assert [s.tolist() for s in segs] == [[0, 1, 1], [0, 1], [0, 0]]
    assert [x.tolist() for x in hiper.segment_success([a, b, c], segs)] == [[1, 1], [1, 0], [0]]
    adv = hiper.hiagent_advantages([a, b, c], segs, foresight=1.0, eps=0.0)
    # segment 0 scores (R + c): a 2, b 1, c 0 -> mean 1, std 1 -> [1, 0, -1]
    # segment 1 (a and b from ((0,0),1)): a 2, b 0 -> mean 1, std(ddof=1) = sqrt(2)
    r2 = 1 / np.sqrt(2)
    np.testing.assert_allclose(adv[0], [1.0, r2, r2])
    np.testing.assert_allclose(adv[1], [0.0, -r2])
    np.testing.assert_allclose(adv[2], [-1.0, -1.0])


def test_hiagent_reduces_to_grpo():
    rng = np.random.default_rng(2)
    eps = _random_batch(rng, n=8)
    for ep in eps:  # the members of a group start from one state, as play_episodes' groups do
        ep.state_keys[0] = ("start", ep.group_id)
    one = [np.zeros(len(e), dtype=int) for e in eps]
    ours = hiper.hiagent_advantages(eps, one, foresight=0.0, gamma=1.0)
    ref = credit.grpo_broadcast(eps)
    for x, y in zip(ours, ref):
        np.testing.assert_allclose(x, y, atol=1e-12)
    # a group of one episode gets zeros
    solo = hiper.hiagent_advantages(eps[:1], one[:1], foresight=1.0)
    assert np.all(solo[0] == 0)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_chain_variants(k):
    env = SubtaskGridEnv(f"chain{k}")
    assert env.num_stages == k and env.max_turns == 5 * k + 4
    for start in env.tasks:
        env.reset(task=start)
        n, done = 0, False
        while not done:
            _, r, done, info = env.step(env.expert_actions()[0])
            n += 1
        assert info["success"] and r == 1.0
        first = env.waypoints[0]
        assert n == abs(start[0] - first[0]) + abs(start[1] - first[1]) + 4 * (k - 1)
    panel, h = env.eval_panel(8)
    assert len(panel) == 8 and h != SubtaskGridEnv("keydoor").eval_panel(8)[1]
