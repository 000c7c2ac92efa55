"""Multi-turn episodes and the turn-level advantage estimators, against hand-computed numbers."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import credit
from agentrl_lib.core import grpo_advantages
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.policies import tabular_agent
from agentrl_lib.rollout import Episode, play_episodes


def ep(keys, rewards, gid=0, truncated=False):
    return Episode.of(keys, rewards, gid, truncated=truncated)


def test_play_episodes_record_is_consistent():
    env_fn = lambda: GridAgentEnv(max_turns=6)  # noqa: E731
    uniform = tabular_agent(np.full((16, 4), 0.25), lambda e: e.state_index(),
                            np.random.default_rng(0))
    eps = play_episodes(env_fn, uniform, seeds=[3, 4], group_size=5)
    assert len(eps) == 10 and [e.group_id for e in eps] == [0] * 5 + [1] * 5
    for e in eps:
        T = len(e)
        assert 1 <= T <= 6
        assert len(e.observations) == len(e.rewards) == len(e.state_keys) == len(e.valid) == T
        assert e.state_keys[0][1] == e.task[1]  # the key holds the goal
        assert e.success == (e.next_state_key[0] == e.task[1])
        assert e.truncated == (not e.success)
        assert e.ret == (1.0 if e.success else 0.0)
    # a group shares its task
    assert len({e.task for e in eps[:5]}) == 1
    # max_turns cuts episodes in play_episodes itself, keeping the record aligned
    short = play_episodes(env_fn, uniform, seeds=[3], group_size=4, max_turns=2)
    assert all(len(e) <= 2 and len(e.state_keys) == len(e) for e in short)


def test_grpo_broadcast_equals_core_grpo():
    rewards = [[1.0], [0.0, 0.0], [0.0, 1.0], [0.0]]
    eps = [ep(range(len(r)), r) for r in rewards]
    adv = credit.grpo_broadcast(eps)
    ref = grpo_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0]]))[0].numpy()
    for a, e, r in zip(adv, eps, ref):
        assert a.shape == (len(e),) and np.allclose(a, r)


def test_gigpo_step_groups_by_hand():
    # group 0: two episodes both visit state "s" at turn 0; ep0 then succeeds, ep1 fails later
    e0 = ep(["s", "x"], [0.0, 1.0])
    e1 = ep(["s", "y", "z"], [0.0, 0.0, 0.0])
    e2 = ep(["s"], [1.0], gid=1)  # another group: never mixed with group 0
    gamma = 0.5
    a_s = credit.step_advantages([e0, e1, e2], gamma=gamma, norm_adv=False)
    # anchor "s" in group 0: returns-to-go 0.5 (ep0) and 0 (ep1) -> +-0.25; singletons get 0
    assert np.allclose(a_s[0], [0.25, 0.0]) and np.allclose(a_s[1], [-0.25, 0.0, 0.0])
    assert np.allclose(a_s[2], [0.0])
    a = credit.gigpo_advantages([e0, e1, e2], gamma=gamma, omega=2.0, norm_adv=False)
    assert np.allclose(a[0], 0.5 + 2 * np.array([0.25, 0.0]))
    assert np.allclose(a[1], -0.5 + 2 * np.array([-0.25, 0.0, 0.0]))
    assert np.allclose(a[2], [0.0])  # one-episode group: no episode signal
    # scaled: std (ddof=1) of (0.5, 0) is 0.3536
    a_s = credit.step_advantages([e0, e1], gamma=gamma)
    assert a_s[0][0] == pytest.approx(0.25 / (np.std([0.5, 0.0], ddof=1) + 1e-4))


def test_gigpo_with_all_distinct_states_is_grpo():
    eps = [ep([(i, t) for t in range(3)], [0, 0, float(i % 2)]) for i in range(4)]
    for a, b in zip(credit.gigpo_advantages(eps), credit.grpo_broadcast(eps)):
        assert np.allclose(a, b)


def test_turn_gae_by_hand():
    e = ep(["a", "b"], [0.0, 1.0])
    v = [0.5, 0.8]
    gamma, lam = 0.9, 0.5
    d1 = 1.0 - 0.8  # terminal: no bootstrap
    d0 = 0.0 + gamma * 0.8 - 0.5
    (adv,) = credit.turn_gae([e], [v], gamma, lam)
    assert np.allclose(adv, [d0 + gamma * lam * d1, d1])
    # truncated: bootstrap from last_values
    e.truncated = True
    (adv,) = credit.turn_gae([e], [v], gamma, 1.0, last_values=[2.0])
    assert adv[1] == pytest.approx(1.0 + gamma * 2.0 - 0.8)


def test_to_token_advantages():
    e = ep(["a", "b"], [0.0, 1.0])
    e.token_ids, e.turn_spans = list(range(8)), [(0, 2), (5, 7)]
    (tok,) = credit.to_token_advantages([e], [np.array([1.5, -1.0])])
    assert tok.tolist() == [1.5, 1.5, 0, 0, 0, -1.0, -1.0, 0]
    with pytest.raises(ValueError, match="turn_spans"):
        credit.to_token_advantages([ep(["a"], [1.0])], [np.array([1.0])])


def test_group_members_get_independent_transition_noise():
    """Same task per group, but slips are not shared: with an always-'right' policy on a slippery
    grid the members' trajectories differ, and the same call twice gives the same episodes."""
    env_fn = lambda: GridAgentEnv(max_turns=8, slip=0.5)  # noqa: E731
    right = lambda envs, obs: [envs[0].actions.index("right")] * len(envs)  # noqa: E731
    eps = play_episodes(env_fn, right, seeds=[5], group_size=6)
    assert len({e.task for e in eps}) == 1
    assert len({tuple(e.state_keys) for e in eps}) > 1
    again = play_episodes(env_fn, right, seeds=[5], group_size=6)
    assert [e.state_keys for e in eps] == [e.state_keys for e in again]


def test_all_equal_groups_get_exactly_zero_and_normalisation_equals_core():
    """GiGPO's anchor groups hold discounted returns-to-go (0.95^k: not dyadic): a group of equal
    values gets exactly 0, as core.grpo_advantages gives; elsewhere the numpy twin equals core."""
    from agentrl_lib.core import grpo_advantages

    gamma = 0.95  # the "x" turns: three returns-to-go of 0.95 (their numpy mean is off by 1e-16)
    eps = [ep(["s", "x", "y"], [0.0, 0.0, 1.0]) for _ in range(3)]
    a_s = credit.step_advantages(eps, gamma=gamma)
    assert all(np.array_equal(a, np.zeros(3)) for a in a_s)
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 8):
        for norm_adv in (True, False):
            for ddof in (0, 1):
                x = rng.normal(size=n)
                want = grpo_advantages(torch.as_tensor(x), norm_adv, ddof).numpy()
                assert np.allclose(credit.group_normalise(x, norm_adv, ddof, 1e-4), want, atol=1e-12)
        same = np.full(n, 0.95)
        assert np.array_equal(credit.group_normalise(same, True, 1, 1e-4), np.zeros(n))
        assert torch.equal(grpo_advantages(torch.as_tensor(same)), torch.zeros(n, dtype=torch.float64))


def test_anchor_share_counts_turns_in_shared_groups():
    # group 0: s twice (ep0 t0, ep1 t0) and x twice (ep0 t1, ep1 t2); y alone. group 1: s alone,
    # never pooled with group 0's s. 4 of 6 turns share a group.
    eps = [Episode.of(["s", "x"], [0, 1]), Episode.of(["s", "y", "x"], [0, 0, 0]),
           Episode.of(["s"], [1], group_id=1)]
    assert credit.anchor_share(eps) == pytest.approx(4 / 6)
    assert credit.anchor_share(eps, min_size=3) == 0.0
    assert credit.anchor_share(eps, min_size=1) == 1.0
    # a key that splits every turn (the turn number too): no shared group
    assert credit.anchor_share(eps, key=lambda ep, t: (ep.state_keys[t], t)) == pytest.approx(2 / 6)
    assert credit.anchor_share([]) == 0.0


def test_anchor_share_is_where_gigpo_differs_from_grpo():
    # on turns outside shared groups A^S = 0, so GiGPO's advantage equals GRPO's there
    rng = np.random.default_rng(0)
    eps = [Episode.of([int(k) for k in rng.integers(0, 4, size=5)], list(rng.integers(0, 2, 5)),
                      group_id=i // 4) for i in range(8)]
    gi, gr = credit.gigpo_advantages(eps), credit.grpo_broadcast(eps)
    sizes = {k: len(m) for k, m in credit.anchor_groups(eps).items()}
    alone = [(i, t) for i, ep in enumerate(eps) for t in range(len(ep))
             if sizes[(ep.group_id, ep.state_keys[t])] == 1]
    assert all(gi[i][t] == gr[i][t] for i, t in alone)
    assert credit.anchor_share(eps) == pytest.approx(1 - len(alone) / 40)


def test_group_normalise_turns_by_hand():
    from agentrl_lib.rollout import Episode
    eps = [Episode.of(["s"] * 2, [0.0, 0.0], group_id=0), Episode.of(["s"], [0.0], group_id=0),
           Episode.of(["s"], [0.0], group_id=1)]
    out = credit.group_normalise_turns(eps, [[1.0, 2.0], [3.0], [5.0]])
    # group 0: values 1, 2, 3, mean 2, std (ddof 1) 1; group 1: one value -> 0
    assert np.allclose(out[0], [-1 / (1 + 1e-4), 0]) and np.allclose(out[1], [1 / (1 + 1e-4)])
    assert out[2].tolist() == [0.0]


def _released_turn_level(turn_rewards, norm_adv=False, epsilon=1e-6, min_holders=5):
    """The released code's turn-level loop, transcribed (CM2-RLCR-Tool-Agent,
    verl/trainer/ppo/core_algos.py, compute_checklist_step_advantage): per position k over the
    group members holding k, mean, std (torch's, ddof 1) only if norm_adv, NaN (-> advantage 0)
    where len(holders) <= 4; ``min_holders`` generalises its 5."""
    out = [torch.zeros(len(r), dtype=torch.float64) for r in turn_rewards]
    for k in range(max(len(r) for r in turn_rewards)):
        holders = [i for i, r in enumerate(turn_rewards) if len(r) > k]
        vals = torch.tensor([turn_rewards[i][k] for i in holders], dtype=torch.float64)
        mean_k = vals.mean()
        std_k = vals.std() if norm_adv and len(vals) > 1 else torch.tensor(1.0)
        for j, i in enumerate(holders):
            if len(holders) < min_holders:
                continue
            out[i][k] = ((vals[j] - mean_k) / (std_k + epsilon) if norm_adv
                         else vals[j] - mean_k)
    return [o.numpy() for o in out]


def test_cm2_trajectory_level_by_hand():
    # Eq. 4-5, F_norm = 1: rewards (1, .75), (.5) stopped early, (1, 1); L = 2 (the reference's)
    r = [np.array([1.0, 0.75]), np.array([0.5]), np.array([1.0, 1.0])]
    a = credit.cm2_advantages(r, num_turns=2)
    R = np.array([1.75 / 2, 0.5 / 2, 2.0 / 2])
    assert [len(x) for x in a] == [2, 1, 2]
    assert np.allclose(np.concatenate(a), np.repeat(R - R.mean(), [2, 1, 2]), atol=1e-15)
    assert np.allclose(a[0], 0.875 - 2.125 / 3)
    # the text's L^(i) (num_turns=None): the stopped rollout's R is its own mean, 0.5
    b = credit.cm2_advantages(r, num_turns=None)
    R_own = np.array([0.875, 0.5, 1.0])
    assert np.allclose([x[0] for x in b], R_own - R_own.mean())
    # F_norm = std (ddof 1) + eps when norm_adv: equals core.grpo_advantages of R
    c = credit.cm2_advantages(r, num_turns=2, norm_adv=True, eps=1e-4)
    ref = grpo_advantages(torch.from_numpy(R[None]))[0].numpy()
    assert np.allclose([x[0] for x in c], ref)
    # the released code: verl's GRPO with norm_adv_by_std_in_grpo=False on the summed turn-end
    # scores each divided by max_num_turns (reward_manager/checklist.py) is the same number
    scores = torch.tensor([sum(x / 2 for x in rr) for rr in r], dtype=torch.float64)
    assert np.allclose([x[0] for x in a], (scores - scores.mean()).numpy())
    # no signal: all equal
    assert all(not x.any() for x in credit.cm2_advantages([np.ones(2), np.ones(2)], num_turns=2))


def test_cm2_turn_level_by_hand_and_against_the_released_loop():
    r = [np.array([1.0, 0.75]), np.array([0.5]), np.array([1.0, 1.0])]
    a = credit.cm2_advantages(r, "turn")
    # turn 0: mean 5/6 over all three; turn 1: mean 0.875 over the two that reached it
    assert np.allclose(np.concatenate(a), [1 / 6, -0.125, -1 / 3, 1 / 6, 0.125])
    rng = np.random.default_rng(3)
    for G in (2, 4, 6, 8):
        for _ in range(20):
            grp = [rng.integers(0, 5, int(rng.integers(1, 5))) / 4 for _ in range(G)]
            for norm in (False, True):
                mine = credit.cm2_advantages(grp, "turn", norm_adv=norm, min_holders=5)
                code = _released_turn_level(grp, norm_adv=norm)
                assert all(np.allclose(m, c, atol=1e-12) for m, c in zip(mine, code))
            paper = credit.cm2_advantages(grp, "turn")  # no threshold: every shared turn index
            assert all(np.allclose(m, c, atol=1e-12)
                       for m, c in zip(paper, _released_turn_level(grp, min_holders=2)))
    # pooled (the project's first version): one mean and std over all five turns
    flat = np.array([1.0, 0.75, 0.5, 1.0, 1.0])
    p = credit.cm2_advantages(r, "pooled", norm_adv=True, eps=1e-4)
    assert np.allclose(np.concatenate(p), (flat - flat.mean()) / (flat.std(ddof=1) + 1e-4))
    with pytest.raises(ValueError, match="level"):
        credit.cm2_advantages(r, "step")


def test_verl_agent_step_rows_and_invalid_penalty_by_hand():
    """cross_steps: verl-agent's GRPO on per-step rows (compute_grpo_outcome_advantage with
    compute_mean_std_cross_steps=True): each row's score is its episode's return minus the
    invalid-action penalty of that row only (apply_invalid_action_penalty), normalised by the
    mean and std (ddof 1) over every row of the group; GiGPO's step returns take the penalty
    after the discounting."""
    e0 = Episode.of(["s", "x"], [0.0, 1.0], valid=[False, True])  # succeeds, first turn invalid
    e1 = Episode.of(["s", "y", "z"], [0.0, 0.0, 0.0], valid=[True, True, False])
    e2 = Episode.of(["t"], [1.0], group_id=1)  # a group of one row: no signal
    c, eps_ = 0.1, 1e-4
    rows = np.array([1 - c, 1.0, 0.0, 0.0, -c])  # group 0's rows in batch order
    z = (rows - rows.mean()) / (np.std(rows, ddof=1) + eps_)
    adv = credit.grpo_broadcast([e0, e1, e2], invalid_penalty=c, cross_steps=True)
    assert np.allclose(adv[0], z[:2]) and np.allclose(adv[1], z[2:]) and adv[2].tolist() == [0.0]
    assert adv[0][0] < adv[0][1] and adv[1][2] < adv[1][0]  # only the invalid turn pays
    # c = 0: the rows still weigh episodes by their length (3 rows of 0, 2 of 1)
    rows0 = np.array([1.0, 1.0, 0.0, 0.0, 0.0])
    z0 = (rows0 - 0.4) / (np.std(rows0, ddof=1) + eps_)
    adv0 = credit.grpo_broadcast([e0, e1], cross_steps=True)
    assert np.allclose(np.concatenate(adv0), z0)
    assert not np.allclose(np.concatenate(adv0), np.concatenate(credit.grpo_broadcast([e0, e1])))
    with pytest.raises(ValueError, match="cross_steps"):
        credit.grpo_broadcast([e0, e1], invalid_penalty=c)
    # GiGPO: episode term as above, step term on returns-to-go minus c at the invalid turns
    gamma = 0.5
    a_s = credit.step_advantages([e0, e1], gamma=gamma, norm_adv=False, invalid_penalty=c)
    # anchor "s": e0's return-to-go 0.5 - c (invalid), e1's 0 -> centred +-(0.5 - c) / 2
    assert np.allclose(a_s[0], [(0.5 - c) / 2, 0.0]) and np.allclose(a_s[1], [-(0.5 - c) / 2, 0, 0])
    a = credit.gigpo_advantages([e0, e1], gamma=gamma, omega=2.0, norm_adv=False,
                                invalid_penalty=c, cross_steps=True)
    centred = rows - rows.mean()
    assert np.allclose(a[0], centred[:2] + 2 * a_s[0]) and np.allclose(a[1], centred[2:] + 2 * a_s[1])
