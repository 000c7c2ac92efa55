"""The larger gridworlds (named layouts, key-door, subtasks in a row) against their exact tabular
forms: V* = the expert's return, optimal step counts, invalid actions, turn caps, panel hashes and
observation round trips."""

import math

import numpy as np
import pytest

from agentrl_lib.algorithms import dp
from agentrl_lib.algorithms.sft import scripted_policy
from agentrl_lib.envs import AGENT_ENVS, make_agent_env
from agentrl_lib.envs.multiturn import LAYOUTS, SUBTASK_VARIANTS, GridAgentEnv, SubtaskGridEnv
from agentrl_lib.rollout import play_episodes


def play_expert(env, **reset_kw):
    """Play the first expert action until the end: (discounted return, steps, last info)."""
    env.reset(**reset_kw)
    gamma = env.gamma if isinstance(env, SubtaskGridEnv) else env.kw["gamma"]
    ret, disc, done, n = 0.0, 1.0, False, 0
    while not done:
        _, r, done, info = env.step(env.expert_actions()[0])
        ret, disc, n = ret + disc * r, disc * gamma, n + 1
    return ret, n, info


@pytest.mark.parametrize("variant,steps", [("keydoor", {(0, 0): 30}),
                                           ("abc", {(2, 2): 16, (4, 3): 19, (4, 4): 20})])
def test_subtask_v_star_is_the_expert_return(variant, steps):
    env = SubtaskGridEnv(variant)
    assert sorted(env.tasks) == sorted(steps)
    for start, n_opt in steps.items():
        mdp = env.tabular_form(start)
        v, _, _, _ = dp.value_iteration(mdp)
        ret, n, info = play_expert(env, task=start)
        assert info["success"] and not info["truncated"] and n == n_opt
        assert info["state_key"][1] == env.num_stages  # every waypoint done
        # deterministic: the expert's discounted return is V*(start) exactly, gamma^(n-1) * 1
        assert abs(ret - v[env.index(start, 0)].item()) < 1e-12
        assert abs(ret - env.gamma ** (n_opt - 1)) < 1e-12
    assert steps.get((0, 0), 30) >= 30  # the key-door task is long-horizon


def test_keydoor_door_needs_the_key_and_stage_is_in_the_state():
    env = SubtaskGridEnv("keydoor")
    mdp = env.tabular_form()
    door, right = (4, 6), env.action_index("right")
    # at (4,5): right into the door stays without the key (stage 0), passes with it (stage 1)
    s0, s1 = env.index((4, 5), 0), env.index((4, 5), 1)
    assert mdp.P[s0, right, s0].item() == 1.0
    assert mdp.P[s1, right, env.index(door, 1)].item() == 1.0
    # entering the key cell advances the stage; entering the goal ends the episode with reward 1
    assert mdp.P[env.index((2, 1), 0), env.action_index("left"), env.index((2, 0), 1)] == 1.0
    into_goal = env.index((6, 1), 1), env.action_index("left")
    assert mdp.R[into_goal].item() == 1.0 and mdp.terminal[env.index((6, 0), 2)]
    # the same cell is two states: next to the door, 9 steps to the goal with the key; without
    # it, 7 back to the key, 7 to the door again, then the 9
    v, _, _, _ = dp.value_iteration(mdp)
    for stage, n in [(1, 9), (0, 23)]:
        assert abs(v[env.index((4, 5), stage)].item() - env.gamma ** (n - 1)) < 1e-12
    env.reset(task=(0, 0))
    seen = []
    for _ in range(30):
        seen.append(env.state_key())
        env.step(env.expert_actions()[0])
    assert [k[1] for k in seen] == [0] * 14 + [1] * 16  # the key is picked up at step 14


def test_invalid_actions_leave_the_state_and_the_cap_truncates():
    for env in [SubtaskGridEnv("keydoor", invalid_penalty=-0.1), SubtaskGridEnv("abc", max_turns=3),
                GridAgentEnv(layout="7x7", show_walls=False, max_turns=3)]:
        env.reset(seed=5)
        key = env.state_key()
        obs, r, done, info = env.step("north, please")
        assert not info["valid"] and env.state_key() == key and info["state_key"] == key
        assert "Invalid" in obs and r == getattr(env, "invalid_penalty", 0.0) and env.num_invalid == 1
        for _ in range(env.max_turns - 1):
            _, _, done, info = env.step("up")
        assert done and info["truncated"] == (not info.get("success", False))
    env = SubtaskGridEnv("keydoor", max_turns=29)  # one turn short of the optimum
    ret, n, info = play_expert(env, task=(0, 0))
    assert n == 29 and info["truncated"] and not info["success"] and ret == 0.0


def test_subtask_rewards_and_slip_match_the_tabular_form():
    env = SubtaskGridEnv("abc", subtask_reward=0.5)
    ret, n, _ = play_expert(env, task=(2, 2))
    # A after 4 steps, B after 8, C after 16: 0.5 g^3 + 0.5 g^7 + 1 g^15
    g = env.gamma
    assert abs(ret - (0.5 * g ** 3 + 0.5 * g ** 7 + g ** 15)) < 1e-12
    v, _, _, _ = dp.value_iteration(env.tabular_form((2, 2)))
    assert abs(ret - v[env.index((2, 2), 0)].item()) < 1e-12
    env = SubtaskGridEnv("abc", slip=0.2, max_turns=1)
    mdp = env.tabular_form((2, 2))
    counts = {}
    for seed in range(2000):
        env.reset(seed=seed, task=(2, 2))
        env.step("up")
        counts[env.state_index()] = counts.get(env.state_index(), 0) + 1
    p = mdp.P[env.index((2, 2), 0), env.action_index("up")].numpy()
    assert set(counts) == set(np.flatnonzero(p))
    for s, k in counts.items():
        assert abs(k / 2000 - p[s]) < 4 * np.sqrt(p[s] * (1 - p[s]) / 2000) + 1e-9


def test_named_layouts_optimal_steps_fit_the_default_cap():
    for name, longest in [("4x4", 6), ("5x5", 8), ("7x7", 12)]:
        env = GridAgentEnv(layout=name)
        assert env.layout == LAYOUTS[name]
        worst = 0
        for s, g in env.tasks:
            v, _, _, _ = dp.value_iteration(env.tabular_form(s, g))
            worst = max(worst, round(math.log(v[s[0] * env.cols + s[1]].item(), env.kw["gamma"])) + 1)
        assert worst == longest <= env.max_turns
    # the expert reaches V* on the 7x7 layout, walls hidden from the observations
    env = GridAgentEnv(layout="7x7", show_walls=False)
    for seed in range(5):
        ret, n, info = play_expert(env, seed=seed)
        s, g = env.task
        v, _, _, _ = dp.value_iteration(env.tabular_form(s, g))
        assert info["success"] and abs(ret - v[s[0] * env.cols + s[1]].item()) < 1e-12
        assert "Walls" not in env.reset(seed=seed)
    assert "Walls: (0,3)" in GridAgentEnv(layout="7x7").reset(seed=0)


def test_default_grid_is_unchanged():
    env = GridAgentEnv()
    assert env.layout == ["....", ".#..", "...#", "#..."] and env.max_turns == 12
    assert env.reset(seed=0, task=((0, 0), (3, 3))) == (
        "Turn 1/12. You are at row 0, column 0. The goal is at row 3, column 3. "
        "Walls: (1,1) (2,3) (3,0). Move: up, down, left, right?")


def test_panel_hashes_are_stable():
    # computed once; a change means the panel or the game changed (old numbers not comparable)
    expected = {
        "grid": (GridAgentEnv(), "e5be829bea70a911"),
        "grid-tiny": (GridAgentEnv(layout=["...", ".#.", "..."], max_turns=4), "95039f7a98f261c1"),
        "grid-5x5": (GridAgentEnv(layout="5x5", show_walls=False), "c607f0d2084e28a3"),
        "grid-7x7": (GridAgentEnv(layout="7x7", show_walls=False), "d03937d6434a6f37"),
        "keydoor": (SubtaskGridEnv("keydoor"), "64ed77a9e143d4e3"),
        "abc": (SubtaskGridEnv("abc"), "b2c2d38c62caffab"),
    }
    for name, (env, h) in expected.items():
        panel, got = env.eval_panel()
        assert got == h, (name, got)
        assert env.eval_panel()[0] == panel and len(panel) == 64
        for seed, task in panel[:8]:  # the panel's tasks are those reset(seed) draws
            env.reset(seed=seed)
            assert env.task == task
    env = SubtaskGridEnv("keydoor")
    panel, h = env.eval_panel()
    assert SubtaskGridEnv("keydoor", max_turns=41).panel_hash(panel) != h
    assert GridAgentEnv(show_walls=False).eval_panel()[1] != expected["grid"][1]


def test_observation_round_trips():
    for variant in SUBTASK_VARIANTS:
        env = SubtaskGridEnv(variant)
        for s in range(env.tabular_form().num_states):
            cell, stage = env.state_of(s)
            if stage == env.num_stages or not env._open(cell, stage):
                continue
            assert env.index(cell, stage) == s
            for turn in (0, 7):
                obs = env.observation_at(cell, stage, turn)
                assert env.parse_observation(obs) == (cell, stage, turn) and len(obs) <= 45
        # the rendered observation is what the episode shows
        obs = env.reset(seed=3)
        assert obs == env.observation_at(env.pos, env.stage, 0)
        obs, _, _, info = env.step("down")
        assert env.parse_observation(obs) == (*info["state_key"], 1)
    env = GridAgentEnv(layout="5x5", max_turns=8, memory=True)
    obs = env.reset(seed=2)
    assert obs == env.observation_at(env.pos, env.task, 0)
    obs, *_ = env.step("zzz")
    assert obs.endswith(env.observation_at(env.pos, env.task, 1)) and "goal" not in obs
    assert env.turn == 1 and env.observation_at((0, 0), env.task, 5).startswith("Turn 6/8.")


def test_registered_and_playable_by_the_scripted_policy():
    assert AGENT_ENVS["subtask_grid"] is SubtaskGridEnv
    make = lambda: make_agent_env("subtask_grid", variant="abc")  # noqa: E731
    eps = play_episodes(make, scripted_policy(0.0, np.random.default_rng(0)), [0, 1, 2], 2)
    assert all(ep.success for ep in eps)
    assert {len(ep) for ep in eps} <= {16, 19, 20}
    with pytest.raises(ValueError, match="unknown variant"):
        SubtaskGridEnv("maze")
    with pytest.raises(ValueError, match="exactly once"):
        SubtaskGridEnv("abc", layout=["A.S", "..B"])
