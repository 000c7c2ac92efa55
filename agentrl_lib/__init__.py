"""agentrl_lib: the compact library behind the agentrl notebooks.

Import what you need from its modules (``agentrl_lib.core``, ``agentrl_lib.envs``, ...);
nothing heavy (transformers, trl) is imported here, so a tabular notebook starts fast.
Importing it sets the Hugging Face offline and no-telemetry switches the user has not set
(``agentrl_lib.offline``), for this process and everything it starts.
"""

from agentrl_lib import offline as _offline

__version__ = "0.1.0"
_offline.apply()
