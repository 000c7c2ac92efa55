"""52_treeps_rag: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb52_process_advantages(notebook, answerable):
    def process(paths, rets, group_ids, local=True):
        out = []
        for i, p in enumerate(paths):
            mates = [k for k in range(len(paths)) if group_ids[k] == group_ids[i]]
            r = np.array([rets[k] for k in mates])
            if len(r) < 2 or r.min() == r.max():
                out.append(np.zeros(len(p)))
                continue

            def value(prefix):
                return np.mean([rets[k] for k in mates if paths[k].startswith(prefix)])

            base = [value(p[:t]) if local else value("") for t in range(len(p))]
            step = np.array([value(p[:t + 1]) - base[t] for t in range(len(p))])
            out.append(step / (r.std(ddof=1) + 1e-4))
        return out

    # wrong: V(n_{t+1}) - V(root), the global term alone
    answerable(process, lambda *a: process(*a, local=False),
               notebook("process_reference"), notebook("tree_inputs"))
