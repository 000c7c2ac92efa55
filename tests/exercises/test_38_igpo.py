"""38_igpo: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb38_igpo_advantages(notebook, answerable):
    def right(outcomes, p_gold, gamma, normalise_after_sum=False):
        rewards = []
        for R, p in zip(outcomes, p_gold):
            r = [p[t + 1] - p[t] for t in range(len(p) - 1)]
            r[-1] = R
            rewards.append(np.array(r))

        def to_go(r):
            return np.array([sum(gamma ** (k - t) * r[k] for k in range(t, len(r)))
                             for t in range(len(r))])

        def normalise(parts):
            flat = np.concatenate(parts)
            if len(flat) < 2 or flat.max() == flat.min():
                flat = np.zeros(len(flat))
            else:
                flat = (flat - flat.mean()) / (flat.std(ddof=1) + 1e-4)
            return np.split(flat, np.cumsum([len(x) for x in parts])[:-1])

        if normalise_after_sum:  # sums to go first, then normalises the returns
            return normalise([to_go(r) for r in rewards])
        return [to_go(r) for r in normalise(rewards)]

    answerable(right, lambda *x: right(*x, normalise_after_sum=True), notebook("igpo_reference"),
               notebook("igpo_inputs"))
