"""34_credit_arena: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb34_pg_direction_and_affine_mse(notebook, answerable):
    from agentrl_lib.analysis import arena

    def right_pg(rows, actions, adv, probs, num_rows, num_episodes, baseline=True):
        g = np.zeros((num_rows, probs.shape[1]))
        for s, a, A in zip(rows, actions, adv):
            grad = -probs[s] if baseline else np.zeros(probs.shape[1])
            grad = grad.copy()
            grad[a] += 1.0
            g[s] += A * grad
        return g / num_episodes

    def right_affine(est, exact, fit=True):
        if not fit:  # the raw error, no rescaling
            return float(np.mean((est - exact) ** 2))
        X = np.stack([est, np.ones(len(est))], 1)
        coef = np.linalg.lstsq(X, exact, rcond=None)[0]
        return float(np.mean((X @ coef - exact) ** 2))

    answerable(right_pg, lambda *x: right_pg(*x, baseline=False),  # d log pi = one-hot only
               arena.pg_direction, notebook("pg_inputs"))
    answerable(right_affine, lambda e, x: right_affine(e, x, fit=False), arena.affine_mse,
               notebook("affine_inputs"))
