"""71_bcoder: its checked exercises, answered right and wrong (see conftest.py)."""

import math

import numpy as np


def test_nb71_bellman_targets_and_cql(notebook, answerable):
    from agentrl_lib.algorithms import bcoder

    def right_targets(next_max_q, rewards, mask, gamma, bootstrap_last=False):
        q, r, m = np.asarray(next_max_q), np.asarray(rewards), np.asarray(mask)
        y = np.zeros_like(q)
        for b in range(q.shape[0]):
            n = int(m[b].sum())
            for t in range(n):
                if t < n - 1:
                    y[b, t] = gamma * q[b, t]
                else:  # the last token: the verdict, nothing after it
                    y[b, t] = r[b] + (gamma * q[b, t] if bootstrap_last else 0.0)
        return y

    def right_cql(q_all, q_data, mask, use_mask=True):
        q, qd, m = np.asarray(q_all), np.asarray(q_data), np.asarray(mask)
        if not use_mask:
            m = np.ones_like(m)
        gaps = [math.log(np.exp(q[b, t]).sum()) - qd[b, t]
                for b in range(m.shape[0]) for t in range(m.shape[1]) if m[b, t]]
        return sum(gaps) / len(gaps) if gaps else 0.0

    # the wrong one bootstraps past the end: r + gamma max Q on the last token
    answerable(right_targets, lambda *x: right_targets(*x, bootstrap_last=True),
               bcoder.bellman_targets, notebook("bellman_inputs"))
    answerable(right_cql, lambda *x: right_cql(*x, use_mask=False),  # counts the padding
               lambda q, qd, m: bcoder.cql_penalty(q, qd, m)[0], notebook("cql_inputs"))
