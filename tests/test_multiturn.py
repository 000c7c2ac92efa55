"""The multi-turn text environment protocol and the text gridworld against its tabular form."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import dp
from agentrl_lib.envs import tabular as T
from agentrl_lib.envs.multiturn import GridAgentEnv, parse_action


def test_protocol_and_optimal_play_matches_v_star():
    env = GridAgentEnv(gamma=0.9, max_turns=20)
    for seed in range(10):
        obs = env.reset(seed=seed)
        assert "goal is at" in obs and isinstance(obs, str)
        start, goal = env.task
        mdp = env.tabular_form(start, goal)
        v, pi, _, _ = dp.value_iteration(mdp)
        ret, disc, done, t = 0.0, 1.0, False, 0
        while not done:
            a = T.GRID_ACTIONS[int(pi[env.state_index()].argmax())]
            obs, r, done, info = env.step(f"I move {a}")
            ret += disc * r
            disc *= mdp.gamma
            t += 1
        assert info["success"] and info["valid"] and info["state_key"] == (goal, goal)
        # deterministic grid: the discounted return of optimal play is V*(start) exactly
        assert abs(ret - v[start[0] * env.cols + start[1]].item()) < 1e-12


def test_malformed_actions_never_crash():
    env = GridAgentEnv(invalid_penalty=-0.1, max_turns=3)
    env.reset(seed=0)
    key = env.state_key()
    for text in ["", "north!", "{'tool': 'move'}", "1234", "\n\n"]:
        env.reset(seed=0)
        obs, r, done, info = env.step(text)
        assert not info["valid"] and "Invalid action" in obs and r == -0.1
        assert env.state_key() == key and info["error"]
    assert env.num_invalid == 5
    env.reset(seed=0)
    for _ in range(3):
        _, _, done, info = env.step("???")
    assert done and info["truncated"]  # the turn cap still ends an invalid-only episode


def test_memory_variant_hides_the_goal_after_the_first_turn():
    env = GridAgentEnv(memory=True)
    first = env.reset(seed=1)
    assert "goal is at" in first
    obs, _, done, info = env.step("right")
    if not done:
        assert "goal is at" not in obs and info["state_key"][1] == env.task[1]


def test_state_keys_repeat_across_episodes():
    env = GridAgentEnv(tasks=[((0, 0), (3, 3))], max_turns=6)
    keys = []
    for seed in range(4):
        env.reset(seed=seed)
        for a in ["down", "up", "down"]:
            keys.append(env.step(a)[3]["state_key"])
    assert len(set(keys)) < len(keys)  # the same (cell, goal) shows up again: anchor states


def test_slippery_sampling_matches_tabular_form():
    env = GridAgentEnv(tasks=[((0, 0), (3, 3))], slip=0.2, max_turns=1)
    mdp = env.tabular_form((0, 0), (3, 3))
    counts = {}
    for seed in range(3000):
        env.reset(seed=seed)
        env.step("right")
        counts[env.pos] = counts.get(env.pos, 0) + 1
    p = mdp.P[0, env.action_index("right")]
    for cell, n in counts.items():
        expect = p[cell[0] * env.cols + cell[1]].item()
        assert abs(n / 3000 - expect) < 4 * np.sqrt(expect * (1 - expect) / 3000) + 1e-9


def test_bad_tasks_and_order():
    with pytest.raises(ValueError, match="bad task"):
        GridAgentEnv(tasks=[((1, 1), (0, 0))])  # (1, 1) is a wall in the default layout
    with pytest.raises(RuntimeError, match="reset"):
        GridAgentEnv().step("up")
    assert parse_action("UP", GridAgentEnv.actions) == "up"
    assert torch.is_tensor(GridAgentEnv().tabular_form((0, 0), (0, 1)).P)
