"""04_rover: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def _leaf_tokens(leaf, V, H):
    tokens = []
    for _ in range(H):
        leaf, a = divmod(leaf, V)
        tokens.append(a)
    return tokens[::-1]


def test_nb04_uniform_q_and_distinct_correct(notebook, answerable):
    def q_by_counting(tree, best=False):
        """Per depth, count the correct leaves below each child (or whether there is one)."""
        V, H = tree.V, tree.H
        out = []
        for d in range(H):
            q = np.zeros((V**d, V))
            for leaf in range(V**H):
                toks = _leaf_tokens(leaf, V, H)
                node = 0
                for a in toks[:d]:
                    node = node * V + a
                r = float(tree.reward[leaf])
                q[node, toks[d]] = max(q[node, toks[d]], r) if best else q[node, toks[d]] + r
            out.append(q if best else q / V ** (H - d - 1))
        return out

    def distinct(tree, probs, n, with_repeats=False):
        total = 0.0
        for leaf in tree.correct_ids.tolist():
            p, node = 1.0, 0
            for d, a in enumerate(_leaf_tokens(leaf, tree.V, tree.H)):
                p *= float(probs[d][node, a])
                node = node * tree.V + a
            total += n * p if with_repeats else 1.0 - (1.0 - p) ** n
        return total

    answerable(q_by_counting, lambda t: q_by_counting(t, best=True),  # Q* instead of Q^u
               lambda t: t.uniform_q(), notebook("tree_inputs"))
    answerable(distinct, lambda t, p, n: distinct(t, p, n, with_repeats=True),  # counts repeats
               lambda t, p, n: t.expected_distinct_correct(p, n), notebook("tree_policy_inputs"))
