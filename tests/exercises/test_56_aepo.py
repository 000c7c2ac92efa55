"""56_aepo: its checked exercise, answered right and wrong (see conftest.py)."""

import math


def test_nb56_global_count(notebook, answerable):
    from agentrl_lib.algorithms import arpo

    def right_count(M, h_root, h_tool, kappa, h_max, extra=1):
        sigma = 1.0 / (1.0 + math.exp(-kappa * (h_root - h_tool) / h_max))
        return int(min(max(int(M * sigma) + extra, 1), M))

    answerable(right_count, lambda *x: right_count(*x, extra=0),  # forgets the code's + 1
               arpo.global_count, notebook("count_inputs"))
