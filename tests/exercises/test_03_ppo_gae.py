"""03_ppo_gae: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np

from agentrl_lib import core


def test_nb03_gae_and_ppo_loss(notebook, answerable):
    def gae_sum(r, v, done, v_last, gamma, lam, carry_over_ends):
        """A_t = sum_l (gamma lam)^l delta_{t+l}, stopped after an episode's end (unless told
        not to)."""
        r, v, done, v_last = (np.asarray(x, dtype=float) for x in (r, v, done, v_last))
        B, T = r.shape
        adv = np.zeros((B, T))
        for b in range(B):
            v_next = np.append(v[b, 1:], v_last[b])
            stop = done[b] if not carry_over_ends else np.zeros(T)
            delta = r[b] + gamma * v_next * (1 - stop) - v[b]
            for t in range(T):
                weight = 1.0
                for k in range(t, T):
                    adv[b, t] += weight * delta[k]
                    if stop[k]:
                        break
                    weight *= gamma * lam
        return adv, adv + v

    def right_ppo(lp, old, a):
        ratio = np.exp(np.asarray(lp) - np.asarray(old))
        a = np.asarray(a)
        return -np.mean(np.minimum(ratio * a, np.clip(ratio, 0.8, 1.2) * a))

    def wrong_ppo(lp, old, a):  # clips without the min: no pessimism
        ratio = np.exp(np.asarray(lp) - np.asarray(old))
        return -np.mean(np.clip(ratio, 0.8, 1.2) * np.asarray(a))

    answerable(lambda *x: gae_sum(*x, carry_over_ends=False),
               lambda *x: gae_sum(*x, carry_over_ends=True), core.gae_advantages,
               notebook("gae_inputs"))
    answerable(right_ppo, wrong_ppo, lambda lp, old, a: core.ppo_clip_loss(lp, old, a)[0],
               notebook("ppo_inputs"))
