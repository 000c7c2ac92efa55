"""HGPO's hierarchy of history groups and the exact values of a window agent, by hand."""

import numpy as np
import pytest

from agentrl_lib.algorithms import credit, dp, hgpo
from agentrl_lib.envs.memory_grid import MemoryGridEnv, WindowOracle, context_key
from agentrl_lib.rollout import Episode, play_episodes


def ep(keys, rewards, actions, gid=0):
    return Episode.of(keys, rewards, gid, action_ids=list(actions))


def batch():
    # one task group; all three episodes reach state "s" at turn 1, from different pasts:
    # e0 and e1 via (x, 0), e2 via (y, 1). Returns-to-go with gamma 0.5 from s: 1, 0, 0.5
    e0 = ep(["x", "s"], [0.0, 1.0], [0, 0])
    e1 = ep(["x", "s", "z"], [0.0, 0.0, 0.0], [0, 1, 0])
    e2 = ep(["y", "s", "w"], [0.0, 0.0, 1.0], [1, 1, 1])
    return [e0, e1, e2]


def test_context_key_and_levels_by_hand():
    e = batch()
    assert context_key(e[1].state_keys, e[1].action_ids, 2, 1) == ("s", 1, "z")
    assert context_key(e[1].state_keys, e[1].action_ids, 2, None) == ("x", 0, "s", 1, "z")
    g0 = hgpo.history_groups(e, 0)
    assert sorted(g0[(0, ("s",))]) == [(0, 1), (1, 1), (2, 1)]
    g1 = hgpo.history_groups(e, 1)
    assert sorted(g1[(0, ("x", 0, "s"))]) == [(0, 1), (1, 1)] and g1[(0, ("y", 1, "s"))] == [(2, 1)]
    with pytest.raises(ValueError, match="depth"):
        context_key(["a"], [], 0, -1)


def test_level_zero_is_gigpo_step_term_and_depth_zero_is_gigpo():
    rng = np.random.default_rng(0)
    eps = [ep(list(rng.integers(0, 3, n)), list(rng.random(n).round(1)),
              list(rng.integers(0, 2, n)), gid=int(g))
           for n, g in zip([1, 3, 4, 2, 5, 1], [0, 0, 0, 1, 1, 1])]
    for a, b in zip(hgpo.level_advantages(eps, 0, 0.9), credit.step_advantages(eps, 0.9)):
        assert np.allclose(a, b)
    for a, b in zip(hgpo.hgpo_advantages(eps, 0.9, depth=0), credit.gigpo_advantages(eps, 0.9)):
        assert np.allclose(a, b)


def test_hierarchy_weights_and_aggregate_by_hand():
    assert np.allclose(hgpo.hierarchy_weights([3, 2, 1]), [1 / 3, 2 / 3, 0])
    assert np.allclose(hgpo.hierarchy_weights([3, 2, 2], "uniform"), [1 / 3] * 3)
    assert np.allclose(hgpo.hierarchy_weights([3, 2, 1], "deepest"), [0, 1, 0])
    assert np.allclose(hgpo.hierarchy_weights([1, 1]), [0, 0])  # no signal at all
    with pytest.raises(ValueError, match="weighting"):
        hgpo.hierarchy_weights([2], "softmax")
    e = batch()
    # turn 1 (state s), unnormalised, gamma 0.5: rtg 1, 0, 0.5
    # level 0 {e0, e1, e2}: mean 0.5 -> 0.5, -0.5, 0; level 1 {e0, e1}: mean 0.5 -> 0.5, -0.5;
    # e2 alone at level 1
    # weights (levels 0, 1 with alpha 1): 1/3, 2/3 for e0, e1; e2 only level 0
    a = hgpo.hgpo_step_advantages(e, gamma=0.5, depth=1, norm_adv=False)
    assert np.allclose([a[0][1], a[1][1], a[2][1]], [0.5, -0.5, 0.0])
    # turn 0: states x (e0, e1: rtg 0.5, 0) and y (e2 alone): level 0 and 1 equal (nothing before)
    assert np.allclose([a[0][0], a[1][0], a[2][0]], [0.25, -0.25, 0.0])
    # a length-1 turn singleton and the last turns (z, w singletons) get 0
    assert a[1][2] == 0.0 and a[2][2] == 0.0
    b, _ = hgpo.hgpo_baselines(e, gamma=0.5, depth=1)
    g = credit.episode_returns_to_go(e, 0.5)
    for ai, bi, gi in zip(a, b, g):
        assert np.allclose(ai, gi - bi)  # A^H = G - b with norm_adv False
    # all-equal returns and a group of one: zero
    flat = [ep(["s"], [1.0], [0]), ep(["s"], [1.0], [0]), ep(["s"], [0.0], [0], gid=1)]
    assert all(np.all(x == 0) for x in hgpo.hgpo_step_advantages(flat))


def test_hgpo_baselines_bias_terms_by_hand():
    e = batch()
    values = [np.array([0.1, 0.2]), np.array([0.3, 0.4, 0.5]), np.array([0.6, 0.7, 0.8])]
    b, bbar = hgpo.hgpo_baselines(e, gamma=0.5, depth=1, values=values)
    # e2 turn 1: only level 0 {0.2, 0.4, 0.7}: bbar = 13/30; e0 turn 1: 1/3 * 13/30 + 2/3 * 0.3
    assert np.isclose(bbar[2][1], 1.3 / 3) and np.isclose(bbar[0][1], 1.3 / 9 + 0.2)
    assert np.isclose(bbar[1][2], 0.5)  # singleton: V itself (no bias)
    lb, lbbar = hgpo.level_baselines(e, 1, gamma=0.5, values=values)
    assert np.isclose(lbbar[2][1], 0.7) and np.isclose(lb[0][1], 0.5) and np.isclose(lb[2][1], 0.5)


def test_window_oracle_window_zero_equals_dp_and_success():
    env = MemoryGridEnv(layout="4x4", slip=0.1, max_turns=8)
    task = env.tasks[5]
    pol = hgpo.WindowTablePolicy(4, window=0, seed=3, init_scale=1.0)
    fn = pol.probs_fn()
    mdp = env.tabular_form(*task)
    pi = np.zeros((mdp.num_states, 4))
    for s in range(mdp.num_states):
        p = fn(((env.cell(s), task[1]),))
        for j, a in enumerate(env.actions):
            pi[s, env.action_index(a)] = p[j]
    A, V = dp.finite_horizon_advantages(mdp, pi, 8)
    orc = WindowOracle(env, fn, 0)
    index, _, _ = orc.solve(task)
    checked = 0
    for t in range(8):
        for s in range(16):
            c = ((env.cell(s), task[1]),)
            if c not in index:  # walls and the goal are no contexts
                continue
            assert np.isclose(orc.value(t, c, task), V[t, s].item())
            q = orc.q(t, c, task)
            for j, a in enumerate(env.actions):
                assert np.isclose(q[j] - orc.value(t, c, task), A[t, s, env.action_index(a)].item())
            checked += 1
    assert checked >= 8 * 10
    # success probability of gamma 1 in [0, 1], = 1 for the expert-greedy table
    succ = WindowOracle(env, fn, 0, gamma=1.0).start_value(task)
    assert 0.0 < succ < 1.0


def test_window_oracle_matches_monte_carlo_and_policy_plays_contexts():
    env_fn = lambda: MemoryGridEnv(layout="4x4", tasks=[((0, 0), (3, 3))],  # noqa: E731
                                   max_turns=6, slip=0.1)
    pol = hgpo.WindowTablePolicy(4, window=1, seed=0, init_scale=1.0)
    eps = play_episodes(env_fn, pol.act, [0] * 150, group_size=4)
    orc = WindowOracle(env_fn(), pol.probs_fn(), 1, gamma=1.0)
    mc = np.mean([e.success for e in eps])
    p = orc.start_value(((0, 0), (3, 3)))
    assert abs(mc - p) < 4 * np.sqrt(p * (1 - p) / len(eps)) + 1e-9
    # the policy's keys are the contexts it played from; advantages are exact and finite
    e = eps[0]
    assert pol.keys_of(e)[0] == (e.state_keys[0],)
    if len(e) > 1:
        assert pol.keys_of(e)[1] == (e.state_keys[0], e.action_ids[0], e.state_keys[1])
    adv = orc.advantages(eps[:20])
    assert all(a.shape == (len(x),) and np.all(np.isfinite(a)) for a, x in zip(adv, eps[:20]))
    # a trained step moves the logits of the played contexts (agent_pg's interface)
    lp = pol.episode_logps(eps[:4])
    assert lp.shape == (sum(len(x) for x in eps[:4]),)


def test_hierarchy_share_is_nested():
    env_fn = lambda: MemoryGridEnv(layout="4x4", max_turns=10)  # noqa: E731
    pol = hgpo.WindowTablePolicy(4, window=2, seed=1)
    eps = play_episodes(env_fn, pol.act, [1, 2], group_size=6)
    share = hgpo.hierarchy_share(eps, 3)
    assert np.all(np.diff(share) <= 1e-12) and 0 <= share[-1] <= share[0] <= 1
    assert hgpo.hierarchy_share([], 2).tolist() == [0.0, 0.0, 0.0]


# --- the released estimator (verl-agent recipe/hgpo/core_hgpo.py) by hand ------------------------
def test_released_advantages_by_hand():
    """gamma 0.5, history_length 1. Returns: e0 (0.5, 1), e1 (0, 0, 0), e2 (0.25, 0.5, 1).
    Level 0 (one observation): "x" {e0 0.5, e1 0} -> +-1 (ddof 0); "s" {1, 0, 0.5}: mean 0.5,
    std sqrt(1/6) -> +-sqrt(1.5), 0. Level 1 (two observations): ("x", "s") {e0 1, e1 0} -> +-1;
    ("y", "s") a singleton. Weights (kappa + 2): 2 and 3."""
    e = batch()
    got = hgpo.released_step_advantages(e, gamma=0.5, history_length=1)
    s15 = np.sqrt(1.5)
    expected = [[2 / (2 + 1e-6), (2 * s15 + 3) / (5 + 1e-6)],
                [-2 / (2 + 1e-6), -(2 * s15 + 3) / (5 + 1e-6), 0.0],
                [0.0, 0.0, 0.0]]  # e2 at turn 1: its only item is 0 and is dropped; no episode term
    for g, x in zip(got, expected):
        assert np.allclose(g, x, atol=1e-6), (g, x)
    # the notebook's earlier form differs on the same batch (actions in the key, (k+1) weights,
    # zeros kept, an episode term)
    old = hgpo.hgpo_advantages(e, gamma=0.5, depth=1)
    assert max(np.abs(a - b).max() for a, b in zip(got, old)) > 0.1


def test_released_keys_weights_and_modes():
    # observations only: the same states by different actions share the level-1 group
    e = [ep(["x", "s"], [0.0, 1.0], [0, 0]), ep(["x", "s"], [0.0, 0.0], [1, 1])]
    items = hgpo.released_items(e, gamma=1.0, history_length=2, mode="mean_norm")
    assert [k for k, *_ in items[0][1]] == [0, 1]  # turn 1: levels 0 and 1 only (t < K)
    assert [k for k, *_ in items[0][0]] == [0]
    assert np.allclose(hgpo.released_step_advantages(e, 1.0, 2, mode="mean_norm")[0],
                       [0.5, 0.5 * (2 + 3) / (5 + 1e-6)])
    assert hgpo.history_groups(e, 1)[(0, ("x", 0, "s"))] == [(0, 1)]  # ours: split by action
    # weights: (kappa + 2)^alpha over the non-zero items; alpha 0 is uniform; none left -> 0
    assert np.allclose(hgpo.released_weights([0, 1, 2], [1, 1, 1], 1.0, 0.0), [2 / 9, 3 / 9, 4 / 9])
    assert np.allclose(hgpo.released_weights([0, 2], [1, -1], 0.0, 0.0), [0.5, 0.5])
    assert np.allclose(hgpo.released_weights([0, 1], [0.0, 0.0]), [0, 0])
    with pytest.raises(ValueError, match="mode"):
        hgpo.released_items(e, mode="std")
    with pytest.raises(ValueError, match="level"):
        hgpo.obs_context_key(["a"], 0, 1)


def test_released_baselines_match_mean_norm_advantages():
    rng = np.random.default_rng(3)
    eps_ = [ep([int(x) for x in rng.integers(0, 3, n)], list(rng.integers(0, 2, n).astype(float)),
               list(rng.integers(0, 2, n)), gid=int(g))
            for n, g in zip([3, 4, 2, 5, 3, 4], [0, 0, 0, 1, 1, 1])]
    adv = hgpo.released_step_advantages(eps_, 0.9, 2, mode="mean_norm")
    rtg = credit.episode_returns_to_go(eps_, 0.9)
    b, bbar = hgpo.released_baselines(eps_, 0.9, 2, values=rtg)
    for a, g, b_ in zip(adv, rtg, b):
        assert np.allclose(a, g - b_)
    for b_, bb in zip(b, bbar):  # values = the returns themselves: bbar is b
        assert np.allclose(b_, bb)
