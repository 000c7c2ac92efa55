"""12_tricks_or_traps: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np

from agentrl_lib import core


def test_nb12_aggregate_and_normalised(notebook, answerable):
    def right_aggregate(x, mask, how, drop_empty=False):
        x, m = np.asarray(x), np.asarray(mask)
        B, T = x.shape
        if how == "token_mean":
            return (x * m).sum() / max(m.sum(), 1.0)
        if how == "const_norm":
            return (x * m).sum() / (B * T)
        means = [(x[b] * m[b]).sum() / m[b].sum() for b in range(B) if m[b].sum() > 0]
        n = len(means) if drop_empty else B
        return sum(means) / max(n, 1)

    def right_normalised(r, mean_level, std_level, ddof=1):
        r = np.asarray(r)
        B, G = r.shape
        out = np.zeros((B, G))
        for b in range(B):
            for i in range(G):
                pool_m = r[b] if mean_level == "group" else r.reshape(-1)
                pool_s = r[b] if std_level == "group" else r.reshape(-1)
                a = r[b, i] - (0.0 if mean_level == "none" else pool_m.mean())
                if std_level != "none":
                    a /= pool_s.std(ddof=ddof) + 1e-4
                if mean_level != "none" and pool_m.min() == pool_m.max():
                    a = 0.0
                out[b, i] = a
        return out

    answerable(right_aggregate, lambda *a: right_aggregate(*a, drop_empty=True),  # skips empties
               core.aggregate, notebook("aggregate_inputs"))
    answerable(right_normalised, lambda *a: right_normalised(*a, ddof=0),  # the population std
               core.normalised_advantages, notebook("normalised_inputs"))
