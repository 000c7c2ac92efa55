"""43_textworld: its checked exercise, answered right and wrong (see conftest.py)."""


def test_nb43_anchor_share(notebook, answerable):
    from agentrl_lib.algorithms import credit

    def right(episodes, within_group=True):
        groups = {}
        for ep in episodes:
            for s in ep.state_keys[:len(ep)]:
                key = (ep.group_id, s) if within_group else s
                groups[key] = groups.get(key, 0) + 1
        turns = sum(len(ep) for ep in episodes)
        return sum(n for n in groups.values() if n >= 2) / turns if turns else 0.0

    answerable(right, lambda eps: right(eps, within_group=False),  # pools across groups
               credit.anchor_share, notebook("anchor_inputs"))
