"""41_agentgym_rl: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb41_cap_and_grpo(notebook, answerable):
    from agentrl_lib.algorithms.agent_pg import AgentPGConfig

    def cap(schedule, k, strict=False):
        out = None
        for start, h in schedule:  # ascending: the last stage started by k wins
            if start < k or (start == k and not strict):
                out = h
        return out if out is not None else schedule[0][1]

    def grpo(rets, group_ids, lengths, ddof=1):
        out = []
        for j in range(len(rets)):
            mates = [rets[k] for k in range(len(rets)) if group_ids[k] == group_ids[j]]
            if len(mates) < 2 or min(mates) == max(mates):
                a = 0.0
            else:
                a = (rets[j] - np.mean(mates)) / (np.std(mates, ddof=ddof) + 1e-4)
            out.append(np.full(int(lengths[j]), a))
        return out

    answerable(cap, lambda s, k: cap(s, k, strict=True),  # a stage starts one iteration late
               lambda s, k: AgentPGConfig(horizon_schedule=s).max_turns_at(k),
               notebook("cap_inputs"))
    answerable(grpo, lambda *a: grpo(*a, ddof=0),  # the population std
               notebook("grpo_reference"), notebook("grpo_inputs"))
