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
    one = hiper.ONE_SEGMENT_PLANNER  # lam_seg = 0: each planner turn its own segment's TD error
    adv = hiper.hiper_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g,
                                 lam=1.0, **one)
    np.testing.assert_allclose(adv[0], [-0.375, -0.75, 0.5, 1.0])
    np.testing.assert_allclose(adv[1], [0.25, 0.0, 0.75])
    # the released planner (lam_seg = 0.95): A^H_k = delta^H_k + gamma^{d_k} lam_seg A^H_{k+1}
    # a: A^H_1 = 0.5, A^H_0 = -0.375 + 0.5**2 * 0.95 * 0.5 = -0.25625 (d_0 = 2 turns)
    # b: A^H_1 = 0.0, A^H_0 = 0.25 + 0.5 * 0.95 * 0.0 = 0.25; executor turns unchanged
    rel = hiper.hiper_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g,
                                 lam=1.0)
    np.testing.assert_allclose(rel[0], [-0.25625, -0.75, 0.5, 1.0])
    np.testing.assert_allclose(rel[1], [0.25, 0.0, 0.75])
    # executor lam = 0: each turn its own delta, except the planner turns (planner_lam = 1)
    adv0 = hiper.hiper_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g,
                                  lam=0.0, planner_lam=1.0, **one)
    np.testing.assert_allclose(adv0[0], [-0.375, -0.75, 0.5, 1.0])
    np.testing.assert_allclose(adv0[1], [0.25, 0.0, 0.75])  # turn 1 opens segment 1: a planner turn
    adv00 = hiper.hiper_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g,
                                   lam=0.0, planner_lam=0.0, **one)  # one-step TD errors everywhere
    np.testing.assert_allclose(adv00[0], [0.0, -0.75, 0.0, 1.0])
    np.testing.assert_allclose(adv00[1], [0.25, -0.375, 0.75])
    # planner_lam = 0 with lam_seg 0.95: b's A^H_0 = 0.25 + 0.5 * 0.95 * (-0.375) = 0.071875
    adv01 = hiper.hiper_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g,
                                   lam=0.0, planner_lam=0.0)
    np.testing.assert_allclose(adv01[1], [0.071875, -0.375, 0.75])
    # planner advantages: the segment-start entries
    pl = hiper.planner_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g)
    np.testing.assert_allclose(pl[0], [-0.25625, 0.5])
    np.testing.assert_allclose(pl[1], [0.25, 0.0])
    pl0 = hiper.planner_advantages([a, b], seg, values=[va, vb], last_values=[0.0, 2.0], gamma=g,
                                   **one)
    np.testing.assert_allclose(pl0[0], [-0.375, 0.5])


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
    ours = hiper.hiper_advantages(eps, segs, vals, last, gamma=g, lam=lam, planner_lam=plam,
                                  lam_seg=0.0)
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


def _released_hae(batch, gamma, lam_turn, lam_seg, norm_adv):
    """A transcription of ``hiper_hae/core_hae.py: compute_hae_advantage`` (JonP07/HiPER-agent @
    9d3c118) with one value head (``v_high = v_low``, its single-head fallback), no shaping,
    ``bootstrap_truncated=False``, one row per turn: ``batch`` is a list of (traj_uid, turn_idx,
    reward, done, switch, value). Returns (adv_low_step, adv_high_seg, boundary) per row, as torch
    after its norm_adv step."""
    import torch
    N = len(batch)
    traj_uid = [x[0] for x in batch]
    turn_idx = np.array([x[1] for x in batch])
    r = torch.tensor([x[2] for x in batch], dtype=torch.float64)
    dones = np.array([x[3] for x in batch])
    switch = np.array([x[4] for x in batch])
    v_low = torch.tensor([x[5] for x in batch], dtype=torch.float64)
    v_high = v_low
    zero = torch.tensor(0.0, dtype=torch.float64)
    groups = {}
    for i, tid in enumerate(traj_uid):
        groups.setdefault(tid, []).append(i)
    traj_segments = {}
    for tid, idxs in groups.items():
        idxs = sorted(idxs, key=lambda i: turn_idx[i])
        T = len(idxs)
        boundary_pos = sorted({0} | {p for p in range(1, T) if bool(switch[idxs[p]])})
        segs = []
        for k, s_pos in enumerate(boundary_pos):
            e_pos = (boundary_pos[k + 1] - 1) if (k + 1 < len(boundary_pos)) else (T - 1)
            nxt = boundary_pos[k + 1] if (k + 1 < len(boundary_pos)) else None
            segs.append((s_pos, e_pos, nxt))
        traj_segments[tid] = segs
    adv_low_step = torch.zeros(N, dtype=torch.float64)
    for tid, idxs in groups.items():  # 1) low-level GAE within each segment
        idxs = sorted(idxs, key=lambda i: turn_idx[i])
        for (s_pos, e_pos, nxt_pos) in traj_segments[tid]:
            next_adv = zero
            boot_high = v_high[idxs[nxt_pos]] if nxt_pos is not None else None
            for pos in range(e_pos, s_pos - 1, -1):
                i = idxs[pos]
                not_done = 0.0 if bool(dones[i]) else 1.0
                if pos < e_pos:
                    v_next = v_low[idxs[pos + 1]]
                else:
                    v_next = boot_high if (not_done > 0 and boot_high is not None) else zero
                delta = r[i] + gamma * not_done * v_next - v_low[i]
                adv_i = delta + gamma * lam_turn * not_done * next_adv
                adv_low_step[i] = adv_i
                next_adv = adv_i
    adv_high_seg = torch.zeros(N, dtype=torch.float64)
    for tid, idxs in groups.items():  # 2) high-level (segment) GAE across boundaries
        idxs = sorted(idxs, key=lambda i: turn_idx[i])
        segs = traj_segments[tid]
        next_seg_adv = zero
        for k in range(len(segs) - 1, -1, -1):
            s_pos, e_pos, nxt_pos = segs[k]
            start_i, end_i = idxs[s_pos], idxs[e_pos]
            seg_return, disc = torch.tensor(0.0, dtype=torch.float64), 1.0
            for pos in range(s_pos, e_pos + 1):
                seg_return = seg_return + disc * r[idxs[pos]]
                disc *= gamma
            d_k = e_pos - s_pos + 1
            not_done_end = 0.0 if bool(dones[end_i]) else 1.0
            boot_v = v_high[idxs[nxt_pos]] if (not_done_end > 0 and nxt_pos is not None) else zero
            target = seg_return + (gamma ** d_k) * not_done_end * boot_v
            delta_k = target - v_high[start_i]
            seg_adv_k = delta_k + (gamma ** d_k) * lam_seg * not_done_end * next_seg_adv
            adv_high_seg[start_i] = seg_adv_k
            next_seg_adv = seg_adv_k
    boundary = torch.zeros(N, dtype=torch.bool)  # 4) boundary turns
    for tid, idxs in groups.items():
        idxs = sorted(idxs, key=lambda i: turn_idx[i])
        boundary[idxs[0]] = True
        for j in range(1, len(idxs)):
            boundary[idxs[j]] |= bool(switch[idxs[j]])
    if norm_adv:  # every turn has action tokens; every boundary turn has subgoal tokens
        adv_low_step = (adv_low_step - adv_low_step.mean()) / (adv_low_step.std(unbiased=False)
                                                               + 1e-8)
        hi = adv_high_seg[boundary]
        adv_high_seg = (adv_high_seg - hi.mean()) / (hi.std(unbiased=False) + 1e-8)
    return adv_low_step.numpy(), adv_high_seg.numpy(), boundary.numpy()


@pytest.mark.parametrize("norm_adv", [False, True])
def test_matches_released_compute_hae_advantage(norm_adv):
    """hiper_advantages against the released formula (segment-level GAE with lam_seg, the
    per-level standardisation), on a shuffled batch of terminated and truncated episodes."""
    rng = np.random.default_rng(3)
    eps = _random_batch(rng, n=7)
    vals = [rng.normal(size=len(e)) for e in eps]
    segs = hiper.stage_segments(eps)
    g, lam, lam_seg = 0.9, 0.7, 0.95
    rows = []
    for i, (ep, v, seg) in enumerate(zip(eps, vals, segs)):
        st = hiper.segment_starts(seg)
        for t in range(len(ep)):
            done = t == len(ep) - 1 and not ep.truncated
            rows.append((f"traj{i}", t, ep.rewards[t], done, bool(st[t] and t > 0), v[t]))
    order = rng.permutation(len(rows))  # the released code sorts each trajectory by turn_idx
    low, high, bnd = _released_hae([rows[j] for j in order], g, lam, lam_seg, norm_adv)
    ref = np.zeros(len(rows))
    ref[order] = np.where(bnd, high, low)  # A^H on the boundary turns, A^L on the others
    ours = hiper.hiper_advantages(eps, segs, vals, gamma=g, lam=lam, planner_lam=1.0,
                                  lam_seg=lam_seg, norm_adv=norm_adv)
    np.testing.assert_allclose(np.concatenate(ours), ref, atol=1e-10)
    if not norm_adv:  # planner_advantages: the boundary rows
        pl = hiper.planner_advantages(eps, segs, vals, gamma=g, lam_seg=lam_seg)
        starts = np.concatenate([hiper.segment_starts(s) for s in segs])
        np.testing.assert_allclose(np.concatenate(pl), ref[starts], atol=1e-10)


def test_norm_hand_computed():
    """The released standardisation on the hand batch (gamma 0.5, lam 1, lam_seg 0.95):
    A^L = a (-0.375, -0.75, 0.5, 1), b (0.25, 0, 0.75) over all 7 turns; A^H = (-0.25625, 0.5,
    0.25, 0) over the 4 segment starts; each (x - mean) / std(ddof=0)."""
    a, b = _batch()
    seg = hiper.stage_segments([a, b])
    kw = dict(values=[[1.0, 2.0, 0.5, 1.0], [1.0, 0.5, 0.25]], last_values=[0.0, 2.0], gamma=0.5,
              lam=1.0)
    got = hiper.hiper_advantages([a, b], seg, norm_adv=True, eps=0.0, **kw)
    lo = np.array([-0.375, -0.75, 0.5, 1.0, 0.25, 0.0, 0.75])
    hi = np.array([-0.25625, 0.5, 0.25, 0.0])
    zl, zh = (lo - lo.mean()) / lo.std(), (hi - hi.mean()) / hi.std()
    np.testing.assert_allclose(got[0], [zh[0], zl[1], zh[1], zl[3]])
    np.testing.assert_allclose(got[1], [zh[2], zh[3], zl[6]])
    # standardise_turns: the flat baseline's whitening, and a selection
    w = hiper.standardise_turns([np.array([1.0, 3.0]), np.array([2.0, 8.0])],
                                select=[np.array([True, True]), np.array([True, False])], eps=0.0)
    s = np.std([1.0, 3.0, 2.0])
    np.testing.assert_allclose(np.concatenate(w), [-1 / s, 1 / s, 0.0, 8.0])


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
    # norm_adv: a level of one entry is centred to 0 (as released: std 0, then + 1e-8)
    adv_n = hiper.hiper_advantages([one], [np.zeros(1, dtype=int)], values=[np.array([0.25])],
                                   norm_adv=True)
    np.testing.assert_allclose(adv_n[0], [0.0])
    # all-equal advantages: 0 everywhere, no division by zero
    a, b = _batch()
    flat = [np.zeros(4, dtype=int), np.zeros(3, dtype=int)]
    z = hiper.hiper_advantages([a, b], flat, [np.array(a.rewards), np.array(b.rewards)],
                               gamma=0.0, norm_adv=True)
    assert all(np.all(x == 0) for x in z)


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
