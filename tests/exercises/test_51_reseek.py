"""51_reseek: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb51_process_rewards_and_turn_advantages(notebook, answerable):
    def process(env_r, c, u, judge, truth, penalise_wrong=True):
        out = []
        for t in range(len(env_r)):
            r = env_r[t] + 0.2 * c[t] + 0.2 * u[t]
            if judge[t] is not None:
                r += 0.1 if judge[t] == truth[t] else (-0.1 if penalise_wrong else 0.0)
            out.append(r)
        return np.array(out)

    def turn_adv(turn_rewards, group_ids, to_go=True):
        rtg = []
        for r in turn_rewards:
            r = list(r)
            rtg.append([sum(r[t:]) if to_go else r[t] for t in range(len(r))])
        out = []
        for i, g in enumerate(rtg):
            pool = [x for k, h in enumerate(rtg) if group_ids[k] == group_ids[i] for x in h]
            if len(pool) < 2 or max(pool) - min(pool) < 1e-12:
                out.append(np.zeros(len(g)))
            else:
                out.append((np.array(g) - np.mean(pool)) / (np.std(pool, ddof=1) + 1e-4))
        return out

    # wrong: no penalty for a wrong verdict
    answerable(process, lambda *a: process(*a, penalise_wrong=False),
               notebook("process_reference"), notebook("flag_inputs"))
    answerable(turn_adv, lambda *a: turn_adv(*a, to_go=False),  # the turn's own reward, not G_t
               notebook("turn_reference"), notebook("turn_inputs"))
