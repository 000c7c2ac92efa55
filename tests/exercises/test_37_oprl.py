"""37_oprl: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb37_trajectory_dpo_and_istar_advantages(notebook, answerable):
    from agentrl_lib.algorithms import oprl

    def right_dpo(lp, ref, owner, B, chosen, rejected, beta, summed=False):
        lp, ref, owner = np.asarray(lp), np.asarray(ref), np.asarray(owner)
        ratio = np.zeros(B)
        for n in range(len(owner)):
            ratio[owner[n]] += lp[n] - ref[n]
        if not summed:  # the released score: the mean over the episode's turns
            ratio /= np.bincount(owner, minlength=B)
        h = beta * (ratio[np.asarray(chosen)] - ratio[np.asarray(rejected)])
        return float(np.mean(np.log1p(np.exp(-h))))

    def right_istar(outcomes, step_rewards, alpha, all_turn_mean=False):
        n = len(outcomes)
        scale = max(np.abs(r).max() for r in step_rewards) + 1e-6  # istar_norm
        r = [np.asarray(x) / scale for x in step_rewards]
        if all_turn_mean:  # centres on the mean of every turn instead of each episode's first
            m = np.concatenate(r).mean()
        else:
            m = np.mean([x[0] for x in r])
        mean_r = np.mean(outcomes)
        return [n / (n - 1) * (outcomes[i] - mean_r) + alpha * n / (n - 1) * (r[i] - m)
                for i in range(n)]

    answerable(right_dpo, lambda *x: right_dpo(*x, summed=True),
               lambda *a: oprl.trajectory_dpo_loss(*a)[0], notebook("dpo_inputs"))
    answerable(right_istar, lambda *x: right_istar(*x, all_turn_mean=True),
               notebook("istar_reference"), notebook("istar_inputs"))
