"""02_policy_gradients: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np

from agentrl_lib import core


def test_nb02_rloo_and_grpo_scale(notebook, answerable):
    import itertools

    from agentrl_lib.algorithms import pg

    def right_rloo(r):  # the (G-1)/G identity
        G = r.shape[-1]
        return G / (G - 1) * (r - r.mean(-1, keepdim=True))

    def wrong_rloo(r):  # the mean includes sample i (Dr. GRPO)
        return r - r.mean(-1, keepdim=True)

    def grpo_scale_by_enumeration(p, G, ddof):
        """sum over all 2^G reward patterns of P(pattern) A_1 (r_1/p - (1-r_1)/(1-p))."""
        total = 0.0
        for rs in itertools.product((0.0, 1.0), repeat=G):
            r = np.array(rs)
            prob = np.prod(np.where(r == 1, p, 1 - p))
            a1 = (r[0] - r.mean()) / (r.std(ddof=ddof) + 1e-4)
            total += prob * a1 * (r[0] / p - (1 - r[0]) / (1 - p))
        return total

    answerable(right_rloo, wrong_rloo, core.rloo_advantages, notebook("rloo_inputs"))
    answerable(lambda p, G: grpo_scale_by_enumeration(p, G, 1),
               lambda p, G: grpo_scale_by_enumeration(p, G, 0),  # the population std
               lambda p, G: pg.expected_gradient_scale(p, G, "grpo"), notebook("scale_inputs"))
