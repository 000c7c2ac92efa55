"""Policies: tabular softmax, MLPs and an actor-critic; (later) the tiny causal LM and HF loading."""

from agentrl_lib.models.policies import ActorCritic, MLPPolicy, TabularSoftmaxPolicy, mlp  # noqa: F401
