"""27_dpo_rationales: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb27_rdpo_loss(notebook, answerable):
    def right(theta, phi_w, phi_l, rationale, beta, gamma, beta_in_rationale=True):
        theta, phi_w, phi_l = (np.asarray(x) for x in (theta, phi_w, phi_l))
        out = []
        for b in range(len(phi_w)):
            e = theta * (phi_w[b] - phi_l[b]) * (beta if beta_in_rationale else 1.0)  # (A,)
            margin = beta * float(theta @ (phi_w[b] - phi_l[b]))
            log_p = e[int(rationale[b])] - np.log(np.sum(np.exp(e)))
            out.append(np.log1p(np.exp(-margin)) - gamma * log_p)
        return np.array(out)

    answerable(right, lambda *a: right(*a, beta_in_rationale=False),  # contributions without beta
               notebook("rdpo_reference"), notebook("rdpo_inputs"))
