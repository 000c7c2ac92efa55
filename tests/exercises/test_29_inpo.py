"""29_inpo: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb29_omd_update(notebook, answerable):
    from agentrl_lib.algorithms import inpo

    def right(pi_t, ref, P, beta, eta, transpose=False):
        K = len(pi_t)
        win = [sum((P[j][y] if transpose else P[y][j]) * pi_t[j] for j in range(K))
               for y in range(K)]
        logits = [(1 - eta * beta) * np.log(pi_t[y]) + eta * beta * np.log(ref[y]) + eta * win[y]
                  for y in range(K)]
        w = np.exp(np.array(logits) - max(logits))
        return w / w.sum()

    answerable(right, lambda *a: right(*a, transpose=True),  # P^T pi_t: the rate of losing
               inpo.omd_update, notebook("omd_inputs"))
