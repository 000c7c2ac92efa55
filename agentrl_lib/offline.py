"""No telemetry, no hub calls: the Hugging Face offline and no-telemetry switches, set for
everything the package starts unless the user has set them.

``apply()`` runs when ``agentrl_lib`` is imported. It puts each of ``SWITCHES`` into
``os.environ`` where the user has not set it (a value the user set, even "0", is kept), so the
papermill kernels, the ``agentrl reproduce`` workers and every other subprocess the pipeline starts
inherit them. Where ``huggingface_hub`` (or ``datasets``) was imported before ``agentrl_lib``, its
module-level constants were read already; ``apply()`` sets those too, for the switches it set.

Why each switch (the sources are the installed packages):
- TRL 1.16 pings the hub whenever a trainer is created (``trl/trainer/base_trainer.py``,
  ``BaseTrainer._send_telemetry`` -> ``huggingface_hub.utils.send_telemetry``) unless ``CI`` is set
  or ``HF_HUB_DISABLE_TELEMETRY`` / ``HF_HUB_OFFLINE`` is; TRL has no switch of its own. On a
  machine without a network the ping is a wasted timeout in a background thread.
- ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE``: ``from_pretrained`` reads local folders only
  (this project's models are built locally: ``models/loading.py``); ``HF_DATASETS_OFFLINE`` the same
  for ``datasets`` (TRL builds its datasets with it).
- ``HF_HUB_DISABLE_UPDATE_CHECK``: the ``hf`` command line's version check on PyPI.
- ``GRADIO_ANALYTICS_ENABLED``: openenv-core's web interface is a gradio app, which reports usage.
To download a model from the hub, set ``HF_HUB_OFFLINE=0`` (and ``TRANSFORMERS_OFFLINE=0``) before
importing anything.
"""

from __future__ import annotations

import os
import sys

SWITCHES = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
}
"""{environment variable: the value ``apply`` gives it when the user has not set it}"""


def apply() -> dict[str, str]:
    """Set every switch of ``SWITCHES`` the user has not set; return the ones set here."""
    set_here = {}
    for name, value in SWITCHES.items():
        if name not in os.environ:
            os.environ[name] = value
            set_here[name] = value
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:  # imported before us: its constants were read from the old environment
        if "HF_HUB_OFFLINE" in set_here:
            hub.HF_HUB_OFFLINE = True
        if "HF_HUB_DISABLE_TELEMETRY" in set_here:
            hub.HF_HUB_DISABLE_TELEMETRY = True
    ds = sys.modules.get("datasets.config")
    if ds is not None and "HF_DATASETS_OFFLINE" in set_here:
        ds.HF_HUB_OFFLINE = ds.HF_DATASETS_OFFLINE = True
    return set_here
