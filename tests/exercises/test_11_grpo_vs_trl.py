"""11_grpo_vs_trl: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np

from agentrl_lib import core


def test_nb11_grpo_loss(notebook, answerable):
    from agentrl_lib.algorithms import grpo
    from agentrl_lib.algorithms.grpo import GRPOConfig

    def grpo_loss(lp, old, ref, r, mask, per_sequence=True):
        lp, old, ref, r, mask = (np.asarray(x, dtype=float) for x in (lp, old, ref, r, mask))
        G, T = lp.shape
        mu = r.mean()
        sd = np.sqrt(((r - mu) ** 2).sum() / (G - 1))
        adv = np.zeros(G) if r.max() == r.min() else (r - mu) / (sd + 1e-4)
        rows, total, n = [], 0.0, 0.0
        for i in range(G):
            s = 0.0
            for t in range(T):
                if not mask[i, t]:
                    continue
                rho = np.exp(lp[i, t] - old[i, t])
                surr = min(rho * adv[i], min(max(rho, 0.8), 1.2) * adv[i])
                log_r = ref[i, t] - lp[i, t]
                s += -surr + 0.04 * (np.exp(log_r) - 1 - log_r)
            rows.append(s / mask[i].sum())
            total, n = total + s, n + mask[i].sum()
        return sum(rows) / G if per_sequence else total / n

    answerable(grpo_loss, lambda *x: grpo_loss(*x, per_sequence=False),  # token_mean, not GRPO's
               lambda lp, old, ref, r, m: grpo.policy_loss(
                    lp, old, core.grpo_advantages(r), m, GRPOConfig(beta=0.04), ref)[0],
               notebook("grpo_loss_inputs"))
