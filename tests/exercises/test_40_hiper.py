"""40_hiper: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb40_hae(notebook, answerable):
    def hae_forward(r, v, seg, v_last, gamma, lam, lam_seg, cut=True):
        """An executor turn: A_t = sum_{j=t}^{e-1} (gamma lam)^{j-t} delta_j, e its segment's end
        (the episode's end when not cut). A segment's first turn: its segment's sum with lam = 1,
        plus each later segment's, weighted by the product of gamma^{d} lam_seg over the
        boundaries crossed (the released segment-level GAE)."""
        T = len(r)
        v_next = np.append(v[1:], v_last)
        delta = r + gamma * v_next - v
        end = [max(j for j in range(T) if seg[j] == seg[t]) if cut else T - 1 for t in range(T)]
        out = np.zeros(T)
        for t in range(T):
            first = t == 0 or seg[t - 1] != seg[t]
            if not (first and cut):
                out[t] = sum((gamma * lam) ** (j - t) * delta[j] for j in range(t, end[t] + 1))
                continue
            w, b = 1.0, t
            while b < T:
                out[t] += w * sum(gamma ** (j - b) * delta[j] for j in range(b, end[b] + 1))
                w *= gamma ** (end[b] + 1 - b) * lam_seg
                b = end[b] + 1
        return out

    answerable(hae_forward, lambda *a: hae_forward(*a, cut=False),  # flat GAE: no cut
               notebook("hae_reference"), notebook("hae_inputs"))
