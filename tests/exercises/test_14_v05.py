"""14_v05: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb14_fused_baseline(notebook, answerable):
    from agentrl_lib.algorithms import v05

    def fused(r, prior, tau2, swapped=False):
        B, N = r.shape
        out = np.zeros((B, N))
        for i in range(B):
            v, m = prior[i], sum(r[i]) / N
            sigma2 = v * (1 - v)
            w = sigma2 / (sigma2 + N * tau2)
            if swapped:  # the weight on the wrong term: the prior gains weight as N grows
                w = 1 - w
            out[i, :] = w * v + (1 - w) * m
        return out

    answerable(fused, lambda *x: fused(*x, swapped=True),
               lambda r, v, tau2: v05.fused_baseline(r, prior=v, prior_var=tau2)[0],
               notebook("fused_inputs"))
