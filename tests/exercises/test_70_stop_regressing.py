"""70_stop_regressing: its checked exercises, answered right and wrong (see conftest.py)."""

import math

import numpy as np


def test_nb70_value_loss(notebook, answerable):
    from agentrl_lib.algorithms import value_targets as vt

    def right(logits, y, kind, support, sigma, bins=True):
        z = np.asarray(support, dtype=float)
        K, w = len(z), z[1] - z[0]
        total = 0.0
        for lg, yb in zip(np.asarray(logits, dtype=float), np.asarray(y, dtype=float)):
            p = np.zeros(K)
            if kind == "two_hot":
                yc = min(max(yb, z[0]), z[-1])
                i = min(int((yc - z[0]) // w), K - 2)
                frac = (yc - z[i]) / w
                p[i], p[i + 1] = 1 - frac, frac
            else:
                for k in range(K):
                    if bins:  # the mass of N(y, sigma^2) in the bin around z_k
                        lo, hi = (z[k] - w / 2 - yb) / sigma, (z[k] + w / 2 - yb) / sigma
                        p[k] = 0.5 * (math.erf(hi / math.sqrt(2)) - math.erf(lo / math.sqrt(2)))
                    else:  # the density at z_k
                        p[k] = math.exp(-0.5 * ((z[k] - yb) / sigma) ** 2)
                p /= p.sum()
            log_softmax = lg - lg.max() - math.log(np.exp(lg - lg.max()).sum())
            total += -(p * log_softmax).sum()
        return total / len(y)

    answerable(right, lambda *x: right(*x, bins=False), vt.value_loss, notebook("loss_inputs"))
