"""Bad input to every agent environment (issue 29): huge integers, non-strings, very long and
non-ASCII text are the environment's ordinary invalid action (the same reward, end, state and count
as a plainly malformed one), never an exception; the parsed-action caps are the documented ones."""

import pytest

from agentrl_lib.envs import kg_search, protocol, tool_env
from agentrl_lib.envs.calc_tool import CalcToolEnv
from agentrl_lib.envs.kg_judge import KGJudgeEnv
from agentrl_lib.envs.kg_search import KGSearchEnv, SearchIndex
from agentrl_lib.envs.kg_team import KGTeamEnv
from agentrl_lib.envs.memory_grid import MemoryGridEnv
from agentrl_lib.envs.multiturn import GridAgentEnv, SubtaskGridEnv
from agentrl_lib.envs.shop import ShopEnv
from agentrl_lib.envs.twenty_questions import TwentyQuestionsEnv

KG = dict(num_entities=40, num_relations=2)
PENALTY = 0.25  # nonzero, so a bad action that skipped the cost would show
# every text environment with its invalid-action cost set (the grids, the shop, twenty questions and
# the calculator take the reward itself; the KG environments the penalty they subtract)
TEXT_ENVS = {
    "grid": lambda: GridAgentEnv(max_turns=6, invalid_penalty=-PENALTY),
    "keydoor": lambda: SubtaskGridEnv("keydoor", max_turns=8, invalid_penalty=-PENALTY),
    "memory_grid": lambda: MemoryGridEnv(max_turns=6, invalid_penalty=-PENALTY),
    "twenty_questions": lambda: TwentyQuestionsEnv(max_turns=4, invalid_penalty=-PENALTY),
    "shop": lambda: ShopEnv(max_turns=6, invalid_penalty=-PENALTY),
    "shop_short": lambda: ShopEnv(max_turns=6, obs_format="short", invalid_penalty=-PENALTY),
    "kg_search": lambda: KGSearchEnv(**KG, max_turns=5, invalid_penalty=PENALTY),
    "kg_judge": lambda: KGJudgeEnv(**KG, max_turns=5, decoy_first=0.5, invalid_penalty=PENALTY),
    "calc_tool": lambda: CalcToolEnv(max_turns=4, invalid_penalty=-PENALTY),
}
# the classes of input of issue 29, beyond protocol.BAD_ACTIONS
ODD = ("open(d99999999999999999999)", "open(d-99999999999999999999)", "buy[99999999999999999999]",
       "click[" + "9" * 4000 + "]", "ｌｅｆｔ", "ｏｐｅｎ(d1)", "Is it ａｌｉｖｅ?",
       "x" * protocol.MAX_ACTION_CHARS + "y", "search[" * 584, 10**30, -(10**30), float("nan"),
       True, {"tool": "search"}, object())
REFERENCE = "?"  # a plainly malformed action, invalid in every environment


def _one_step(make_env, action, seed):
    env = make_env()
    env.reset(seed=seed)
    obs, r, done, info = env.step(action)
    return env, obs, r, done, info


@pytest.mark.parametrize("name", list(TEXT_ENVS))
def test_bad_input_is_the_ordinary_invalid_action(name):
    make_env = TEXT_ENVS[name]
    for seed in (0, 3):
        ref_env, ref_obs, ref_r, ref_done, ref_info = _one_step(make_env, REFERENCE, seed)
        assert not ref_info["valid"] and ref_env.num_invalid == 1
        for bad in protocol.BAD_ACTIONS + ODD:
            env, obs, r, done, info = _one_step(make_env, bad, seed)
            what = f"{name}.step({repr(bad)[:30]})"
            assert not info["valid"] and info["error"], what
            assert r == ref_r == -PENALTY, f"{what}: reward {r}, the invalid cost is {ref_r}"
            assert done == ref_done and info["truncated"] == ref_info["truncated"], what
            assert info["state_key"] == ref_info["state_key"], f"{what}: the state moved"
            assert env.num_invalid == 1, f"{what}: counted {env.num_invalid} times"
            assert env.turn == ref_env.turn == 1, f"{what}: the turn was not used"
            # the same kind of observation: the error line, then (where the env shows one) the page
            assert obs.split(":")[0].split(".")[0] == ref_obs.split(":")[0].split(".")[0], what


def test_menu_environments_refuse_bad_input_as_off_menu():
    for bad in protocol.BAD_ACTIONS + ODD:
        env = KGTeamEnv(**KG, search_turns=3)
        env.reset(seed=0)
        key = env.state_key()
        obs, r, done, info = env.step(bad)
        assert not info["valid"] and obs.startswith("Error") and r == 0.0 and not done
        assert env.state_key() == key and env.num_invalid == 1


def test_open_of_a_huge_document_id_is_no_document():
    for cls in (KGSearchEnv, KGJudgeEnv):
        env = cls(**KG, invalid_penalty=PENALTY)
        env.reset(seed=0)
        for doc in ("d99999999999999999999", "d9223372036854775808", "d" + "9" * 4000, "d-3"):
            obs, r, done, info = env.step(f"open({doc})")  # OverflowError in SQLite before
            assert obs.startswith("Error: no document") and r == -PENALTY and not info["valid"]
        assert env.opened == [] and env.num_invalid == 4
    env = KGSearchEnv(**KG)
    env.reset(seed=0)
    title = env.index.get(3)[0]
    assert env.step("open(d" + "0" * 30 + "3)")[0].startswith(title)  # leading zeros: still d3
    tools = tool_env.KGToolEnv(KGSearchEnv(**KG, invalid_penalty=PENALTY))
    tools.reset(seed=0)
    for doc in ("d99999999999999999999", 10**30, None):
        assert tools.open(doc).startswith("Error: no document")
    assert tools.get_reward() == -3 * PENALTY


def test_search_index_get_is_none_out_of_range():
    index = SearchIndex(["a", "b"], ["x y", "y z"])
    assert index.get(1) == ("b", "y z")
    assert [index.get(i) for i in (2, -1, 10**30, -(10**30))] == [None] * 4


def test_a_search_over_the_word_cap_is_invalid_before_the_index(monkeypatch):
    cap = kg_search.MAX_QUERY_WORDS
    env = KGSearchEnv(**KG, invalid_penalty=PENALTY)
    env.reset(seed=0)
    ok = env.step("search(" + " ".join(["mentor"] * cap) + ")")  # at the cap: searched
    assert ok[3]["valid"] and ok[0].startswith("Results: [d")
    results = list(env.last_results)

    def index_never_called(*args, **kwargs):
        raise AssertionError("an over-long query reached the index")

    monkeypatch.setattr(env.index, "search", index_never_called)
    query = "mentor of " * 400  # 800 words, within MAX_ACTION_CHARS; 12 s in the index before
    assert len(query) < protocol.MAX_ACTION_CHARS
    obs, r, done, info = env.step(f"search({query})")
    assert obs == f"Error: search() takes at most {cap} words, got 800." and r == -PENALTY
    assert not info["valid"] and env.num_invalid == 1 and not done
    assert env.last_results == results  # the state is the valid search's


def test_the_shop_parser_reads_at_most_the_cap(monkeypatch):
    import agentrl_lib.envs.shop as shop

    seen = []
    real = shop._ACTION

    class Spy:
        def finditer(self, text):
            seen.append(len(text))
            return real.finditer(text)

    monkeypatch.setattr(shop, "_ACTION", Spy())
    env = ShopEnv(invalid_penalty=-PENALTY)
    env.reset(seed=0)
    obs, r, _, info = env.step("search[" * 20_000)  # 140 KB: over 10 s in the regex before
    assert seen == [] and r == -PENALTY and "at most 4096" in info["error"]
    env.step("search[mug]")
    assert seen == [len("search[mug]")]
