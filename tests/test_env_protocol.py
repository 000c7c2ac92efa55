"""Every environment an agent plays against the checked protocol (``envs/protocol.py``): bad actions
never raise, info has its keys, the turn cap truncates, panels are deterministic and their hashes
are the ones committed results record; and every environment's docstring has the headings."""

import re
import time

import numpy as np
import pytest

from agentrl_lib.envs import protocol, text_tasks, tool_env
from agentrl_lib.envs.calc_crux import CalcCruxEnv
from agentrl_lib.envs.calc_tool import CalcToolEnv, ChecklistJudgedEnv
from agentrl_lib.envs.kg_judge import KGJudgeEnv, KGJudgeMenuEnv
from agentrl_lib.envs.kg_search import KGMenuEnv, KGSearchEnv
from agentrl_lib.envs.kg_team import KGTeamEnv
from agentrl_lib.envs.memory_grid import MemoryGridEnv
from agentrl_lib.envs.multiturn import GridAgentEnv, SubtaskGridEnv
from agentrl_lib.envs.reward_noise import RewardNoise
from agentrl_lib.envs.shop import ShopEnv
from agentrl_lib.envs.shop import eval_panel as shop_panel
from agentrl_lib.envs.twenty_questions import TwentyQuestionsEnv
from agentrl_lib.rewards.judges import NoisyJudge

KG = dict(num_entities=40, num_relations=2)
# name: (make_env, check_env's keyword arguments)
ENVS = {
    "grid": (lambda: GridAgentEnv(max_turns=6), {}),
    "grid_5x5_memory_slip": (lambda: GridAgentEnv("5x5", memory=True, show_walls=False, slip=0.2,
                                                  max_turns=5), {}),
    "memory_grid": (lambda: MemoryGridEnv(max_turns=6), {}),
    "keydoor": (lambda: SubtaskGridEnv("keydoor", max_turns=8), {}),
    "abc": (lambda: SubtaskGridEnv("abc"), {}),
    "twenty_questions": (lambda: TwentyQuestionsEnv(max_turns=4), {}),
    "twenty_questions_brief": (lambda: TwentyQuestionsEnv(max_turns=3, brief=True), {}),
    "shop": (lambda: ShopEnv(max_turns=6), {}),
    "shop_short": (lambda: ShopEnv(max_turns=4, obs_format="short"), {}),
    "kg_search": (lambda: KGSearchEnv(**KG, max_turns=5), {}),
    "kg_menu": (lambda: KGMenuEnv(**KG, max_turns=5), {}),
    "kg_judge": (lambda: KGJudgeEnv(**KG, max_turns=5, decoy_first=0.5), {}),
    "kg_judge_menu": (lambda: KGJudgeMenuEnv(**KG, max_turns=5, decoy_first=0.5), {}),
    # the handoff is forced and a wrong role's action uses no turn: never truncated
    "kg_team": (lambda: KGTeamEnv(**KG, search_turns=3), {"stall": False}),
    "calc_tool": (lambda: CalcToolEnv(max_turns=4, confirm_prob=0.5), {}),
    # its expert names menu entries, which step() reads only as indices
    "calc_crux": (lambda: CalcCruxEnv(max_turns=4), {"expert": False}),
    "reward_noise": (lambda: RewardNoise(GridAgentEnv(max_turns=5), 0.5), {}),
    # CM2's judged rollout: a failed strict criterion (every stall) ends the episode at once
    "calc_tool_judged": (lambda: ChecklistJudgedEnv(CalcToolEnv(max_turns=4, confirm_prob=0.5),
                                                    NoisyJudge.at_noise(0.2),
                                                    np.random.default_rng(0)), {"stall": False}),
}
ENV_CLASSES = [GridAgentEnv, SubtaskGridEnv, MemoryGridEnv, TwentyQuestionsEnv, ShopEnv,
               KGSearchEnv, KGMenuEnv, KGJudgeEnv, KGJudgeMenuEnv, KGTeamEnv, CalcToolEnv,
               CalcCruxEnv, RewardNoise, ChecklistJudgedEnv]


@pytest.mark.parametrize("name", list(ENVS))
def test_every_environment_passes_the_checker(name):
    make_env, kwargs = ENVS[name]
    t0 = time.perf_counter()
    protocol.check_env(make_env, **kwargs)
    assert time.perf_counter() - t0 < 5.0  # about 0.1-1 s each on one core


@pytest.mark.parametrize("cls", ENV_CLASSES, ids=lambda c: c.__name__)
def test_every_environment_docstring_has_the_headings(cls):
    found = re.findall(r"^\s*## (.+?)\s*$", cls.__doc__ or "", re.M)
    assert found == list(protocol.DOC_HEADINGS), f"{cls.__name__}: headings {found}"


def test_the_checker_catches_what_it_names():
    class Raises(GridAgentEnv):
        def step(self, action_text):
            return super().step(action_text.lower())  # AttributeError on None

    class NeverTruncates(GridAgentEnv):
        def step(self, action_text):
            obs, r, done, info = super().step(action_text)
            return obs, r, done, {**info, "truncated": False}

    with pytest.raises(AssertionError, match="raised"):
        protocol.check_env(lambda: Raises(max_turns=3))
    with pytest.raises(AssertionError, match="truncated=False"):
        protocol.check_env(lambda: NeverTruncates(max_turns=3))


def test_kg_episodes_are_truncated_exactly_at_the_cap():
    env = KGSearchEnv(**KG, max_turns=3)
    env.reset(seed=4)
    flags = [env.step("search(mentor)")[2:] for _ in range(3)]
    assert [(d, i["truncated"]) for d, i in flags] == [(False, False), (False, False), (True, True)]
    env.reset(seed=4)
    env.step("search(x)"), env.step("search(y)")
    _, _, done, info = env.step(f"answer({env.task['answer']})")  # solved on the last turn
    assert done and info["success"] and not info["truncated"]
    env = KGJudgeEnv(**KG, max_turns=2)  # a verdict on the last turn: the cap ends it
    env.reset(seed=1)
    env.step(env.expert_actions()[0])
    _, _, done, info = env.step("judge(useful)")
    assert done and info["truncated"]


def test_huge_and_odd_actions_are_invalid_not_errors():
    env = KGSearchEnv(**KG)
    env.reset(seed=0)
    obs, r, done, info = env.step("open(d99999999999999999999)")  # OverflowError in SQLite before
    assert not info["valid"] and "no document" in obs and not done
    t0 = time.perf_counter()
    _, _, _, info = env.step("search(" + "mentor " * 10_000 + ")")  # minutes in the index before
    assert not info["valid"] and "at most 4096" in info["error"]
    shop = ShopEnv()
    shop.reset(seed=0)
    _, _, _, info = shop.step("search[" * 15_000)  # quadratic in the parser before
    assert not info["valid"] and time.perf_counter() - t0 < 1.0
    for env in (GridAgentEnv(), TwentyQuestionsEnv(), shop):
        env.reset(seed=0)
        _, _, _, info = env.step(None)  # AttributeError before
        assert info["error"] == "the action must be text, got NoneType"
    tools = tool_env.KGToolEnv(KGSearchEnv(**KG))
    tools.reset(seed=0)
    assert "no document" in tools.open("d99999999999999999999")


def test_menu_actions_off_the_menu_are_invalid_turns():
    env = KGJudgeMenuEnv(**KG, max_turns=3)
    env.reset(seed=0)
    for bad in ("fly", 99, -1):
        _, r, done, info = env.step(bad)
        assert not info["valid"] and info["call"] is None and "menu" in info["error"]
    assert done and info["truncated"] and env.env.num_invalid == 3


# (make the panel, its hash under the code before the protocol: committed results record these)
PANELS = [
    (lambda: GridAgentEnv().eval_panel(40), "cf47e7ea801315a8"),
    (lambda: GridAgentEnv(layout="7x7", show_walls=False, memory=True).eval_panel(40),
     "af74030128b1f813"),
    (lambda: GridAgentEnv(slip=0.1, max_turns=8).eval_panel(40), "ff24d02bd8133ad7"),
    (lambda: SubtaskGridEnv("keydoor").eval_panel(40), "f40261e2d81f80ad"),
    (lambda: SubtaskGridEnv("chain3").eval_panel(40), "e3883787be6ae9e2"),
    (lambda: MemoryGridEnv().eval_panel(20), "c2fb22f58ddca057"),
    (lambda: TwentyQuestionsEnv().eval_panel(50), "1d93829932fcbb5b"),
    (lambda: TwentyQuestionsEnv(max_turns=4, brief=True).eval_panel(50), "a80d3c05aa03655a"),
    (lambda: shop_panel(ShopEnv(), 64), "102c3e9451e71da1"),
    (lambda: ShopEnv(obs_format="short").eval_panel(30, seed=3), "4bff75b9edda4441"),
    (lambda: KGSearchEnv(num_entities=60).eval_panel(32), "82813775d014f3d0"),
    (lambda: KGTeamEnv(num_entities=60).eval_panel(32), "82813775d014f3d0"),
    (lambda: KGJudgeMenuEnv(num_entities=100, num_relations=2, alignment=0.8).eval_panel(32),
     "ca23a59607ac1740"),
    (lambda: CalcToolEnv().eval_panel(40), "db4afebb1f708127"),
    (lambda: CalcToolEnv(split="heldout", confirm_prob=0.5).eval_panel(40), "b796ae7be1be7523"),
    (lambda: CalcCruxEnv().eval_panel(40), "27e57f491f002e4f"),
    (lambda: text_tasks.eval_panel("countdown", 50), "b61f37415a869121"),
]


@pytest.mark.parametrize("i", range(len(PANELS)))
def test_panel_hashes_are_the_recorded_ones(i):
    make_panel, recorded = PANELS[i]
    assert make_panel()[1] == recorded


def test_eval_panel_helper():
    panel, h = protocol.eval_panel(3, lambda s: (s, s % 2), ["game"])
    assert panel == [(10**6, 0), (10**6 + 1, 1), (10**6 + 2, 0)]
    assert h == protocol.panel_hash([["game"], [[10**6, 0], [10**6 + 1, 1], [10**6 + 2, 0]]])
    by_len = protocol.eval_panel(2, seeds=["a", "b"], blob=len)
    assert by_len == (["a", "b"], protocol.panel_hash(2))
    with pytest.raises(ValueError, match="needs 3 seeds"):
        protocol.eval_panel(3, seeds=[1])
