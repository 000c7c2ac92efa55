"""30_multiturn_agent: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb30_grpo_broadcast_and_token_advantages(notebook, answerable, normalise):
    from agentrl_lib.algorithms import credit

    def right_broadcast(episodes, by_group=True):
        returns = np.array([sum(ep.rewards) for ep in episodes])
        adv = np.zeros(len(episodes))
        keys = [ep.group_id if by_group else 0 for ep in episodes]
        for g in set(keys):
            idx = [i for i, k in enumerate(keys) if k == g]
            adv[idx] = normalise(returns[idx])
        return [np.full(len(ep), a) for ep, a in zip(episodes, adv)]

    def right_tokens(episodes, turn_adv, with_observations=False):
        out = []
        for ep, adv in zip(episodes, turn_adv):
            x = np.zeros(len(ep.token_ids))
            for t, (start, end) in enumerate(ep.turn_spans):
                if with_observations:  # also credits the observation before the action
                    start = ep.turn_spans[t - 1][1] if t else 0
                x[start:end] = adv[t]
            out.append(x)
        return out

    answerable(right_broadcast, lambda e: right_broadcast(e, by_group=False),  # one batch group
               credit.grpo_broadcast, notebook("turn_inputs"))
    answerable(right_tokens, lambda e, a: right_tokens(e, a, with_observations=True),
               credit.to_token_advantages, notebook("token_inputs"))
