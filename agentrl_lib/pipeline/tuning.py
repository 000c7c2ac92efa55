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
"""

from __future__ import annotations

import math

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
    sign = 1.0 if higher_is_better else -1.0

    def key(lr):
        m = float(np.mean(np.asarray(scores[lr], dtype=float)))
        return (not math.isnan(m), sign * m if not math.isnan(m) else 0.0, -float(lr))

    return max(scores, key=key)


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
