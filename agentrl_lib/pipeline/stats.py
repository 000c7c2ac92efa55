"""The statistics of a verdict across seeds: interquartile mean, bootstrap confidence intervals,
and whether a claimed ordering holds with that confidence.

Following Agarwal et al. 2021 ("Deep RL at the Edge of the Statistical Precipice", rliable): the
IQM (mean of the middle 50%, ``scipy.stats.trim_mean(x, 0.25)``) is robust to an outlier seed and
less noisy than the median; a percentile bootstrap over seeds gives its interval. With 3 seeds the
interval is wide and the IQM is the mean (``int(0.25 * 3) = 0`` values trimmed each side): the
report says how many seeds each verdict rests on.

The claimed ordering is judged on the paired differences d_s = ours_s - baseline_s (same seed):
'>' holds with confidence when the CI's lower end exceeds the margin, '<' when its upper end is
below -margin, '>=' / '<=' against 0, and '~' when the whole CI lies inside [-margin, margin].
"""

from __future__ import annotations

import math

import numpy as np


def iqm(x) -> float:
    """Interquartile mean: drop the lowest and highest ``int(0.25 n)`` values, average the rest.

    >>> iqm([1, 2, 3, 4, 100, 5, 6, 7])
    4.5
    >>> iqm([1.0, 2.0, 9.0])
    4.0
    """
    a = np.sort(np.asarray(x, dtype=float))
    k = int(0.25 * len(a))
    return float(a[k:len(a) - k].mean()) if len(a) else math.nan


def bootstrap_ci(x, stat=iqm, num_resamples: int = 2000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over resamples of ``x`` (with replacement).
    A single value gives (x, x): there is nothing to resample."""
    a = np.asarray(x, dtype=float)
    if len(a) == 0:
        return math.nan, math.nan
    if len(a) == 1:
        return float(a[0]), float(a[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(num_resamples, len(a)))  # (R, n)
    stats = np.array([stat(a[i]) for i in idx])
    return float(np.quantile(stats, alpha / 2)), float(np.quantile(stats, 1 - alpha / 2))


def ordering_verdict(ours, baseline, direction: str, margin: float = 0.0,
                     alpha: float = 0.05, seed: int = 0) -> dict:
    """IQM and bootstrap CI of ours, and of the paired difference ours - baseline, and whether the
    claimed ``direction`` holds with confidence 1 - alpha (see the module docstring).

    >>> v = ordering_verdict([0.9, 0.8, 0.85, 0.95], [0.5, 0.55, 0.45, 0.5], ">", margin=0.1)
    >>> v["confident"], round(v["diff_iqm"], 3)
    (True, 0.4)
    """
    o = np.asarray(ours, dtype=float)
    out = {"n": int(len(o)), "ours_iqm": iqm(o), "ours_ci": bootstrap_ci(o, alpha=alpha, seed=seed)}
    if baseline is None or len(o) == 0:
        return {**out, "diff_iqm": None, "diff_ci": None, "confident": None}
    b = np.asarray(baseline, dtype=float)
    if b.shape != o.shape:
        raise ValueError(f"ours and baseline need one value per seed each: {o.shape} vs {b.shape}")
    d = o - b
    lo, hi = bootstrap_ci(d, alpha=alpha, seed=seed)
    if direction == ">":
        confident = lo > margin
    elif direction == "<":
        confident = hi < -margin
    elif direction == ">=":
        confident = lo >= 0
    elif direction == "<=":
        confident = hi <= 0
    elif direction == "~":
        confident = -margin <= lo and hi <= margin
    else:
        raise ValueError(f"unknown direction {direction!r}")
    return {**out, "diff_iqm": iqm(d), "diff_ci": (lo, hi), "confident": bool(confident)}
