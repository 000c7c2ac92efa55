"""The chain step MDP: hand-computed occupancies, exact DP optima, sampling and text."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import dp
from agentrl_lib.envs.chain_steps import (
    REDUNDANT,
    STOP,
    USEFUL,
    WRONG,
    ChainSteps,
    best_stationary,
    deterministic_policies,
)
from agentrl_lib.envs.text_tasks import make_problems


def test_uniform_policy_by_hand():
    # k = 1, cap 2: success = Pr[useful then stop] = 1/16; truncated = (3/4)^2; steps 3/4 + 9/16;
    # redundant 1/4 (t=0) + (1/4 * 2/4 + 1/4 * 1/4 + 1/4 * 2/4) (t=1) = 9/16
    env = ChainSteps(1, 2)
    occ = env.occupancy(np.full((env.num_obs, 4), 0.25))
    assert occ["success"] == pytest.approx(1 / 16)
    assert occ["truncated"] == pytest.approx(9 / 16)
    assert occ["steps"] == pytest.approx(21 / 16)
    assert occ["redundant"] == pytest.approx(9 / 16)
    assert occ["wrong"] == pytest.approx(1 / 4 + 3 / 16)
    assert occ["turns"] == pytest.approx(occ["steps"] + 1 - 9 / 16)


def test_straight_policy_and_turn_indexed():
    env = ChainSteps(3, 6)
    pi = np.zeros((env.num_obs, 4))
    pi[:, USEFUL] = 1.0
    pi[env.obs_index(3, 0)] = np.eye(4)[STOP]
    occ = env.occupancy(pi)
    assert occ["success"] == 1.0 and occ["steps"] == 3.0 and occ["redundant"] == 0.0
    assert env.expected_return(pi, (0.9, 0.9, 0.1)) == pytest.approx(1 + 4 * 0.9)  # + the answer
    no_answer = env.expected_return(pi, (0.9, 0.9, 0.1), answer_scored=False)
    assert no_answer == pytest.approx(1 + 3 * 0.9)
    # a turn-indexed copy of the same policy gives the same numbers; a batch of two as well
    timed = np.broadcast_to(pi, (env.max_turns,) + pi.shape)
    assert env.occupancy(timed)["success"] == 1.0
    both = env.occupancy(np.stack([pi, np.full_like(pi, 0.25)]))
    assert both["success"][0] == 1.0 and 0 < both["success"][1] < 1


@pytest.mark.parametrize("first_only", [False, True])
@pytest.mark.parametrize("answer_scored", [False, True])
def test_occupancy_equals_dp_policy_evaluation(first_only, answer_scored):
    env = ChainSteps(2, 5)
    r = (0.7, 0.3, -0.2)
    mdp = env.tabular_form(r, 2.0, first_only, answer_scored)
    rng = np.random.default_rng(0)
    for _ in range(3):
        pi = rng.dirichlet(np.ones(4), size=env.num_obs)
        v = dp.policy_evaluation(mdp, env.stationary_to_states(pi))[env.state_index(0, 0, 0)]
        ours = env.expected_return(pi, r, 2.0, first_only, answer_scored)
        assert ours == pytest.approx(v.item(), abs=1e-12)


def test_optimal_q_raw_prm_runs_to_the_cap():
    # a policy that counts turns: redundant steps until the last turn, then answer:
    # V* = success 1 + (T - 1) steps x 0.9 + the answer's 0.9 (every correct step pays 0.9)
    env = ChainSteps(3, 8)
    q = env.tabular_form((0.9, 0.9, 0.1)).optimal_q()
    assert q[env.state_index(0, 0, 0)].max().item() == pytest.approx(1 + 8 * 0.9)
    assert q[env.state_index(7, 3, 0)].argmax().item() == STOP
    assert q[env.state_index(6, 3, 0), REDUNDANT].item() > q[env.state_index(6, 3, 0), STOP].item()
    # success only: the optimum is the success, 1
    q0 = env.tabular_form((0.0, 0.0, 0.0)).optimal_q()
    assert q0[env.state_index(0, 0, 0)].max().item() == pytest.approx(1.0)


def test_best_stationary():
    env = ChainSteps(2, 6)
    assert deterministic_policies(env.num_obs).shape == (4 ** 6, 6, 4)
    pi, v, occ = best_stationary(env, (0.0, 0.0, 0.0))
    assert v == pytest.approx(1.0) and occ["steps"] == pytest.approx(2.0)
    assert pi[env.obs_index(2, 0)].argmax() == STOP and pi[env.obs_index(0, 0)].argmax() == USEFUL
    # raw PRM at 0.8 per correct step: looping 6 turns (4.8) beats 2 steps + answer (1 + 3 x 0.8)
    pi, v, occ = best_stationary(env, (0.8, 0.8, 0.2))
    assert v == pytest.approx(6 * 0.8) and occ["success"] == 0.0 and occ["truncated"] == 1.0
    assert pi[env.obs_index(2, 0)].argmax() != STOP
    # a penalty on every step (clip-like) keeps the short chain
    _, v, occ = best_stationary(env, (-0.05, -0.05, -0.4))
    assert v == pytest.approx(1 - 3 * 0.05) and occ["steps"] == pytest.approx(2.0)


def test_rollout_matches_occupancy():
    env = ChainSteps(3, 7)
    rng = np.random.default_rng(1)
    pi = rng.dirichlet(np.ones(4), size=env.num_obs)
    occ = env.occupancy(pi)
    ro = env.rollout(pi, 40_000, rng)
    for key in ("success", "truncated", "redundant", "wrong", "useful"):
        assert ro[key].mean() == pytest.approx(occ[key], abs=0.03), key
    assert np.array_equal(ro["num_steps"], ro["useful"] + ro["redundant"] + ro["wrong"])
    # the step mask is a prefix, and only stopped episodes can succeed
    assert np.array_equal(ro["step_mask"], np.arange(7) < ro["num_steps"][:, None])
    assert not (ro["success"] & ro["truncated"]).any()
    assert np.array_equal(ro["turn_mask"].sum(-1), ro["num_steps"] + ro["stopped"])
    assert np.array_equal(ro["correct"].sum(-1), ro["useful"] + ro["redundant"] + ro["success"])


def test_render_agrees_with_success():
    env = ChainSteps(3, 7)
    probs = make_problems("chain", 20, difficulty=3, seed=0)
    two = ChainSteps(2, 5)
    text = two.render({"steps": ["+4", "*2"], "values": [3, 7, 14]}, [0, 2, 3])
    assert text == "3+4=7\n7*2=15\nanswer 15"
    rng = np.random.default_rng(2)
    pi = np.full((env.num_obs, 4), 0.25)
    pi[env.obs_index(3, 0)] = [0.1, 0.1, 0.1, 0.7]
    ro = env.rollout(pi, 200, rng)
    for p, acts, ok, stopped in zip(probs * 10, ro["actions"], ro["success"], ro["stopped"]):
        text = env.render(p, [a for a in acts if a >= 0])
        if stopped and ok:
            assert text.endswith(f"answer {p['answer']}")
        if not stopped:
            assert "answer" not in text
    with pytest.raises(ValueError, match="step kind"):
        env.render(probs[0], [7])


def test_bad_input():
    with pytest.raises(ValueError, match="max_turns"):
        ChainSteps(3, 3)
    env = ChainSteps(2, 4)
    with pytest.raises(ValueError, match="policy shape"):
        env.occupancy(np.ones((3, 4)))
    with pytest.raises(ValueError, match="3 values"):
        env.tabular_form((1.0, 2.0))
    with pytest.raises(ValueError, match="stop ends"):
        env.transition(0, 0, STOP)
    assert env.transition(2, 0, USEFUL) == (2, 0) and env.transition(2, 0, WRONG) == (2, 1)
    assert torch.allclose(env.stationary_to_states(np.full((6, 4), 0.25)).sum(-1),
                          torch.ones(env.num_states, dtype=torch.float64))
