"""53_slate: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb53_expected_step_reward(notebook, answerable):
    import math

    from agentrl_lib.algorithms import slate
    from agentrl_lib.rewards.judges import NoisyJudge

    def by_integration(q, c, sigma, clip=True):
        """E[clip(X, 0, 1)] = int_0^1 P(X > t) dt (Simpson on a fine grid), X ~ N(mu, sigma^2)."""
        mu = c * np.asarray(q, dtype=float) + (1 - c) / 2
        if not clip:
            return 2 * mu - 1
        if sigma == 0:
            return 2 * np.clip(mu, 0, 1) - 1
        t = np.linspace(0.0, 1.0, 4001)
        w = np.ones_like(t)
        w[1:-1:2], w[2:-1:2] = 4, 2
        out = []
        for m in mu:
            tail = np.array([0.5 * math.erfc((x - m) / (sigma * math.sqrt(2))) for x in t])
            out.append((t[1] - t[0]) / 3 * np.sum(w * tail))
        return 2 * np.array(out) - 1

    answerable(by_integration, lambda *a: by_integration(*a, clip=False),  # forgets the clip
               lambda q, c, s: slate.expected_step_reward(q, NoisyJudge(compression=c, sigma=s)),
               notebook("judge_inputs"))
