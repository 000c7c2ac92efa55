"""31_gigpo: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb31_gigpo(notebook, answerable, normalise):
    from agentrl_lib.algorithms import credit

    def right(episodes, gamma, omega, norm_adv, anchors_within_group=True):
        rtg = [[sum(gamma ** (k - t) * ep.rewards[k] for k in range(t, len(ep)))
                for t in range(len(ep))] for ep in episodes]
        a_e = np.zeros(len(episodes))
        for g in {ep.group_id for ep in episodes}:
            idx = [i for i, ep in enumerate(episodes) if ep.group_id == g]
            a_e[idx] = normalise([sum(episodes[i].rewards) for i in idx], norm_adv)
        anchors = {}
        for i, ep in enumerate(episodes):
            for t, s in enumerate(ep.state_keys):
                key = (ep.group_id, s) if anchors_within_group else s
                anchors.setdefault(key, []).append((i, t))
        out = [np.full(len(ep), a_e[i]) for i, ep in enumerate(episodes)]
        for members in anchors.values():
            for (i, t), a in zip(members, normalise([rtg[i][t] for i, t in members], norm_adv)):
                out[i][t] += omega * a
        return out

    answerable(right, lambda *a: right(*a, anchors_within_group=False),  # pools across groups
               lambda eps, g, w, n: credit.gigpo_advantages(eps, gamma=g, omega=w, norm_adv=n),
               notebook("gigpo_inputs"))
