"""37_oprl: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb37_trajectory_dpo_and_istar_advantages(notebook, answerable):
    from agentrl_lib.algorithms import oprl

    def right_dpo(lp, ref, owner, B, chosen, rejected, beta, per_turn_mean=False):
        lp, ref, owner = np.asarray(lp), np.asarray(ref), np.asarray(owner)
        ratio = np.zeros(B)
        for n in range(len(owner)):
            ratio[owner[n]] += lp[n] - ref[n]
        if per_turn_mean:  # averages the log-ratio over the turns instead of summing
            ratio /= np.bincount(owner, minlength=B)
        h = beta * (ratio[np.asarray(chosen)] - ratio[np.asarray(rejected)])
        return float(np.mean(np.log1p(np.exp(-h))))

    def normalise(x):
        x = np.asarray(x, dtype=float)
        if len(x) < 2 or x.max() == x.min():
            return np.zeros(len(x))
        return (x - x.mean()) / (x.std(ddof=1) + 1e-4)

    def right_istar(outcomes, step_rewards, alpha, per_episode_steps=False):
        a_e = normalise(outcomes)
        if per_episode_steps:  # normalises each episode's steps on their own
            a_s = [normalise(r) for r in step_rewards]
        else:
            flat = normalise(np.concatenate(step_rewards))
            a_s = np.split(flat, np.cumsum([len(r) for r in step_rewards])[:-1])
        return [a_e[i] + alpha * a_s[i] for i in range(len(outcomes))]

    answerable(right_dpo, lambda *x: right_dpo(*x, per_turn_mean=True),
               lambda *a: oprl.trajectory_dpo_loss(*a)[0], notebook("dpo_inputs"))
    answerable(right_istar, lambda *x: right_istar(*x, per_episode_steps=True),
               notebook("istar_reference"), notebook("istar_inputs"))
