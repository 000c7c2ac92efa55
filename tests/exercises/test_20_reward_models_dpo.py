"""20_reward_models_dpo: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb20_dpo_loss_and_kl_optimum(notebook, answerable):
    from agentrl_lib.algorithms import dpo

    def right_dpo(c, r, rc, rr, beta, with_ref=True):
        c, r, rc, rr = (np.asarray(x, dtype=float) for x in (c, r, rc, rr))
        h = (c - rc) - (r - rr) if with_ref else c - r
        z = beta * h
        return np.logaddexp(0.0, -z)  # -log sigma(z)

    def right_optimum(ref, rew, beta, temper=True):
        logits = [np.log(p) + (x / beta if temper else x) for p, x in zip(ref, rew)]
        top = max(logits)
        w = [np.exp(v - top) for v in logits]
        return np.array(w) / sum(w)

    answerable(right_dpo, lambda *x: right_dpo(*x, with_ref=False),  # forgets the reference
               lambda c, r, rc, rr, beta: dpo.dpo_loss(c, r, rc, rr, beta=beta)[0],
               notebook("dpo_inputs"))
    # the wrong one weighs by e^r instead of e^{r/beta}
    answerable(right_optimum, lambda *x: right_optimum(*x, temper=False),
               dpo.kl_optimal_policy, notebook("kl_optimal_inputs"))
