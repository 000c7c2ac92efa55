"""26_cm2: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


CRITERIA = ("valid", "right_tool", "right_arg_names", "right_values", "confirmation")


def test_nb26_checklist_and_quality(notebook, answerable):
    from agentrl_lib.rewards.judges import checklist_reward, episode_quality

    def right_checklist(checks, none_is_false=False):
        out = []
        for turn in checks:
            v = [bool(x) for x in turn.values() if x is not None or none_is_false]
            out.append(sum(v) / len(v) if v else 0.0)
        return np.array(out)

    def right_quality(checks):
        met = n = 0
        for turn in checks:
            for x in turn.values():
                if x is not None:
                    met, n = met + bool(x), n + 1
        return met / n if n else 0.0

    def wrong_quality(checks):  # the mean of the turns' rewards: every turn weighs the same
        return float(np.mean(right_checklist(checks)))

    answerable(right_checklist, lambda c: right_checklist(c, none_is_false=True),
               lambda c: checklist_reward(c)[0], notebook("checks_inputs"))
    answerable(right_quality, wrong_quality, episode_quality, notebook("checks_inputs"))
