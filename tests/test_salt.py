"""SALT's trajectory-graph step advantages (algorithms/salt.py): hand-computed values, a brute-force
implementation on random and real batches, and the edge cases."""

import numpy as np
import pytest

from agentrl_lib.algorithms import credit, salt
from agentrl_lib.rollout import Episode


def ep(keys, actions, rewards, gid=0):
    return Episode.of(keys, rewards, gid, actions=list(actions))


def toy():
    # returns 1, 0, 0 -> mean_norm A = 2/3, -1/3, -1/3; group 1 is a group of one
    return [ep(["s", "x"], "uv", [0, 1]), ep(["s", "y"], "uw", [0, 0]),
            ep(["s", "x"], "wv", [0, 0]), ep(["s"], "u", [1], gid=1)]


def test_hand_computed_state_merge():
    got = salt.salt_advantages(toy(), gamma=1.0, norm_adv=False)
    # edges: (s,u) = {ep0, ep1} -> 1/6; (x,v) = {ep0, ep2} -> 1/6; (y,w), (s,w) alone -> -1/3
    want = [[1 / 6, 1 / 6], [1 / 6, -1 / 3], [-1 / 3, 1 / 6], [0.0]]
    for g, w in zip(got, want):
        assert np.allclose(g, w)
        assert g.dtype == np.float64


def test_hand_computed_history_merge():
    got = salt.salt_advantages(toy(), gamma=1.0, norm_adv=False, merge="history")
    # ep2 reaches x through (s,w): a different history, so its (x,v) is not ep0's
    want = [[1 / 6, 2 / 3], [1 / 6, -1 / 3], [-1 / 3, -1 / 3], [0.0]]
    for g, w in zip(got, want):
        assert np.allclose(g, w)


def test_hand_computed_edge_minus_node():
    got = salt.salt_advantages(toy(), gamma=1.0, norm_adv=False, form="edge_minus_node")
    # node means: s = (2/3 - 1/3 - 1/3)/3 = 0, x = (2/3 - 1/3)/2 = 1/6, y = -1/3
    want = [[1 / 6, 0.0], [1 / 6, 0.0], [-1 / 3, 0.0], [0.0]]
    for g, w in zip(got, want):
        assert np.allclose(g, w)


def test_loop_counts_every_traversal_and_discount():
    # ep0 takes (s,u) twice and fails, ep1 takes it once and succeeds: A = -0.5, +0.5 (mean_norm)
    eps = [ep(["s", "s"], "uu", [0, 0]), ep(["s"], "u", [1])]
    got = salt.salt_advantages(eps, gamma=1.0, norm_adv=False)
    assert np.allclose(got[0], [-1 / 6, -1 / 6]) and np.allclose(got[1], [-1 / 6])
    # gamma discounts the outcome from the first turn: a success at turn 2 is worth 0.25
    eps = [ep(["a", "b", "c"], "xyz", [0, 0, 1]), ep(["d"], "x", [1])]
    got = salt.salt_advantages(eps, gamma=0.5, norm_adv=False)
    assert np.allclose(got[0], -0.375) and np.allclose(got[1], 0.375)


def test_std_normalisation_matches_credit():
    eps = toy()
    a = credit.episode_advantages(eps, 1.0, norm_adv=True)
    r = np.array([1.0, 0.0, 0.0])
    assert np.allclose(a[:3], (r - r.mean()) / (r.std(ddof=1) + 1e-4))
    got = salt.salt_advantages(eps, gamma=1.0, norm_adv=True)
    assert np.isclose(got[0][0], (a[0] + a[1]) / 2) and np.isclose(got[1][1], a[1])


def test_edge_cases():
    # a group of one and all-equal returns: 0 everywhere; length-1 episodes; an empty episode
    for batch in ([ep(["s", "x"], "uv", [0, 1])],
                  [ep(["s", "x"], "uv", [0, 1]), ep(["s", "y"], "uw", [0, 1])],
                  [ep(["s"], "u", [0]), ep(["s"], "u", [0]), ep(["s"], "w", [0])]):
        for merge in salt.MERGES:
            for form in salt.FORMS:
                out = salt.salt_advantages(batch, merge=merge, form=form)
                assert all(np.all(a == 0.0) for a in out)
    out = salt.salt_advantages([ep([], "", []), ep(["s"], "u", [1])], gamma=1.0, norm_adv=False)
    assert out[0].shape == (0,) and np.allclose(out[1], 0.5)
    assert salt.merged_share([]) == 0.0
    with pytest.raises(ValueError, match="merge"):
        salt.salt_advantages(toy(), merge="tree")
    with pytest.raises(ValueError, match="form"):
        salt.salt_advantages(toy(), form="mean")


def brute_force(episodes, gamma, norm_adv, merge, form):
    """Every turn compared with every other turn of its group: O(N^2), no dictionaries."""
    a = credit.episode_advantages(episodes, gamma, norm_adv)
    act = lambda e, t: e.action_ids[t] if e.action_ids is not None else e.actions[t]  # noqa: E731

    def node(e, t):
        if merge == "state":
            return e.state_keys[t]
        return tuple((e.state_keys[k], act(e, k)) for k in range(t)) + (e.state_keys[t],)

    turns = [(i, t) for i, e in enumerate(episodes) for t in range(len(e))]
    out = [np.zeros(len(e)) for e in episodes]
    for i, t in turns:
        e = episodes[i]
        same_node = [j for j, k in turns if episodes[j].group_id == e.group_id
                     and node(episodes[j], k) == node(e, t)]
        same_edge = [j for j, k in turns if episodes[j].group_id == e.group_id
                     and node(episodes[j], k) == node(e, t) and act(episodes[j], k) == act(e, t)]
        out[i][t] = np.mean(a[same_edge]) - (np.mean(a[same_node]) if form == "edge_minus_node" else 0)
    return out


def random_batch(rng, n_groups=3, g=4):
    eps = []
    for gid in range(n_groups):
        for _ in range(g):
            T = int(rng.integers(1, 6))
            keys = [int(k) for k in rng.integers(0, 3, T)]
            acts = [int(x) for x in rng.integers(0, 2, T)]
            rew = [0.0] * (T - 1) + [float(rng.integers(0, 2))]
            eps.append(Episode.of(keys, rew, gid, action_ids=acts))
    return eps


def test_brute_force_random_batches():
    rng = np.random.default_rng(0)
    for _ in range(5):
        b = random_batch(rng)
        for merge in salt.MERGES:
            for form in salt.FORMS:
                for norm in (True, False):
                    got = salt.salt_advantages(b, 0.9, norm, merge=merge, form=form)
                    for x, y in zip(got, brute_force(b, 0.9, norm, merge, form)):
                        assert np.allclose(x, y)


def test_no_shared_steps_is_grpo_and_shared_prefix_is_zero():
    rng = np.random.default_rng(1)
    b = random_batch(rng)
    distinct = [Episode.of([(i, t) for t in range(len(e))], e.rewards, e.group_id,
                           action_ids=e.action_ids) for i, e in enumerate(b)]
    for x, y in zip(salt.salt_advantages(distinct, gamma=0.95),
                    credit.grpo_broadcast(distinct, gamma=0.95)):
        assert np.allclose(x, y)
    # history merge: a first step taken by every episode of the group gets exactly the group mean, 0
    same_start = [Episode.of(["s0"] + e.state_keys, [0.0] + e.rewards, e.group_id,
                             action_ids=[9] + e.action_ids) for e in b]
    for a in salt.salt_advantages(same_start, merge="history"):
        assert abs(a[0]) < 1e-12


def test_gridworld_batch_equals_brute_force():
    from agentrl_lib.envs.multiturn import GridAgentEnv
    from agentrl_lib.models.policies import KeyTablePolicy
    from agentrl_lib.rollout import play_episodes

    layout = ["....", ".#..", "..#.", "...."]
    make_env = lambda: GridAgentEnv(layout, max_turns=8)  # noqa: E731
    pol = KeyTablePolicy(len(GridAgentEnv.actions), seed=0)
    b = play_episodes(make_env, pol.act, [0, 1], 4)
    assert salt.merged_share(b) > 0  # a uniform policy's group shares its first step at least
    for merge in salt.MERGES:
        got = salt.salt_advantages(b, 0.95, merge=merge)
        for x, y in zip(got, brute_force(b, 0.95, True, merge, "edge_mean")):
            assert np.allclose(x, y)
