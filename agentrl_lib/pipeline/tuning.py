"""The one rule that picks a learning rate (STYLE.md, "Claims: what makes a verdict evidence").

- Learning rates are tuned on **tuning seeds**, never on the judged panel or a judged seed: a seed
  looked at while choosing makes every claim judged on it post hoc.
- **The same sweep for every arm**: the same list of learning rates, the same tuning seeds, the
  same budget and the same tuning-panel metric, so no arm gets more tuning effort than another.
- **The pick**: the lr with the highest mean, over the tuning seeds, of the final tuning-panel
  metric (the metric's value at the end of training, on a panel drawn apart from the judged one);
  ties (equal means) go to the smaller lr, the more conservative step. For a metric where lower is
  better (a loss, an exploitability) pass ``higher_is_better=False``.
- **An edge pick** (the sweep's smallest or largest lr) says the best lr may lie outside the
  sweep: ``edge_lr`` names the next one past that edge (a factor ``step`` away); a sweep extended
  this way, the same number of times at most for every arm (fixed before the runs), is still one
  sweep.

A notebook writes::

    sweep = {(arm, lr): [final_metric(train(arm, lr, s)) for s in tuning_seeds]
             for arm in ARMS for lr in lrs}
    best_lr = {arm: pick_lr({lr: sweep[arm, lr] for lr in lrs}) for arm in ARMS}

- **Several hyperparameters at once** (an lr and a KL weight): the sweep is a grid of settings,
  tuples such as ``(lr, beta)``, treated as one hyperparameter (``pick_setting``; ``tune_arms``
  takes tuples where it takes lrs); ties go to the smallest setting in sorted order, so with the
  lr first, to the smaller lr.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np


def pick_lr(scores: dict, *, higher_is_better: bool = True) -> float:
    """The lr whose tuning seeds' final tuning-panel metric has the best mean; ties to the
    smaller lr. scores: {lr: a list of values (one per tuning seed) or one value}. A NaN mean
    (a run that diverged) is never picked unless every lr's is NaN.

    >>> pick_lr({0.1: [0.5, 0.7], 0.3: [0.9, 0.1], 0.03: [0.2, 0.2]})  # means 0.6, 0.5, 0.2
    0.1
    >>> pick_lr({0.3: [0.5], 0.1: [0.5]})  # a tie: the smaller lr
    0.1
    >>> pick_lr({1e-3: 2.0, 1e-2: 1.5}, higher_is_better=False)
    0.01
    """
    if not scores:
        raise ValueError("pick_lr needs at least one lr")
    return pick_setting(scores, higher_is_better=higher_is_better)


def pick_setting(scores: dict, *, higher_is_better: bool = True):
    """``pick_lr``'s rule over a sweep of any sortable settings (an lr, an ``(lr, beta)`` tuple):
    the setting whose tuning seeds' metric has the best mean; ties to the smallest setting in
    sorted order (for numbers the smaller lr, as ``pick_lr``; for tuples the first field first);
    a NaN mean is never picked unless every setting's is NaN.

    >>> pick_setting({(0.1, 0.5): [0.7], (0.03, 0.1): [0.7], (0.1, 0.1): [0.6]})  # a tie
    (0.03, 0.1)
    >>> pick_setting({(1e-3, 0.1): 2.0, (1e-3, 0.5): 1.5}, higher_is_better=False)
    (0.001, 0.5)
    """
    if not scores:
        raise ValueError("pick_setting needs at least one setting")
    sign = 1.0 if higher_is_better else -1.0

    def key(setting):
        m = float(np.mean(np.asarray(scores[setting], dtype=float)))
        return (not math.isnan(m), sign * m if not math.isnan(m) else 0.0)

    top = max(key(x) for x in scores)
    return min(x for x in scores if key(x) == top)


def edge_lr(scores: dict, step: float = 3.0, *, higher_is_better: bool = True) -> float | None:
    """The lr to add when ``pick_lr`` picks an edge of the sweep: the smallest lr / ``step`` when
    it picks the smallest, the largest * ``step`` when it picks the largest; None when the pick
    lies inside (or the sweep has one lr, whose edges are both the pick: extend it by hand).

    >>> edge_lr({3e-4: [0.2], 1e-3: [0.1], 3e-3: [0.0]})  # the smallest wins: try 1e-4
    0.0001
    >>> edge_lr({3e-4: [0.2], 1e-3: [0.3], 3e-3: [0.1]}) is None
    True
    >>> edge_lr({0.1: 0.2, 0.3: 0.5})  # the largest wins
    0.9
    """
    if len(scores) < 2:
        return None
    pick = pick_lr(scores, higher_is_better=higher_is_better)
    lo, hi = min(scores), max(scores)
    if pick == lo:
        return float(f"{lo / step:.3g}")
    if pick == hi:
        return float(f"{hi * step:.3g}")
    return None


def library_hash() -> str:
    """A short hash of the library's source (every ``agentrl_lib/**/*.py``) as this process
    imported it (hashed when this module is imported): a tuning pass cached by other library code
    is not reused."""
    return _LIBRARY_HASH


def _hash_library() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


_LIBRARY_HASH = _hash_library()


def notebook_code_hash(notebook: str) -> str:
    """A short hash of the notebook's code cells as this run executes them (the parameters cells
    left out: ``params`` carries them): the copy papermill writes in the run folder
    (``$AGENTRL_RUN_DIR/<notebook>.ipynb``, filled in as it runs) when there is one, else
    ``notebooks/<notebook>.ipynb`` of the checkout; '' when neither can be read."""
    import os

    from agentrl_lib.pipeline.notebooks import repo_root

    run_dir = os.environ.get("AGENTRL_RUN_DIR")
    paths = [Path(run_dir) / f"{notebook}.ipynb"] if run_dir else []
    try:
        paths.append(repo_root() / "notebooks" / f"{notebook}.ipynb")
    except Exception:  # no checkout beside this process: the run folder's copy or nothing
        pass
    for path in paths:
        try:
            cells = json.loads(path.read_text())["cells"]
        except (OSError, ValueError, KeyError):
            continue
        code = ["".join(c["source"]) for c in cells if c.get("cell_type") == "code"
                and not {"parameters", "injected-parameters"} & set(c.get("metadata", {})
                                                                   .get("tags", []))]
        return hashlib.sha1("\n\0".join(code).encode()).hexdigest()[:12]
    return ""


def shared_tuning(notebook: str, params: dict, compute, *, name: str = "lr",
                  exclude=("seed", "interactive")) -> dict:
    """The tuning pass of a notebook, run once per profile and shared by its judged seeds.

    Tuning runs on tuning seeds, never on the judged one, so its result is the same for every
    judged seed: ``compute()`` (returning a JSON-able dict: the tuning scores and the picks) runs
    for the first seed and is saved as ``<notebook folder>/tuning/<name>-<key>.json`` beside the
    seed folders (``paths.current_run_dir``'s parent); the other seeds read it. ``key`` hashes
    ``params`` without ``exclude``, ``library_hash()`` and ``notebook_code_hash(notebook)``, so a
    change of any other parameter, of the library or of the notebook's code runs it again.
    ``compute`` must not depend on the judged seed (seed its draws from the tuning seeds and fixed
    constants): whichever seed runs it first, the others read its result. A lock file makes a seed running at the same time wait instead of
    tuning twice. The random states of ``random``, numpy and torch are restored after
    ``compute()``, so what the notebook draws next does not depend on whether the pass ran here
    or was read. Returns the dict, with ``"cached": True`` when it was read.
    """
    import fcntl
    import random

    import torch

    from agentrl_lib.pipeline.paths import current_run_dir

    seed = int(params.get("seed", 0))
    kept = {k: v for k, v in sorted(params.items()) if k not in exclude}
    key = hashlib.sha1(json.dumps([kept, library_hash(), notebook_code_hash(notebook)],
                                  sort_keys=True, default=str).encode()).hexdigest()[:12]
    folder = current_run_dir(notebook, seed).parent / "tuning"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{key}.json"
    with open(folder / f"{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.exists():
            try:
                return {**json.loads(path.read_text()), "cached": True}
            except json.JSONDecodeError:
                print(f"tuning cache {path} is corrupt: tuning again")
        states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        try:
            out = json.loads(json.dumps(compute()))  # both paths return the same types
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1, sort_keys=True))
        tmp.replace(path)
    return {**out, "cached": False}


def tune_arms(notebook: str, params: dict, arms, lrs, tuning_seeds, score, *,
              name: str = "lm", higher_is_better: bool = True) -> dict:
    """Each arm's lr by the one rule, from one shared tuning pass: ``score(arm, lr, tuning_seed)``
    (the final tuning-panel metric of a run of the judged run's length) for every arm, lr and
    tuning seed, the same sweep for every arm; ``pick_lr`` per arm; the pass through
    ``shared_tuning`` (once per profile). A sweep of one lr needs no tuning run. ``lrs`` may
    instead be a grid of settings of several hyperparameters (tuples, e.g. ``(lr, beta)``, passed
    to ``score`` as tuples; ``pick_setting`` per arm; labelled ``lr,beta`` in the keys). Returns
    {"scores": {"arm@lr@seed": value}, "picks": {arm: lr}, "cached": bool}.
    """
    def setting(x):  # a number, or a tuple of numbers (a list read back from JSON included)
        return tuple(float(v) for v in x) if isinstance(x, (list, tuple)) else float(x)

    def label(x):
        return ",".join(f"{v:g}" for v in x) if isinstance(x, tuple) else f"{x:g}"

    arms, lrs, tuning_seeds = list(arms), [setting(x) for x in lrs], [int(s) for s in tuning_seeds]
    if len(lrs) == 1:
        return {"scores": {}, "picks": {a: lrs[0] for a in arms}, "cached": False}
    if not tuning_seeds:
        raise ValueError("a sweep of more than one lr needs tuning seeds")

    def compute():
        scores = {f"{a}@{label(lr)}@{s}": float(score(a, lr, s))
                  for a in arms for lr in lrs for s in tuning_seeds}
        picks = {a: pick_setting({lr: [scores[f"{a}@{label(lr)}@{s}"] for s in tuning_seeds]
                                  for lr in lrs}, higher_is_better=higher_is_better)
                 for a in arms}
        return {"scores": scores, "picks": picks}

    out = shared_tuning(notebook, params, compute, name=name)
    return {**out, "picks": {a: setting(v) for a, v in out["picks"].items()}}
