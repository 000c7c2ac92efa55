"""72_step_q: its checked exercises, answered right and wrong (see conftest.py)."""

import math

import numpy as np


def test_nb72_q_star_and_uct(notebook, answerable):
    from agentrl_lib.algorithms import step_q as sq

    def right_q(mdp, H, reverse=False):
        P, R, term = mdp.P.numpy(), mdp.R.numpy(), mdp.terminal.numpy()
        S, A = R.shape
        Q = np.zeros((H, S, A))
        for t in reversed(range(H)):  # H - t turns left
            for s in range(S):
                for a in range(A):
                    if term[s]:
                        continue
                    future = 0.0
                    if t + 1 < H:
                        future = sum(P[s, a, s2] * Q[t + 1, s2].max() for s2 in range(S))
                    Q[t, s, a] = R[s, a] + mdp.gamma * future
        return Q[::-1].copy() if reverse else Q

    def right_uct(q, n, N, c, log_of_parent=True):
        out = np.full(len(q), np.inf)
        for a in range(len(q)):
            if n[a] > 0:
                ln = math.log(max(N, 1)) if log_of_parent else max(N, 1)
                out[a] = q[a] + c * math.sqrt(ln / n[a])
        return out

    answerable(right_q, lambda m, H: right_q(m, H, reverse=True),  # indexed by turns left
               lambda m, H: sq.finite_horizon_q(m, None, H), notebook("q_star_inputs"))
    answerable(right_uct, lambda *x: right_uct(*x, log_of_parent=False),  # sqrt(N / n): no log
               sq.uct_scores, notebook("uct_inputs"))
