"""Policies: tables, MLPs and CleanRL's actor-critic (``policies``); the tiny causal LM and its
tokenizer (``tiny_lm``); loading any causal LM by name or folder (``loading``)."""

from agentrl_lib.models.policies import (  # noqa: F401
    ActorCritic, KeyTablePolicy, MLPPolicy, PromptSetPolicy, TabularSoftmaxPolicy, TabularTreePolicy,
    mlp, tabular_agent,
)
