"""55_arpo: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb55_hard_attribution_and_fork_probability(notebook, answerable):
    from agentrl_lib.algorithms import arpo

    def right_attr(node_ids, leaf_adv, divide=False):
        out = []
        for ids in node_ids:
            steps = []
            for n in ids:
                sharing = [j for j, other in enumerate(node_ids) if n in other]
                mean = sum(leaf_adv[j] for j in sharing) / len(sharing)
                steps.append(mean / len(sharing) if divide else mean)
            out.append(np.array(steps))
        return out

    def right_prob(dh, alpha, beta, clip=True):
        p = alpha + beta * dh
        return min(max(p, 0.0), 1.0) if clip else p

    answerable(right_attr, lambda *x: right_attr(*x, divide=True),  # the mean counted once
               lambda ids, a: arpo.attribute(ids, a, "hard"), notebook("tree_inputs"))
    answerable(right_prob, lambda *x: right_prob(*x, clip=False),  # forgets the clip
               arpo.branch_probability, notebook("prob_inputs"))
