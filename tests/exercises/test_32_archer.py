"""32_archer: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb32_v_targets_and_pessimistic_advantage(notebook, answerable):
    from agentrl_lib.algorithms import archer

    def right_v(q_t, probs, greedy=False):
        q, p = np.asarray(q_t), np.asarray(probs)
        B, E, _ = q.shape
        A = p.shape[1]
        out = np.zeros((B, E))
        for b in range(B):
            for e in range(E):
                out[b, e] = (q[b, e, :A].max() if greedy
                             else sum(p[b, a] * q[b, e, a] for a in range(A)))
        return out

    def right_adv(q, v, a, agg=min):
        q, v, a = np.asarray(q), np.asarray(v), np.asarray(a)
        return np.array([agg(q[b, :, a[b]]) - agg(v[b]) for b in range(len(a))])

    answerable(right_v, lambda q, p: right_v(q, p, greedy=True),  # the Q-learning max target
               archer.v_targets, notebook("v_target_inputs"))
    answerable(right_adv, lambda q, v, a: right_adv(q, v, a, agg=np.mean),  # ensemble mean
               archer.advantages_from_critic, notebook("advantage_inputs"))
