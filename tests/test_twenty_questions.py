"""TwentyQuestions: protocol, malformed questions, and exact belief-state values checked by hand."""

import numpy as np
import pytest

from agentrl_lib.envs.twenty_questions import CATALOG, TwentyQuestionsEnv
from agentrl_lib.models.policies import tabular_agent
from agentrl_lib.rollout import play_episodes

# 4 items x 3 attributes, small enough to solve on paper
TABLE = {"ant": (1, 1, 1), "bee": (1, 0, 0), "cow": (0, 1, 0), "dog": (0, 0, 0)}
COLS = ["red", "round", "sweet"]


def tiny(**kw):
    return TwentyQuestionsEnv(items=list(TABLE), table=TABLE, table_attributes=COLS, **kw)


def test_catalog_rows_are_distinct_so_every_item_is_identifiable():
    rows = list(CATALOG.values())
    assert len(set(rows)) == len(rows)


def test_v_star_by_hand_on_four_items():
    # two turns, gamma 0.5:
    #   guess first:      1/4 * 1 + 3/4 * 0.5 * (1/3)          = 3/8
    #   ask "red" (2|2):  0.5 * (1/2)                           = 1/4
    #   ask "sweet" (1|3): 1/4 * 0.5 * 1 + 3/4 * 0.5 * (1/3)    = 1/4
    env = tiny(max_turns=2)
    v, q = env.optimal_values(gamma=0.5)
    q0 = q(env.start_key())
    assert v(env.start_key()) == pytest.approx(3 / 8)
    assert q0[:3] == pytest.approx([1 / 4, 1 / 4, 1 / 4])
    assert q0[3:] == pytest.approx([3 / 8] * 4)
    # gamma 1: every first move wins with probability 1/2 in two turns; three turns always win
    v1, _ = env.optimal_values(gamma=1.0)
    assert v1(env.start_key()) == pytest.approx(0.5)
    v3, q3 = tiny(max_turns=3).optimal_values(gamma=1.0)
    assert v3(((0, 1, 2, 3), 0)) == pytest.approx(1.0)
    assert q3(((0, 1, 2, 3), 0))[2] == pytest.approx(1 / 4 + 3 / 4 * (1 / 3 + 2 / 3 * 1 / 2))


def test_policy_values_uniform_and_optimal():
    env = tiny(max_turns=1)
    A = len(env.actions)  # 3 questions + 4 guesses
    # one turn: only a guess can win, each with chance 1/4
    assert env.success_probability(lambda k: np.ones(A) / A) == pytest.approx(4 / 7 * 1 / 4)
    env = tiny(max_turns=3)
    v_star, q_star = env.optimal_values(gamma=0.9)
    greedy = lambda k: np.eye(A)[int(np.argmax(q_star(k)))]  # noqa: E731
    v_pi, q_pi = env.policy_values(greedy, gamma=0.9)
    assert v_pi(env.start_key()) == pytest.approx(v_star(env.start_key()))
    # A^pi(s, pi(s)) = 0 for a deterministic policy
    k = env.start_key()
    assert q_pi(k)[int(np.argmax(q_star(k)))] - v_pi(k) == pytest.approx(0.0)


def test_text_protocol_follows_the_belief_state():
    env = tiny(max_turns=4, step_cost=0.1)
    obs = env.reset(seed=0, item="cow")
    assert "ant, bee, cow, dog" in obs and env.state_key() == ((0, 1, 2, 3), 0)
    obs, r, done, info = env.step("Is it red?")
    assert obs.startswith("No.") and info["state_key"] == ((2, 3), 1) and r == pytest.approx(-0.1)
    obs, r, done, info = env.step("is it a DOG")
    assert obs.startswith("No.") and info["state_key"] == ((2,), 2) and not done
    obs, r, done, info = env.step("Is it a cow?")
    assert done and info["success"] and not info["truncated"] and r == pytest.approx(0.9)
    assert info["item"] == "cow" and info["valid"]


def test_turn_cap_and_malformed_questions_never_crash():
    env = tiny(max_turns=3, invalid_penalty=-0.5)
    env.reset(seed=1)
    key = env.state_key()
    for text in ["", "Is it purple?", "{'guess': 'ant'}", "ant", "\n\n", "Is it a zebra?"]:
        env.reset(seed=1)
        obs, r, done, info = env.step(text)
        assert not info["valid"] and info["error"] and obs.startswith("Invalid question")
        assert r == -0.5 and env.state_key() == ((0, 1, 2, 3), 1) and not done
    assert env.num_invalid == 6 and key == ((0, 1, 2, 3), 0)
    env.reset(seed=1, item="ant")
    for _ in range(3):
        obs, _, done, info = env.step("Is it round?")
    assert done and info["truncated"] and not info["success"] and "Game over" in obs
    with pytest.raises(ValueError):
        TwentyQuestionsEnv(items=["dog", "unicorn"])


def test_sampled_success_matches_the_exact_value():
    env = tiny(max_turns=2)
    A = len(env.actions)
    exact = env.success_probability(lambda k: np.ones(A) / A)
    rng = np.random.default_rng(0)
    eps = play_episodes(lambda: tiny(max_turns=2), tabular_agent(np.ones((1, A)) / A,
                        lambda e: 0, rng), seeds=list(range(4000)))
    est = np.mean([ep.success for ep in eps])
    assert abs(est - exact) < 3 * np.sqrt(exact * (1 - exact) / 4000)
    # the state keys in the episode record are those of the tabular form
    ep = eps[0]
    assert ep.state_keys[0] == env.start_key() and all(k[1] == t for t, k in enumerate(ep.state_keys))


def test_eval_panel_is_fixed_balanced_and_hashed():
    env = TwentyQuestionsEnv()
    panel, h = env.eval_panel(16)
    panel2, h2 = TwentyQuestionsEnv().eval_panel(16)
    assert panel == panel2 and h == h2 and len(h) == 16
    assert sorted(it for _, it in panel) == sorted(env.items * 2)
    assert TwentyQuestionsEnv(max_turns=5).eval_panel(16)[1] != h
    env.reset(seed=panel[3][0], item=panel[3][1])
    assert env.item == panel[3][1]


def test_key_features():
    env = tiny(max_turns=3)
    x = env.key_features(((0, 2), 1))
    assert x.tolist() == [1, 0, 1, 0, 0, 1, 0, 0]
