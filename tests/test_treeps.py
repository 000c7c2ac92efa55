"""treeps: tree rollouts by prefix replay and Monte-Carlo process advantages (hand-computed values,
a brute-force implementation, the telescoping identity, equality with agent_pg's GRPO loop)."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import agent_pg, credit, treeps
from agentrl_lib.algorithms.agent_pg import AgentPGConfig
from agentrl_lib.models.policies import KeyTablePolicy
from agentrl_lib.rollout import Episode, play_episodes


class HopToy:
    """k hops to walk ('advance'), a wasted call ('waste'), 'answer' ends: 1 if all hops walked.
    Deterministic given (seed, actions), like KGMenuEnv."""

    actions = ["advance", "waste", "answer"]

    def __init__(self, max_turns=5):
        self.max_turns = max_turns

    def reset(self, seed=0):
        self.k, self.p, self.turn, self.seed = 1 + seed % 3, 0, 0, seed
        return f"q{seed}"

    def state_key(self):
        return (self.k, self.p)

    def step(self, a):
        self.turn += 1
        r, done = 0.0, False
        if a == "advance":
            self.p = min(self.p + 1, self.k)
        elif a == "answer":
            r, done = float(self.p == self.k), True
        done = done or self.turn >= self.max_turns
        return f"p{self.p}t{self.turn}", r, done, {"valid": True, "state_key": self.state_key(),
                                                   "success": r > 0}


def ep(actions, ret, gid=0):
    rewards = [0.0] * (len(actions) - 1) + [ret]
    return Episode.of(["s"] * len(actions), rewards, gid, actions=list(actions))


def hand_batch():
    # group 0: ab -> 1, ac -> 0, d -> 0; group 1: one episode
    return [ep("ab", 1.0), ep("ac", 0.0), ep("d", 0.0), ep("ab", 1.0, gid=1)]


def test_node_values_by_hand():
    v = treeps.node_values(hand_batch())
    assert v[0, ()] == pytest.approx(1 / 3)
    assert v[0, ("a",)] == 0.5 and v[0, ("a", "b")] == 1.0 and v[0, ("a", "c")] == 0.0
    assert v[0, ("d",)] == 0.0 and v[1, ()] == 1.0


def test_process_advantages_by_hand():
    got = treeps.process_advantages(hand_batch(), norm_adv=False)
    want = [[1 / 6, 1 / 2], [1 / 6, -1 / 2], [-1 / 3], [0.0, 0.0]]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-12)
    sigma = np.std([1.0, 0.0, 0.0], ddof=1) + 1e-4  # sqrt(1/3) + eps
    got = treeps.process_advantages(hand_batch(), norm_adv=True)
    np.testing.assert_allclose(got[0], np.array([1 / 6, 1 / 2]) / sigma)
    np.testing.assert_allclose(got[2], [-1 / 3 / sigma])


def test_global_local_by_hand():
    # adds V(n_{t+1}) - V(root): leaf ab: [1/6 + 1/6, 1/2 + 2/3]
    got = treeps.process_advantages(hand_batch(), norm_adv=False, form="global_local")
    want = [[1 / 3, 7 / 6], [1 / 3, -5 / 6], [-2 / 3], [0.0, 0.0]]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-12)
    with pytest.raises(ValueError, match="form"):
        treeps.process_advantages(hand_batch(), form="treerl")


def test_equal_returns_and_singletons_are_zero():
    batch = [ep("ab", 1.0), ep("b", 1.0), ep("a", 0.0, gid=1)]
    for a in treeps.process_advantages(batch):
        assert np.all(a == 0.0)


def brute_force(episodes, norm_adv):
    """V by scanning every leaf for every turn (no dictionaries)."""
    out = []
    for e in episodes:
        grp = [o for o in episodes if o.group_id == e.group_id]
        r = np.array([o.ret for o in grp])
        if len(r) < 2 or r.std() == 0:
            out.append(np.zeros(len(e)))
            continue
        def V(t):
            return np.mean([o.ret for o in grp if list(o.actions[:t]) == list(e.actions[:t])
                            and len(o) >= t])
        s = r.std(ddof=1) + 1e-4 if norm_adv else 1.0
        out.append(np.array([(V(t + 1) - V(t)) / s for t in range(len(e))]))
    return out


@pytest.mark.parametrize("norm_adv", [True, False])
def test_matches_brute_force_and_telescopes_to_grpo(norm_adv):
    pol = KeyTablePolicy(3, seed=1)
    batch = treeps.tree_rollout(HopToy, pol.act, [0, 1, 2, 4], num_leaves=8,
                                branch_depths=(1, 2), branch_factor=2).episodes
    got = treeps.process_advantages(batch, norm_adv=norm_adv)
    for g, w in zip(got, brute_force(batch, norm_adv)):
        np.testing.assert_allclose(g, w, atol=1e-12)
    grpo = credit.grpo_broadcast(batch, norm_adv=norm_adv)
    for g, w in zip(got, grpo):
        assert g.sum() == pytest.approx(w[0], abs=1e-9)  # sum_t A_t = (R - mean) / (std + eps)
    assert any(np.ptp(g) > 1e-6 for g in got)  # but spread unevenly over the turns


def test_tree_rollout_structure_and_replay():
    pol = KeyTablePolicy(3, seed=0)
    tb = treeps.tree_rollout(HopToy, pol.act, [2, 5], num_leaves=8, branch_depths=(1, 2),
                             branch_factor=2)
    eps = tb.episodes
    assert [e.group_id for e in eps] == [0] * 8 + [1] * 8 and len(tb.replayed) == 16
    for e, d in zip(eps, tb.replayed):
        if d:  # a branch: some other leaf of its group has the same first d actions, same turns
            twins = [o for o in eps if o is not e and o.group_id == e.group_id
                     and o.actions[:d] == e.actions[:d] and len(o) > d]
            assert twins
            o = twins[0]
            assert o.state_keys[:d + 1] == e.state_keys[:d + 1] and o.rewards[:d] == e.rewards[:d]
    assert tb.new_turns == sum(len(e) for e in eps) - sum(tb.replayed)
    assert tb.new_turns < sum(len(e) for e in eps)  # prefixes are not paid twice
    # an env whose episodes end at once cannot branch: the budget is filled with fresh roots
    always_answer = lambda envs, obs: [2] * len(envs)  # noqa: E731
    tb = treeps.tree_rollout(HopToy, always_answer, [0], num_leaves=5, branch_depths=(1,))
    assert len(tb.episodes) == 5 and tb.replayed == [0] * 5 and all(len(e) == 1 for e in tb.episodes)


def test_max_turns_truncates_like_play_episodes():
    always_waste = lambda envs, obs: [1] * len(envs)  # noqa: E731
    tb = treeps.tree_rollout(lambda: HopToy(max_turns=50), always_waste, [0], num_leaves=4,
                             branch_depths=(1,), max_turns=3)
    ref = play_episodes(lambda: HopToy(max_turns=50), always_waste, [0], 1, max_turns=3)[0]
    for e in tb.episodes:
        assert len(e) == 3 and e.truncated and e.state_keys == ref.state_keys
        assert e.next_state_key == ref.next_state_key


def test_iid_outcome_is_agent_pg_grpo():
    cfg = AgentPGConfig(num_iters=3, num_prompts=3, group_size=4, lr=0.3, estimator="grpo", seed=7)
    p1, p2 = KeyTablePolicy(3, seed=7), KeyTablePolicy(3, seed=7)
    h1 = agent_pg.train(HopToy, p1, cfg, list(range(9)))
    h2 = treeps.train(HopToy, p2, cfg, treeps.TreePSConfig("iid", "outcome", num_leaves=4),
                      list(range(9)))
    for a, b in zip(h1, h2):
        assert a["rollout/success"] == b["rollout/success"] and a["losses/loss"] == b["losses/loss"]
    assert torch.equal(p1.logits, p2.logits)


def test_tree_training_learns_and_counts_calls():
    cfg = AgentPGConfig(num_iters=15, num_prompts=4, lr=0.3, seed=0)
    pol = KeyTablePolicy(3, seed=0)
    hist = treeps.train(HopToy, pol, cfg, treeps.TreePSConfig("tree", "process", num_leaves=8),
                        list(range(30)))
    assert hist[-1]["rollout/success"] > hist[0]["rollout/success"]
    assert all(0 < h["rollout/new_turns"] <= h["rollout/turns"] for h in hist)


def test_bad_input():
    with pytest.raises(ValueError, match="sampler"):
        treeps.TreePSConfig(sampler="mcts")
    with pytest.raises(ValueError, match="advantage"):
        treeps.TreePSConfig(advantage="gae")
    with pytest.raises(ValueError, match="branch_depths"):
        treeps.tree_rollout(HopToy, None, [0], 4, branch_depths=(2, 1))
    with pytest.raises(ValueError, match="num_leaves"):
        treeps.tree_rollout(HopToy, None, [0], 0)
