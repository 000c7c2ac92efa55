"""42_epo_entropy: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb42_epo_loss(notebook, answerable):
    def epo_loss(h, h_bar, it, K, c, beta, lo, hi, phase=True):
        h = np.asarray(h, dtype=float)
        w = 1.0 - it / max(K - 1, 1) if phase else 1.0
        pen = np.mean([max(lo * h_bar - x, 0.0) + max(x - hi * h_bar, 0.0) for x in h])
        return -c * w * h.mean() + beta * pen

    answerable(epo_loss, lambda *a: epo_loss(*a, phase=False),  # forgets the phase weight
               notebook("epo_reference"), notebook("epo_inputs"))
