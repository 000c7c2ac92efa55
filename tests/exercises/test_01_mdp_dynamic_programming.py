"""01_mdp_dynamic_programming: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np
import torch


def test_nb01_policy_evaluation_and_q_from_v(notebook, answerable):
    from agentrl_lib.algorithms import dp

    def right_eval(mdp, pi):  # iterate the Bellman expectation operator to its fixed point
        P, R, live = mdp.P.numpy(), mdp.R.numpy(), ~mdp.terminal.numpy()
        pi = np.asarray(pi)
        V = np.zeros(len(live))
        for _ in range(5000):
            V = live * ((pi * R).sum(1) + mdp.gamma * np.einsum("sa,sat,t->s", pi, P, V))
        return V

    def wrong_eval(mdp, pi):  # forgets that terminal states collect nothing
        P, R = mdp.P.numpy(), mdp.R.numpy()
        pi = np.asarray(pi)
        P_pi = np.einsum("sa,sat->st", pi, P)
        return np.linalg.solve(np.eye(len(P)) - mdp.gamma * P_pi, (pi * R).sum(1))

    def right_q(mdp, v):
        S, A = mdp.R.shape
        Q = np.zeros((S, A))
        for s in range(S):
            for a in range(A):
                if not mdp.terminal[s]:
                    Q[s, a] = float(mdp.R[s, a]) + mdp.gamma * float(mdp.P[s, a] @ v)
        return Q

    def wrong_q(mdp, v):  # no zero at terminal states
        return mdp.R + mdp.gamma * torch.einsum("sat,t->sa", mdp.P, v)

    answerable(right_eval, wrong_eval, dp.policy_evaluation, notebook("exercise_mdp"))
    answerable(right_q, wrong_q, dp.q_from_v, notebook("exercise_mdp_v"))
