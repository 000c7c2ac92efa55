"""21_starc: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb21_epic_and_starc(notebook, answerable):
    from agentrl_lib.rewards import distances

    def epic(R, gamma, constant=True):
        R = np.asarray(R)
        S, A, _ = R.shape
        m = [R[x].mean() for x in range(S)]
        shift = gamma * np.mean(m) if constant else 0.0
        out = np.zeros_like(R)
        for s in range(S):
            for a in range(A):
                for t in range(S):
                    out[s, a, t] = R[s, a, t] + gamma * m[t] - m[s] - shift
        return out

    def advantage(R, P, gamma):
        R, P = np.asarray(R), np.asarray(P)
        S, A, _ = R.shape
        r = (P * R).sum(-1)  # (S, A)
        P_pi = P.mean(1)  # (S, S) under the uniform policy
        V = np.linalg.solve(np.eye(S) - gamma * P_pi, r.mean(1))
        Q = r + gamma * P @ V
        return np.repeat((Q - V[:, None])[:, :, None], S, axis=2)

    def starc(R1, R2, P, gamma, canonical=True):
        c1, c2 = ((advantage(R, P, gamma) if canonical else np.asarray(R)) for R in (R1, R2))
        s1, s2 = (c / np.linalg.norm(c) if np.linalg.norm(c) > 1e-12 else 0 * c for c in (c1, c2))
        return 0.5 * np.linalg.norm(s1 - s2)

    answerable(epic, lambda *x: epic(*x, constant=False), distances.epic_canonicalize,
               notebook("reward_inputs"))
    answerable(starc, lambda *x: starc(*x, canonical=False),  # raw rewards, no levelling
               lambda R1, R2, P, gamma: distances.starc_distance(R1, R2, gamma, P)[0],
               notebook("starc_inputs"))
