"""Environments: tabular MDPs with known P and R, the token tree, and (later) text tasks."""

from agentrl_lib.envs.tabular import (  # noqa: F401
    TabularMDP, advantages, chain_mdp, expected_return, from_gymnasium, greedy, gridworld,
    policy_evaluation, policy_iteration, q_from_v, q_values, random_mdp, uniform_policy,
    value_iteration,
)
from agentrl_lib.envs.token_tree import TabularTreePolicy, TokenTreeMDP  # noqa: F401
