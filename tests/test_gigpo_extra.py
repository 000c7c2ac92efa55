"""GiGPO details not covered by test_credit.py: std mode numbers, custom anchor keys, omega = 0."""

import numpy as np

from agentrl_lib.algorithms import credit
from agentrl_lib.rollout import Episode


def ep(keys, rewards, gid=0, obs=None):
    return Episode.of(keys, rewards, gid, **({"observations": list(obs)} if obs else {}))


def test_step_advantage_std_mode_by_hand():
    # anchor "s": returns-to-go 0.5 and 0 (gamma 0.5): centred +-0.25, std(ddof=1) = 0.5/sqrt(2)
    e0, e1 = ep(["s", "x"], [0.0, 1.0]), ep(["s", "y"], [0.0, 0.0])
    a_s = credit.step_advantages([e0, e1], gamma=0.5, norm_adv=True, eps=0.0)
    assert np.allclose(a_s[0], [1 / np.sqrt(2), 0.0]) and np.allclose(a_s[1], [-1 / np.sqrt(2), 0.0])
    # equal returns in an anchor group: zero, not nan (eps keeps the division finite)
    flat = credit.step_advantages([ep(["s"], [0.0]), ep(["s"], [0.0])], norm_adv=True)
    assert np.allclose(np.concatenate(flat), 0.0)


def test_observation_key_splits_what_the_state_key_joins():
    # same state, different observation text (e.g. a turn counter): one group by state, two by text
    e0 = ep(["s", "g"], [0.0, 1.0], obs=["turn 1 at s", "turn 2 at g"])
    e1 = ep(["t", "s"], [0.0, 0.0], obs=["turn 1 at t", "turn 2 at s"])
    by_state = credit.anchor_groups([e0, e1])
    by_text = credit.anchor_groups([e0, e1], key=lambda e, t: e.observations[t])
    assert by_state[(0, "s")] == [(0, 0), (1, 1)]
    assert all(len(m) == 1 for m in by_text.values())
    a_text = credit.step_advantages([e0, e1], key=lambda e, t: e.observations[t])
    assert np.allclose(np.concatenate(a_text), 0.0)  # all singletons


def test_omega_zero_is_grpo_and_step_term_is_additive():
    eps = [ep(["s", "x", "s"], [0, 0, 1]), ep(["s", "s", "y"], [0, 0, 0]), ep(["s"], [1], gid=1),
           ep(["s", "z"], [0, 0], gid=1)]
    for scale in (False, True):
        g0 = credit.gigpo_advantages(eps, omega=0.0, norm_adv=scale)
        for a, b in zip(g0, credit.grpo_broadcast(eps, norm_adv=scale)):
            assert np.allclose(a, b)
        g2 = credit.gigpo_advantages(eps, gamma=0.9, omega=2.0, norm_adv=scale)
        s = credit.step_advantages(eps, gamma=0.9, norm_adv=scale)
        for a, b, c in zip(g2, g0, s):
            assert np.allclose(a, b + 2.0 * c)
