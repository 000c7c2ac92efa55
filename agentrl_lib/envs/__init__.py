"""Environments: tabular MDPs with known P and R, the token tree, text tasks, and multi-turn text
environments (the text gridworld, twenty questions, a shop), each with an exact tabular form."""

from agentrl_lib.envs.tabular import (  # noqa: F401
    TabularMDP, advantages, chain_mdp, expected_return, from_gymnasium, greedy, gridworld,
    policy_evaluation, policy_iteration, q_from_v, q_values, random_mdp, uniform_policy,
    value_iteration,
)
from agentrl_lib.envs.token_tree import TabularTreePolicy, TokenTreeMDP  # noqa: F401
from agentrl_lib.envs.multiturn import GridAgentEnv, parse_action  # noqa: F401
from agentrl_lib.envs.shop import ShopEnv  # noqa: F401
from agentrl_lib.envs.twenty_questions import TwentyQuestionsEnv  # noqa: F401
