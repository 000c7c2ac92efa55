"""55_arpo: its checked exercises, answered right and wrong (see conftest.py)."""

import math

import numpy as np


def test_nb55_hard_attribution_and_global_count(notebook, answerable):
    from agentrl_lib.algorithms import arpo

    def right_attr(node_ids, leaf_adv, divide=True):
        out = []
        for ids in node_ids:
            steps = []
            for n in ids:
                sharing = [j for j, other in enumerate(node_ids) if n in other]
                mean = sum(leaf_adv[j] for j in sharing) / len(sharing)
                steps.append(mean / len(sharing) if divide else mean)
            out.append(np.array(steps))
        return out

    def right_count(M, h_root, h_tool, kappa, h_max, rounding=round):
        sigma = 1.0 / (1.0 + math.exp(-kappa * (h_root - h_tool) / h_max))
        return int(min(max(rounding(M * sigma), 1), M))

    answerable(right_attr, lambda *x: right_attr(*x, divide=False),  # each copy gets the mean
               lambda ids, a: arpo.attribute(ids, a, "hard"), notebook("tree_inputs"))
    answerable(right_count, lambda *x: right_count(*x, rounding=math.floor),  # floors
               arpo.global_count, notebook("count_inputs"))
