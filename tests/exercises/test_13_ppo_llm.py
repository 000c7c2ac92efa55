"""13_ppo_llm: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb13_token_advantages(notebook, answerable):
    from agentrl_lib.algorithms import ppo_lm

    def token_adv(scores, values, mask, lam, reward_at_end_of_window=False):
        s, v, m = (np.asarray(x, dtype=float) for x in (scores, values, mask))
        B, T = v.shape
        adv, ret = np.zeros((B, T)), np.zeros((B, T))
        for b in range(B):
            n = int(m[b].sum())
            r = np.zeros(T)
            r[T - 1 if reward_at_end_of_window else n - 1] = s[b]
            a = 0.0
            for t in reversed(range(n)):
                v_next = v[b, t + 1] if t + 1 < n else 0.0
                a = r[t] + v_next - v[b, t] + lam * a
                adv[b, t], ret[b, t] = a, a + v[b, t]
        return adv, ret

    # the wrong one ignores the mask
    answerable(token_adv, lambda *x: token_adv(*x, reward_at_end_of_window=True),
               lambda s, v, m, lam: ppo_lm.token_gae(ppo_lm.token_rewards(s, m), v, m, 1.0, lam),
               notebook("token_adv_inputs"))
