"""40_hiper: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb40_hae(notebook, answerable):
    def hae_forward(r, v, seg, v_last, gamma, lam, cut=True):
        """A_t = sum_{j=t}^{e-1} prod(gamma * lam_j) delta_j, e the segment's end (the episode's
        end when not cut); the segment's first turn uses lam = 1."""
        T = len(r)
        v_next = np.append(v[1:], v_last)
        delta = r + gamma * v_next - v
        out = np.zeros(T)
        for t in range(T):
            first = t == 0 or seg[t - 1] != seg[t]
            c = gamma * (1.0 if first and cut else lam)
            end = max(j for j in range(T) if seg[j] == seg[t]) if cut else T - 1
            out[t] = sum(c ** (j - t) * delta[j] for j in range(t, end + 1))
        return out

    answerable(hae_forward, lambda *a: hae_forward(*a, cut=False),  # flat GAE: no cut
               notebook("hae_reference"), notebook("hae_inputs"))
