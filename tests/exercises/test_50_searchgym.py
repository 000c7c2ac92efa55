"""50_searchgym: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb50_linear_curriculum_and_collapses(notebook, answerable):
    from agentrl_lib.algorithms import curriculum

    def linear(it, n_iters, K, frac, ramp=True):
        f = min(1.0, it / (frac * n_iters if ramp else n_iters))
        return np.array([(1 - f) * (j == 0) + f / K for j in range(K)])

    def collapses(values, drop, running_peak=True):
        count, peak, prev = 0, -np.inf, None
        for x in values:
            peak = max(peak, x)
            ref = peak if running_peak else (x if prev is None else prev)
            count += x < ref - drop
            prev = x
        return count

    answerable(linear, lambda *a: linear(*a, ramp=False),  # ramps over the whole run
               lambda it, n, K, frac: curriculum.hop_weights(it, n, K, "linear", frac),
               notebook("linear_inputs"))
    # wrong: a fall from the last value, not from the running peak
    answerable(collapses, lambda *a: collapses(*a, running_peak=False),
               curriculum.collapse_events, notebook("collapse_inputs"))
