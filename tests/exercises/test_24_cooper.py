"""24_cooper: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb24_bt_loss(notebook, answerable):
    from agentrl_lib.rewards import reward_model as rmod

    def right(r_c, r_r):
        d = np.asarray(r_c) - np.asarray(r_r)
        # -log sigma(d) = log(1 + e^-d)
        return np.mean(np.logaddexp(0.0, -d)), float(np.mean(d > 0))

    def wrong(r_c, r_r):  # pointwise cross-entropy: chosen labelled 1, rejected 0, not a pair loss
        c, r = np.asarray(r_c), np.asarray(r_r)
        return np.mean(np.logaddexp(0.0, -c)) + np.mean(np.logaddexp(0.0, r)), float(np.mean(c > r))

    answerable(right, wrong,
               lambda c, r: (rmod.bt_loss(c, r)[0], rmod.bt_loss(c, r)[1]["accuracy"]),
               notebook("bt_inputs"))
