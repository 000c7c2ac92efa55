"""36_hgpo: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb36_level_advantages_and_weights(notebook, answerable):
    from agentrl_lib.algorithms import hgpo

    def right_levels(states, actions, rewards, k, gamma, ddof=1):
        groups = {}
        for i, (ss, aa, rr) in enumerate(zip(states, actions, rewards)):
            for t in range(len(ss)):
                start = 0 if k is None else max(0, t - k)
                ctx = tuple(x for j in range(start, t) for x in (ss[j], aa[j])) + (ss[t],)
                g = sum(gamma ** (j - t) * rr[j] for j in range(t, len(rr)))
                groups.setdefault(ctx, []).append((i, t, g))
        out = [np.zeros(len(ss)) for ss in states]
        for members in groups.values():
            g = np.array([m[2] for m in members])
            if len(g) > 1 and g.max() > g.min():
                for (i, t, _), z in zip(members, (g - g.mean()) / (g.std(ddof=ddof) + 1e-4)):
                    out[i][t] = z
        return out

    def right_weights(sizes, weighting, alpha, keep_singletons=False):
        K1 = len(sizes)
        ok = [s >= 2 or keep_singletons for s in sizes]
        w = np.zeros(K1)
        if not any(ok):
            return w
        if weighting == "deepest":
            w[max(k for k in range(K1) if ok[k])] = 1.0
            return w
        for k in range(K1):
            if ok[k]:
                w[k] = (k + 1.0) ** (alpha if weighting == "power" else 0.0)
        return w / w.sum()

    answerable(right_levels, lambda *x: right_levels(*x, ddof=0),  # the population std
               notebook("level_reference"), notebook("level_inputs"))
    answerable(right_weights, lambda *x: right_weights(*x, keep_singletons=True),  # singletons
               hgpo.hierarchy_weights, notebook("weight_inputs"))
