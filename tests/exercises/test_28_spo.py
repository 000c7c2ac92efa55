"""28_spo: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb28_self_play_rewards_and_pg_step(notebook, answerable):
    from agentrl_lib.algorithms import spo

    def right_rewards(wins):
        N = len(wins)
        return np.array([sum(wins[i][j] for j in range(N) if j != i) / (N - 1) for i in range(N)])

    def wrong_rewards(wins):  # the row mean: reads the diagonal and divides by N
        return np.asarray(wins, dtype=float).mean(1)

    def right_pg(theta, ys, r, lr, alpha, soft=True):
        pi = np.exp(theta - theta.max())
        pi /= pi.sum()
        r_soft = np.array([r[i] - (alpha * np.log(pi[y]) if soft else 0.0)
                           for i, y in enumerate(ys)])
        g = np.zeros(len(theta))
        for i, y in enumerate(ys):
            grad_logp = -pi.copy()
            grad_logp[y] += 1.0
            g += (r_soft[i] - r_soft.mean()) * grad_logp / len(ys)
        return theta + lr * g

    answerable(right_rewards, wrong_rewards, spo.self_play_rewards, notebook("wins_inputs"))
    answerable(right_pg, lambda *a: right_pg(*a, soft=False),  # drops the entropy bonus
               lambda *a: spo.pg_step(*a)[0], notebook("pg_inputs"))
