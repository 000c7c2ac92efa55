"""Dr. MAS (algorithms/dr_mas.py) and the two-agent search pipeline (envs/kg_team.py): numbers by
hand, an independent implementation, edge cases."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import dr_mas
from agentrl_lib.envs.kg_team import SEARCHER_ACTIONS, KGTeamEnv
from agentrl_lib.models.policies import KeyTablePolicy
from agentrl_lib.rollout import Episode

EPS = 1e-4


def _team_episode(search_rewards, answer_reward, group_id=0):
    """Searcher turns then one answerer turn; the searcher's reward on its last turn."""
    n = len(search_rewards)
    keys = [("searcher", 1, 0, 0)] * n + [("answerer", 0, True)]
    return Episode.of(keys, list(search_rewards) + [answer_reward], group_id=group_id,
                      action_ids=[0] * n + [len(SEARCHER_ACTIONS)])


def test_normalise_rewards_by_hand():
    # one group: searcher rewards (2, 0), answerer (1, 0)
    r, g, k = [2.0, 0.0, 1.0, 0.0], [0, 0, 0, 0], [0, 0, 1, 1]
    std = np.sqrt((1.25**2 + 0.75**2 + 0.25**2 + 0.75**2) / 3)  # pooled, ddof=1: 0.9574
    glob = dr_mas.normalise_rewards(r, g, k, "global")
    np.testing.assert_allclose(glob, np.array([1.25, -0.75, 0.25, -0.75]) / (std + EPS))
    agent = dr_mas.normalise_rewards(r, g, k, "agent")
    a = 1 / (np.sqrt(2) + EPS)  # the searcher's (2, 0): mean 1, std sqrt(2)
    b = 0.5 / (np.sqrt(0.5) + EPS)  # the answerer's (1, 0): mean 0.5, std sqrt(0.5)
    np.testing.assert_allclose(agent, [a, -a, b, -b])
    # mean-only (Dr. GRPO) centring
    np.testing.assert_allclose(dr_mas.normalise_rewards(r, g, k, "agent", norm_adv=False),
                               [1, -1, 0.5, -0.5])


def test_all_equal_agent_gets_zero_only_agentwise():
    # the answerer is right in every episode: agent-wise gives it 0, the global pool does not
    r, g, k = [2.0, 0.0, 2.0, 1.0, 1.0, 1.0], [0] * 6, [0, 0, 0, 1, 1, 1]
    agent = dr_mas.normalise_rewards(r, g, k, "agent")
    assert np.all(agent[3:] == 0.0) and np.all(agent[:3] != 0)
    glob = dr_mas.normalise_rewards(r, g, k, "global")
    assert np.all(glob[3:] < 0)  # every correct answer is pushed down by the searcher's scale


def test_groups_are_separate_and_independent_implementation():
    rng = np.random.default_rng(0)
    r = rng.normal(size=40) * np.repeat([1.0, 5.0], 20)
    g, k = np.tile(np.repeat([0, 1], 10), 2), np.repeat([0, 1], 20)
    for norm in ("global", "agent"):
        out = dr_mas.normalise_rewards(r, g, k, norm)
        ref = np.zeros(40)
        for gi in (0, 1):
            for ki in ((0, 1) if norm == "agent" else (None,)):
                m = (g == gi) & ((k == ki) if ki is not None else True)
                x = torch.tensor(r[m])
                ref[m] = ((x - x.mean()) / (x.std() + EPS)).numpy()  # torch.std: ddof=1
        np.testing.assert_allclose(out, ref, atol=1e-12)


def test_agentwise_is_invariant_to_one_agents_scale():
    r = np.array([3.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    g, k = [0] * 6, [0, 0, 0, 1, 1, 1]
    scaled = r * np.array([10, 10, 10, 1, 1, 1])
    a1, a2 = (dr_mas.normalise_rewards(x, g, k, "agent") for x in (r, scaled))
    np.testing.assert_allclose(a1, a2, atol=1e-3)  # up to eps
    g1, g2 = (dr_mas.normalise_rewards(x, g, k, "global") for x in (r, scaled))
    assert np.abs(g1 - g2).max() > 0.3


def test_team_advantages_units():
    eps = [_team_episode([0, 0, 2.0], 1.0), _team_episode([0.0], 0.0)]
    # agent rewards: searcher (2, 0), answerer (1, 0)
    np.testing.assert_array_equal(dr_mas.agent_rewards(eps, ("searcher", "answerer")),
                                  [[2, 1], [0, 0]])
    by_ep = dr_mas.team_advantages(eps, ("searcher", "answerer"), "global", unit="episode",
                                   reward="agent")
    std = np.sqrt((1.25**2 + 0.75**2 + 0.25**2 + 0.75**2) / 3)
    np.testing.assert_allclose(by_ep[0], np.array([1.25, 1.25, 1.25, 0.25]) / (std + EPS))
    np.testing.assert_allclose(by_ep[1], np.array([-0.75, -0.75]) / (std + EPS))
    # unit='turn': samples are searcher 2,2,2,0 and answerer 1,0 (six samples)
    by_turn = dr_mas.team_advantages(eps, ("searcher", "answerer"), "global", unit="turn",
                                     reward="agent")
    x = np.array([2, 2, 2, 1, 0, 0.0])
    ref = (x - x.mean()) / (x.std(ddof=1) + EPS)
    np.testing.assert_allclose(np.concatenate(by_turn), ref)
    # agent-wise: per agent, the unit changes only the weights
    agent = dr_mas.team_advantages(eps, ("searcher", "answerer"), "agent", unit="turn",
                                   reward="agent")
    s = np.array([2, 2, 2, 0.0])
    np.testing.assert_allclose(agent[0][:3], (2 - s.mean()) / (s.std(ddof=1) + EPS))
    np.testing.assert_allclose([agent[0][3], agent[1][1]], [0.5 / (np.sqrt(.5) + EPS),
                                                             -0.5 / (np.sqrt(.5) + EPS)])


ROLES = ("searcher", "answerer")
E6 = 1e-6  # the released epsilon


def _released_batch():
    """Group 0: trajectory A (searcher x3, the second invalid; answerer; team reward 1) and B
    (searcher, answerer; 0). Group 1: trajectory C alone (searcher x2, answerer; 1)."""
    a = _team_episode([0, 0, 0], 1.0, group_id=0)
    a.valid = [True, False, True, True]
    b = _team_episode([0], 0.0, group_id=0)
    c = _team_episode([0, 0], 1.0, group_id=1)
    return [a, b, c]


def test_released_global_baseline_by_hand():
    # compute_grpo_outcome_advantage, group_by_agent_id=False: rows scored R_i - 0.01 x invalid,
    # averaged per trajectory, one average per trajectory pooled per uid, given to every row
    eps = _released_batch()
    np.testing.assert_allclose(np.concatenate(dr_mas.row_scores(eps)),
                               [1, 0.99, 1, 1, 0, 0, 1, 1, 1])
    got = dr_mas.team_advantages(eps, ROLES, "global")
    avg_a = (1 + 0.99 + 1 + 1) / 4  # 0.9975
    std = avg_a / np.sqrt(2)  # two values (avg_a, 0), ddof 1
    adv_a = (avg_a - avg_a / 2) / (std + E6)
    np.testing.assert_allclose(got[0], [adv_a] * 4, rtol=1e-12)
    np.testing.assert_allclose(got[1], [-adv_a] * 2, rtol=1e-12)
    np.testing.assert_allclose(got[2], [1 / (1 + E6)] * 3, rtol=1e-12)  # one trajectory: raw
    # mean-only (norm_adv_by_std_in_grpo=False) and no penalty
    got = dr_mas.team_advantages(eps, ROLES, "global", norm_adv=False, invalid_penalty_coef=0.0)
    np.testing.assert_allclose(np.concatenate(got), [.5] * 4 + [-.5] * 2 + [1.0] * 3)


def test_released_dr_mas_by_hand():
    # group_by_agent_id=True: pool (uid, agent id), every row one sample with its own score
    got = dr_mas.team_advantages(_released_batch(), ROLES, "agent")
    s = np.array([1, 0.99, 1, 0])  # group 0, the searcher's rows (A x3, B x1)
    m, sd = 2.99 / 4, np.sqrt(((s - 2.99 / 4) ** 2).sum() / 3)
    np.testing.assert_allclose(got[0][:3], (s[:3] - m) / (sd + E6), rtol=1e-12)
    np.testing.assert_allclose(got[1][0], (0 - m) / (sd + E6), rtol=1e-12)
    b = 0.5 / (np.sqrt(0.5) + E6)  # group 0, the answerer's rows (1, 0)
    np.testing.assert_allclose([got[0][3], got[1][1]], [b, -b], rtol=1e-12)
    np.testing.assert_allclose(got[2][:2], [0, 0], atol=1e-9)  # (1, 1): all equal
    np.testing.assert_allclose(got[2][2], 1 / (1 + E6), rtol=1e-12)  # a pool of one: raw


def _verbatim_released(scores, index, traj_index, group_by_agent_id, eps=1e-6):
    """compute_grpo_outcome_advantage's body, transcribed line by line (torch, float64)."""
    from collections import defaultdict
    scores = torch.tensor(scores, dtype=torch.float64)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    traj_accumulator, traj2avg = defaultdict(list), {}
    bsz = scores.shape[0]
    for i in range(bsz):
        traj_accumulator[(index[i], traj_index[i])].append(scores[i])
    for (idx, t_idx), reward_list in traj_accumulator.items():
        if group_by_agent_id:
            id2score[idx].extend(reward_list)
        else:
            avg_score = torch.stack(reward_list).mean()
            traj2avg[(idx, t_idx)] = avg_score
            id2score[idx].append(avg_score)
    if not group_by_agent_id:
        for i in range(bsz):
            scores[i] = traj2avg[(index[i], traj_index[i])]
    for idx in id2score:
        if len(id2score[idx]) == 1:
            # float64 (the released tensors are float32 throughout)
            id2mean[idx] = torch.tensor(0.0, dtype=torch.float64)
            id2std[idx] = torch.tensor(1.0, dtype=torch.float64)
        else:
            id2mean[idx] = torch.mean(torch.stack(id2score[idx]))
            id2std[idx] = torch.std(torch.stack(id2score[idx]))
    for i in range(bsz):
        scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + eps)
    return scores.numpy()


def test_released_advantage_equals_verbatim_transcription():
    rng = np.random.default_rng(3)
    for _ in range(20):
        eps = []
        for g in range(int(rng.integers(1, 4))):
            for _ in range(int(rng.integers(1, 6))):
                ep = _team_episode([0.0] * int(rng.integers(1, 5)), float(rng.integers(0, 2)), g)
                ep.valid = (rng.random(len(ep)) > 0.2).tolist()
                eps.append(ep)
        scores = np.concatenate(dr_mas.row_scores(eps))
        uid = [ep.group_id for ep in eps for _ in range(len(ep))]
        agent = [key[0] for ep in eps for key in ep.state_keys]
        traj = [i for i, ep in enumerate(eps) for _ in range(len(ep))]
        for norm, index in (("global", uid), ("agent", [f"{u}_{a}" for u, a in zip(uid, agent)])):
            ref = _verbatim_released(scores, index, traj, norm == "agent")
            got = np.concatenate(dr_mas.team_advantages(eps, ROLES, norm))
            np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9)


def test_released_answerer_pool_is_the_global_pool():
    # one answerer row per trajectory, no invalid rows: the answerer's Dr. MAS pool holds the same
    # values as the global pool, so its advantages coincide; the searcher's (weighted by its turn
    # counts) do not
    eps = [_team_episode([0] * 3, 1.0), _team_episode([0], 0.0), _team_episode([0] * 2, 1.0),
           _team_episode([0] * 5, 0.0)]
    glob = dr_mas.team_advantages(eps, ROLES, "global")
    agent = dr_mas.team_advantages(eps, ROLES, "agent")
    np.testing.assert_allclose([a[-1] for a in agent], [a[-1] for a in glob], rtol=1e-12)
    assert max(abs(a[0] - b[0]) for a, b in zip(agent, glob)) > 0.1


def test_global_second_moment_identity():
    rng = np.random.default_rng(1)
    rs, ra = rng.normal(3, 2, 50), rng.binomial(1, 0.3, 50).astype(float)
    pool = np.concatenate([rs, ra])
    a = (pool - pool.mean()) / pool.std()  # population statistics
    np.testing.assert_allclose(dr_mas.global_second_moment(ra, pool), np.mean(a[50:] ** 2))
    np.testing.assert_allclose(dr_mas.global_second_moment(rs, pool), np.mean(a[:50] ** 2))
    with pytest.raises(ValueError, match="all equal"):
        dr_mas.global_second_moment([1.0], [1.0, 1.0])


def test_avg_pass_at_k_and_errors():
    assert dr_mas.avg_pass_at_k([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]) == (5 / 12, 2 / 3)
    with pytest.raises(ValueError, match="num_tasks, k"):
        dr_mas.avg_pass_at_k([1, 0])
    with pytest.raises(ValueError, match="normalisation"):
        dr_mas.normalise_rewards([1.0], [0], [0], "team")
    with pytest.raises(ValueError, match=r"\(N,\)"):
        dr_mas.normalise_rewards([1.0, 2.0], [0], [0, 0])
    with pytest.raises(ValueError, match="unit"):
        dr_mas.team_advantages([], ("searcher",), unit="step")
    with pytest.raises(ValueError, match="released form"):
        dr_mas.team_advantages([], ("searcher",), unit="episode")  # reward='team' by default
    with pytest.raises(ValueError, match="reward"):
        dr_mas.team_advantages([], ("searcher",), reward="own")
    with pytest.raises(ValueError, match="reward"):
        dr_mas.DrMASConfig(reward="own")


def test_env_expert_and_rewards():
    env = KGTeamEnv(num_entities=40, hops=(1, 2), evidence_reward=0.5)
    for seed in range(20):
        env.reset(seed)
        rewards, roles, done = [], [], False
        while not done:
            _, r, done, info = env.step(env.expert_actions()[0])
            rewards.append(r)
            roles.append(info["role"])
        h = env.task["hops"]
        assert info["success"] and roles == ["searcher"] * (2 * h + 1) + ["answerer"]
        assert rewards[2 * h] == 0.5 * h and rewards[-1] == 1.0 and sum(rewards[:2 * h]) == 0


def test_env_menu_semantics():
    env = KGTeamEnv(num_entities=40, hops=2, search_turns=3)
    env.reset(3)
    assert env.state_key()[0] == "searcher"
    _, r, done, info = env.step("open_top")  # nothing searched yet: an invalid call
    assert not info["valid"] and env.num_invalid == 1 and r == 0
    _, r, done, info = env.step("fly")  # off the menus: invalid, no turn used (never raises)
    assert not info["valid"] and "unknown action" in info["error"] and env.num_invalid == 2
    assert env.state_key()[0] == "searcher" and r == 0 and not done
    env.step("search_next")
    _, r, done, info = env.step("open_top")  # third searcher turn: the handoff is forced
    assert info["evidence"] == 1 and r == 1.0 and env.role == "answerer"
    _, r, done, info = env.step(0)  # a searcher action on the answerer's turn
    assert not info["valid"] and not done
    wrong = next(a for a in env.answerer_actions if a != env.expert_actions()[0])
    _, r, done, info = env.step(wrong)  # one hop of two read: no answer can be right
    assert done and r == 0.0 and not info["success"]


def test_train_moves_both_policies_and_logs_per_agent_norms():
    make = lambda: KGTeamEnv(num_entities=40, hops=(1, 2), evidence_reward=3.0)
    env = make()
    pols = {"searcher": KeyTablePolicy(len(SEARCHER_ACTIONS), seed=0),
            "answerer": KeyTablePolicy(len(env.answerer_actions), seed=1)}
    cfg = dr_mas.DrMASConfig(num_iters=3, num_prompts=2, group_size=4, normalisation="global",
                             reward="agent")
    hist = dr_mas.train(make, pols, cfg, list(range(50)),
                        evaluate=lambda p: dr_mas.evaluate_at_k(make, p, [1, 2], k=2))
    assert [h["iter"] for h in hist] == [0, 1, 2, 3]  # the start's evaluation, then each update
    assert all(h["losses/grad_norm_searcher"] >= 0 for h in hist[1:])
    assert set(hist[-1]) >= {"eval/avg@2", "eval/pass@2", "losses/grad_norm_answerer"}
    for p in pols.values():
        assert p.logits.abs().sum() > 0


def test_split_roles_and_team_act():
    ep = _team_episode([0, 0, 2.0], 1.0)  # action ids: searcher 0, 0, 0 then answerer 5 (global)
    ep.action_ids = [1, 2, 4, len(SEARCHER_ACTIONS) + 3]
    split = dr_mas.split_roles([ep], ("searcher", "answerer"),
                               {"searcher": 0, "answerer": len(SEARCHER_ACTIONS)})
    assert split["searcher"][0].action_ids == [1, 2, 4] and split["answerer"][0].action_ids == [3]
    assert split["searcher"][0].ret == 2.0 and split["answerer"][0].ret == 1.0
    env = KGTeamEnv(num_entities=40, hops=1)
    pols = {"searcher": KeyTablePolicy(len(SEARCHER_ACTIONS)),
            "answerer": KeyTablePolicy(len(env.answerer_actions))}
    with torch.no_grad():  # make each table deterministic: searcher 'handoff', answerer answer #2
        pols["searcher"].logits[:, 4] = 50.0
        pols["answerer"].logits[:, 2] = 50.0
    eps = dr_mas.play_episodes(lambda: KGTeamEnv(num_entities=40, hops=1),
                               dr_mas.team_act(pols), [0, 1], 2)
    for e in eps:
        assert e.actions == ["handoff", env.answerer_actions[2]]
        assert e.action_ids == [4, len(SEARCHER_ACTIONS) + 2]
