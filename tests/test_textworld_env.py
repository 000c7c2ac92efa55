"""TextWorld's generated games as an agent environment (``envs.textworld_env``): the protocol's
checker, the walkthrough wins each game, a malformed command gets the game's own answer, the same
seed gives the same game, the turn cap truncates, and the tool object for TRL."""

import inspect

import pytest

pytest.importorskip("textworld", reason="the optional extra agentrl[envs]")

from agentrl_lib.envs import protocol, tool_env  # noqa: E402
from agentrl_lib.envs.textworld_env import TextWorldEnv, TextWorldToolEnv, game_file  # noqa: E402

GAMES = [("tw-coin_collector", {"level": 5}), ("tw-treasure_hunter", {"level": 1}),
         ("tw-simple", {"rewards": "dense", "goal": "detailed", "test": False})]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("textworld")


def test_the_checker_passes(cache):
    protocol.check_env(lambda: TextWorldEnv(max_turns=4, cache=cache))


@pytest.mark.parametrize("challenge,settings", GAMES, ids=[g[0] for g in GAMES])
def test_the_walkthrough_wins_each_game(cache, challenge, settings):
    env = TextWorldEnv(challenge, settings, max_turns=40, cache=cache)
    env.reset(seed=3)
    plan = env.walkthrough()
    assert plan and env.expert_actions() == plan[:1]
    total = 0.0
    for turn, command in enumerate(plan, 1):
        assert command in env.admissible_commands()
        obs, r, done, info = env.step(command)
        total += r
        assert info["valid"] and done == (turn == len(plan))
    assert info["success"] and info["won"] and not info["truncated"]
    assert total == info["max_score"] > 0


def test_a_malformed_command_gets_the_games_answer_and_changes_nothing(cache):
    env = TextWorldEnv("tw-coin_collector", {"level": 5}, max_turns=7, cache=cache)
    first = env.reset(seed=3)
    key = env.state_key()
    obs, r, done, info = env.step("dance wildly")
    assert obs == "That's not a verb I recognise." == info["error"]
    assert not info["valid"] and r == 0.0 and not done and env.turn == 1 and env.num_invalid == 1
    assert info["state_key"] == key
    for bad in ("quit", "restart", "héllo", "", "x" * 300, None):
        obs, _, _, info = env.step(bad)
        assert not info["valid"] and info["state_key"] == key  # never reaches the game
    assert env.done and info["truncated"] and env.turn == 7  # the cap, counting invalid turns
    assert env.reset(seed=3) == first


def test_a_backslash_never_reaches_the_interpreter(cache):
    """dumb-frotz reads '\\' as its own escape: '\\exi ktata' (sampled by the tiny LM in a cpu run)
    put it in an endless loop of 'unknown command' that wrote gigabytes to stderr."""
    env = TextWorldEnv("tw-coin_collector", {"level": 2}, max_turns=7, cache=cache)
    env.reset(seed=3)
    key = env.state_key()
    for bad in ("\\exi ktata", "take \\b coin", "\\"):
        obs, r, done, info = env.step(bad)
        assert not info["valid"] and "backslash" in info["error"] and info["state_key"] == key


def test_generation_is_seeded(cache, tmp_path):
    a = TextWorldEnv("tw-coin_collector", {"level": 5}, cache=cache)
    b = TextWorldEnv("tw-coin_collector", {"level": 5}, cache=tmp_path)  # generated again
    assert a.reset(seed=3) == b.reset(seed=3) and a.walkthrough() == b.walkthrough()
    p1 = game_file("tw-coin_collector", {"level": 5}, 3, cache)
    p2 = game_file("tw-coin_collector", {"level": 5}, 3, tmp_path)
    assert p1.name == p2.name and p1.read_bytes() == p2.read_bytes()
    c = TextWorldEnv("tw-coin_collector", {"level": 5}, cache=cache)
    c.reset(seed=4)
    assert (c.reset(seed=4), c.walkthrough()) != (a.reset(seed=3), a.walkthrough())


def test_the_panel_is_held_out_and_hashed(cache):
    panel, h = TextWorldEnv(cache=cache).eval_panel(16)
    assert panel == list(range(protocol.PANEL_SEED, protocol.PANEL_SEED + 16)) and len(h) == 16
    assert h != TextWorldEnv("tw-coin_collector", {"level": 2}, cache=cache).eval_panel(16)[1]


def test_the_tool_object_for_trl(cache):
    make = lambda: TextWorldEnv("tw-coin_collector", {"level": 5}, max_turns=20, cache=cache)  # noqa: E731
    tools = tool_env.environment_factory(make, TextWorldToolEnv)()
    ref = make()
    assert tools.reset(seed=3, prompt=[{"role": "user", "content": "x"}]) == "\n" + ref.reset(seed=3)
    assert tools.act("dance") == "That's not a verb I recognise."
    for command in ref.walkthrough():
        assert tools.act(command) == ref.step(command)[0]
    assert tools.get_reward() == 1.0 and tools.act("look") == "The episode is over."
    public = [n for n, _ in inspect.getmembers(TextWorldToolEnv, inspect.isfunction)
              if not n.startswith("_") and n not in ("reset", "get_reward")]
    assert public == ["act"]


def test_the_plan_key_follows_the_walkthrough(cache):
    """state_key='plan': a command that changes nothing keeps the key, a move changes it, going
    back restores it; the observed key sees the same states (coin collector: exact)."""
    keys = {}
    for kind in ("plan", "observed"):
        env = TextWorldEnv("tw-coin_collector", {"level": 2}, max_turns=8, cache=cache,
                           state_key=kind)
        env.reset(seed=3)
        start = env.state_key()
        go = env.walkthrough()[0]
        back = {"north": "south", "south": "north", "east": "west", "west": "east"}[go.split()[1]]
        seen = [env.step(c)[3]["state_key"] for c in ("look", "inventory", go, "go " + back)]
        assert seen[0] == start and seen[2] != start and seen[3] == start
        keys[kind] = seen
    assert keys["plan"][2] == (3, ("take coin",), 0)
    with pytest.raises(ValueError, match="state_key"):
        TextWorldEnv(state_key="text")


def test_registered_and_played_by_the_scripted_policy(cache):
    """AGENT_ENVS['textworld'] is the environment of the SFT bases; the scripted policy plays the
    walkthrough at epsilon 0 and only admissible commands at epsilon 1 (sft.scripted_policy)."""
    import numpy as np

    from agentrl_lib.algorithms.sft import TW_AGENT_GAME, scripted_policy
    from agentrl_lib.envs import AGENT_ENVS, make_agent_env
    from agentrl_lib.rollout import play_episodes

    assert AGENT_ENVS["textworld"] is TextWorldEnv
    make = lambda: make_agent_env("textworld", **TW_AGENT_GAME, cache=cache)  # noqa: E731
    best = play_episodes(make, scripted_policy(0.0, np.random.default_rng(0)), [3, 4], 1)
    assert all(ep.success and len(ep) == 2 for ep in best)
    noisy = play_episodes(make, scripted_policy(1.0, np.random.default_rng(0)), [3], 3)
    assert all(all(ep.valid) for ep in noisy) and len({tuple(ep.actions) for ep in noisy}) > 1
