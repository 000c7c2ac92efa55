"""Where runs go: the one place run folders are named.

    runs/<profile>/<notebook>/seed<S>/              a run of the notebook's profile
    runs/<profile>/<notebook>/<point>/seed<S>/      a sweep's grid point (``point_tag``)
    runs/interactive/<notebook>/seed<S>/            a notebook run by hand (JupyterLab, nbval)

``agentrl run`` and ``agentrl reproduce`` tell the notebook its folder through ``AGENTRL_RUN_DIR``
(and its grid point through ``AGENTRL_POINT``); run by hand, ``current_run_dir`` falls back to
``$AGENTRL_RUNS_ROOT/interactive`` (default root: ``runs`` under the current directory).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path


def point_tag(overrides: dict) -> str:
    """Folder name of a grid point: 'lr=0.1,estimator=gigpo' (sorted, filesystem-safe).

    >>> point_tag({"lr": 0.1, "estimator": "gigpo"})
    'estimator=gigpo,lr=0.1'
    """
    if not overrides:
        return ""
    text = ",".join(f"{k}={json.dumps(v) if isinstance(v, (list, dict)) else v}"
                    for k, v in sorted(overrides.items()))
    text = re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)
    if len(text) > 100:
        text = text[:80] + "-" + hashlib.sha1(text.encode()).hexdigest()[:10]
    return text


def run_dir_for(runs_root: Path | str, profile: str, notebook: str, seed: int,
                overrides: dict | None = None) -> Path:
    """The folder of one run: ``<root>/<profile>/<notebook>[/<point>]/seed<S>``."""
    base = Path(runs_root) / profile / notebook
    tag = point_tag(overrides or {})
    return (base / tag if tag else base) / f"seed{seed}"


def current_run_dir(notebook: str, seed: int) -> Path:
    """The folder the running notebook writes to (created): ``$AGENTRL_RUN_DIR`` under the pipeline,
    else ``$AGENTRL_RUNS_ROOT/interactive/<notebook>/seed<S>``."""
    env = os.environ.get("AGENTRL_RUN_DIR")
    root = Path(os.environ.get("AGENTRL_RUNS_ROOT", "runs"))
    path = Path(env) if env else root / "interactive" / notebook / f"seed{seed}"
    path.mkdir(parents=True, exist_ok=True)
    return path
