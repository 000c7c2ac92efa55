"""agentrl_lib: the compact library behind the agentrl notebooks.

Import what you need from its modules (``agentrl_lib.core``, ``agentrl_lib.envs``, ...);
nothing heavy (transformers, trl) is imported here, so a tabular notebook starts fast.
"""

__version__ = "0.1.0"
