"""35_salt: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb35_salt_edge_mean(notebook, answerable):
    def right(states, actions, outcomes, edge=lambda s, a: (s, a)):
        a_traj = np.array(outcomes) - np.mean(outcomes)
        traversals = {}
        for i, (ss, aa) in enumerate(zip(states, actions)):
            for s, a in zip(ss, aa):
                traversals.setdefault(edge(s, a), []).append(a_traj[i])
        return [np.array([np.mean(traversals[edge(s, a)]) for s, a in zip(ss, aa)])
                for ss, aa in zip(states, actions)]

    answerable(right, lambda *x: right(*x, edge=lambda s, a: s),  # merges nodes, not edges
               notebook("salt_reference"), notebook("salt_inputs"))
