"""Reward functions with one signature (TRL's): ``f(completions, **columns) -> list[float]``."""

from agentrl_lib.rewards.verifiable import (  # noqa: F401
    chain_step_reward, correctness_reward, countdown_reward, format_reward, partial_credit_reward,
)
