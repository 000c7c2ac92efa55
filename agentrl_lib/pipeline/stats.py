"""The statistics of a verdict across seeds: the interquartile mean, intervals, and whether a
claimed ordering holds with that confidence.

The interval of a verdict is a **t-interval on the seed values** (``t_interval``): mean +-
t_{n-1, 1-alpha/2} s / sqrt(n). It has its nominal coverage at the seed counts we run (3, 5, 10)
when seed values are roughly normal (``tests/test_stats.py`` measures it by simulation: 95% +- 2%).
The percentile bootstrap over seeds (``bootstrap_ci``, rliable's interval; Agarwal et al. 2021,
"Deep RL at the Edge of the Statistical Precipice") covers far less at 3 seeds (about 76% for a
nominal 95%: three values resampled cannot reach past their own range), so it is kept for many
seeds only. The IQM (mean of the middle 50%, ``scipy.stats.trim_mean(x, 0.25)``) stays the robust
summary the report prints beside the mean; with 3 seeds it is the mean.

The claimed ordering is judged on the paired differences d_s = ours_s - baseline_s (same seed):
'>' holds with confidence when the interval's lower end exceeds the margin, '<' when its upper
end is below -margin, '>=' / '<=' against 0, and '~' when the whole interval lies inside
[-margin, margin].
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


def t_interval(x, alpha: float = 0.05) -> tuple[float, float]:
    """The t-interval of the mean of ``x``: mean +- t_{n-1, 1 - alpha/2} * s / sqrt(n), s with
    ddof 1. One value gives (x, x) (no spread to estimate: the caller reports n).

    >>> lo, hi = t_interval([1.0, 2.0, 3.0])  # mean 2, s 1, t_{2, 0.975} = 4.303
    >>> round(lo, 3), round(hi, 3)
    (-0.484, 4.484)
    """
    from scipy.stats import t

    a = np.asarray(x, dtype=float)
    if len(a) == 0:
        return math.nan, math.nan
    if len(a) == 1:
        return float(a[0]), float(a[0])
    half = float(t.ppf(1 - alpha / 2, len(a) - 1)) * a.std(ddof=1) / math.sqrt(len(a))
    return float(a.mean() - half), float(a.mean() + half)


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
    """Mean, IQM and t-interval of ours, and of the paired difference ours - baseline, and whether
    the claimed ``direction`` holds with confidence 1 - alpha (see the module docstring).
    ``seed`` is unused (the interval is not resampled); kept so older callers still run.

    >>> v = ordering_verdict([0.9, 0.8, 0.85, 0.95], [0.5, 0.55, 0.45, 0.5], ">", margin=0.1)
    >>> v["confident"], round(v["diff_mean"], 3), [round(c, 3) for c in v["diff_ci"]]
    (True, 0.375, [0.237, 0.513])
    """
    o = np.asarray(ours, dtype=float)
    out = {"n": int(len(o)), "ours_mean": float(o.mean()) if len(o) else math.nan,
           "ours_iqm": iqm(o), "ours_ci": t_interval(o, alpha)}
    if baseline is None or len(o) == 0:
        return {**out, "diff_mean": None, "diff_iqm": None, "diff_ci": None, "confident": None}
    b = np.asarray(baseline, dtype=float)
    if b.shape != o.shape:
        raise ValueError(f"ours and baseline need one value per seed each: {o.shape} vs {b.shape}")
    d = o - b
    lo, hi = t_interval(d, alpha)
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
    return {**out, "diff_mean": float(d.mean()), "diff_iqm": iqm(d), "diff_ci": (lo, hi),
            "confident": bool(confident)}
