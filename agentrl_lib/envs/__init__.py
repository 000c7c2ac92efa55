"""Environments: tabular MDPs with known P and R, the token tree, text tasks, and multi-turn text
environments (the text gridworld, twenty questions, a shop, each with an exact tabular form; the
knowledge-graph search environment with a full-text index). The agent environments follow one
checked protocol, ``envs/protocol.py`` (``AgentEnv``, ``check_env``).
The exact solvers that read P and R are in ``agentrl_lib.algorithms.dp``."""

from agentrl_lib.envs.tabular import (  # noqa: F401
    TabularMDP, chain_mdp, from_gymnasium, gridworld, random_mdp,
)
from agentrl_lib.envs.token_tree import TokenTreeMDP  # noqa: F401
from agentrl_lib.envs.multiturn import GridAgentEnv, SubtaskGridEnv, parse_action  # noqa: F401
from agentrl_lib.envs.shop import ShopEnv  # noqa: F401
from agentrl_lib.envs.twenty_questions import TwentyQuestionsEnv  # noqa: F401
from agentrl_lib.envs.kg_search import KGMenuEnv, KGSearchEnv  # noqa: F401
from agentrl_lib.envs.kg_judge import KGJudgeEnv, KGJudgeMenuEnv  # noqa: F401
from agentrl_lib.envs.kg_team import KGTeamEnv  # noqa: F401
from agentrl_lib.envs.memory_grid import MemoryGridEnv  # noqa: F401
from agentrl_lib.envs.textworld_env import TextWorldEnv  # noqa: F401

AGENT_ENVS = {"grid": GridAgentEnv, "subtask_grid": SubtaskGridEnv,
              "twenty_questions": TwentyQuestionsEnv, "shop": ShopEnv, "kg_search": KGSearchEnv,
              "kg_menu": KGMenuEnv, "kg_judge": KGJudgeEnv, "kg_judge_menu": KGJudgeMenuEnv,
              "kg_team": KGTeamEnv, "memory_grid": MemoryGridEnv, "textworld": TextWorldEnv}
"""the multi-turn text environments by name (agent SFT bases, sweeps)"""


def make_agent_env(name: str, **kwargs):
    """``AGENT_ENVS[name](**kwargs)``, with a clear error for an unknown name."""
    if name not in AGENT_ENVS:
        raise ValueError(f"unknown agent environment {name!r}; choose one of {list(AGENT_ENVS)}")
    return AGENT_ENVS[name](**kwargs)
