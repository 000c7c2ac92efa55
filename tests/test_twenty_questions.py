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


def test_expert_actions_by_hand():
    # three turns, gamma 1: "red" (ant, bee | cow, dog) and "round" (ant, cow | bee, dog) split
    # 2|2 and always win (Q = 1); a guess wins 1/4 + 3/4 * 2/3 = 3/4, "sweet" (1|3) also 3/4
    env = tiny(max_turns=3)
    env.reset(seed=0, item="cow")
    assert env.expert_actions() == ["Is it red?", "Is it round?"]
    env.step("Is it red?")  # No: {cow, dog}, two turns left
    # "round" splits cow | dog (Q = 1); guessing cow or dog wins now or next turn (Q = 1);
    # "sweet", "red" again or guessing ant (eliminated) leave a coin flip (Q = 1/2)
    assert env.expert_actions() == ["Is it round?", "Is it a cow?", "Is it a dog?"]
    env.step("Is it round?")  # Yes: {cow}
    assert env.expert_actions() == ["Is it a cow?"]
    # two turns at gamma 0.5: only guesses are optimal (3/8 > 1/4, see test_v_star_by_hand)
    env2 = tiny(max_turns=2, gamma=0.5)
    env2.reset(seed=0)
    assert env2.expert_actions() == ["Is it an ant?", "Is it a bee?", "Is it a cow?", "Is it a dog?"]
    with pytest.raises(RuntimeError):
        tiny().expert_actions()


def test_scripted_expert_always_wins_and_epsilon_matches_the_exact_value():
    from agentrl_lib.algorithms.sft import scripted_policy

    make = lambda: tiny(max_turns=3)  # noqa: E731
    eps = play_episodes(make, scripted_policy(0.0, np.random.default_rng(0)), list(range(40)))
    assert all(e.success for e in eps) and all(len(e) <= 3 for e in eps)
    # the epsilon-noisy expert: sampled success within 3 standard errors of the exact value
    env = make()
    env.reset(seed=0)
    A = len(env.actions)
    _, q = env.optimal_values()

    def noisy(k, e=0.5):
        best = (q(k) >= q(k).max() - 1e-9).astype(float)
        return (1 - e) * best / best.sum() + e / A

    exact = env.success_probability(noisy)
    eps = play_episodes(make, scripted_policy(0.5, np.random.default_rng(1)), list(range(2000)))
    assert abs(np.mean([e.success for e in eps]) - exact) < 3 * np.sqrt(exact * (1 - exact) / 2000)


def test_brief_observations_keep_the_state():
    full, brief = tiny(max_turns=3), tiny(max_turns=3, brief=True)
    assert full.reset(seed=0, item="cow") == brief.reset(seed=0, item="cow")
    o_full, *_ = full.step("Is it red?")
    o_brief, r, done, info = brief.step("Is it red?")
    assert o_brief == "No. Turn 2/3." and o_full.startswith("No. Turn 2/3.") and len(o_full) > 40
    assert info["state_key"] == full.state_key() and not done
    o_bad, *_ = brief.step("Is it purple?")
    assert o_bad.startswith("Invalid question") and o_bad.endswith("Turn 3/3.")
