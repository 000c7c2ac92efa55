"""22_barfi: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb22_pbrs(notebook, answerable):
    from agentrl_lib.rewards import shaping

    def right_pbrs(R, phi, gamma, P, terminal, zero_at_terminal=True):
        R, phi, P, term = (np.asarray(x) for x in (R, phi, P, terminal))
        Phi = np.where(term, 0.0, phi) if zero_at_terminal else phi
        S, A = R.shape
        out = np.zeros((S, A))
        for s in range(S):
            for a in range(A):
                out[s, a] = R[s, a] + gamma * sum(P[s, a, t] * Phi[t] for t in range(S)) - Phi[s]
        return out

    # the wrong one keeps Phi at terminal states
    answerable(right_pbrs, lambda *x: right_pbrs(*x, zero_at_terminal=False),
               lambda R, phi, gamma, P, term: shaping.pbrs(R, phi, gamma, P=P, terminal=term),
               notebook("pbrs_inputs"))
