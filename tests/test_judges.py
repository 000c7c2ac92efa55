"""NoisyJudge (noise rates measured against their parameters) and the checklist rewards."""

import math

import numpy as np
import pytest

from agentrl_lib.rewards.judges import (NoisyJudge, checklist_reward, episode_quality,
                                        holistic_reward, judged_checks)


def test_noiseless_judge_is_exact():
    j, rng = NoisyJudge(), np.random.default_rng(0)
    q = np.array([0.0, 0.3, 1.0])
    assert np.array_equal(j.score(q, rng), q)
    assert np.array_equal(j.verdict([True, False], rng), [True, False])
    assert np.array_equal(j.preference_prob([1.0, 0.2, 0.5], [0.5, 0.4, 0.5]), [1.0, 0.0, 0.5])


def test_flip_rate_measured():
    rng = np.random.default_rng(1)
    for p in (0.1, 0.3):
        truth = rng.random(200_000) < 0.5
        v = NoisyJudge(flip=p).verdict(truth, rng)
        rate = float((v != truth).mean())
        assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / truth.size)


def test_score_compression_and_sigma_measured():
    rng = np.random.default_rng(2)
    j = NoisyJudge(compression=0.6, sigma=0.05)
    s = j.score(np.full(200_000, 0.25), rng)
    assert abs(s.mean() - (0.6 * 0.25 + 0.2)) < 1e-3  # c q + (1 - c)/2 = 0.35
    assert abs(s.std() - 0.05) < 1e-3
    assert j.score(np.array([2.0]), rng)[0] <= 1.0  # clipped


def test_at_noise_matches_a_flipped_verdict_in_mean_and_variance():
    p = 0.2
    j = NoisyJudge.at_noise(p)
    assert math.isclose(j.compression, 0.6) and math.isclose(j.sigma, 0.4) and j.flip == p
    rng = np.random.default_rng(3)
    truth = np.ones(200_000, dtype=bool)
    v = j.verdict(truth, rng).astype(float)
    # unclipped score of q = 1: mean (1 - 2p) + p = 1 - p, variance p (1 - p), as the verdict
    s = j.compression * 1.0 + (1 - j.compression) / 2 + j.sigma * rng.standard_normal(200_000)
    assert abs(v.mean() - s.mean()) < 0.01 and abs(v.var() - s.var()) < 0.01
    with pytest.raises(ValueError, match="noise level"):
        NoisyJudge.at_noise(0.7)
    with pytest.raises(ValueError, match="flip"):
        NoisyJudge(flip=1.5)


def test_bradley_terry_rate_measured():
    j, rng = NoisyJudge(temperature=0.25), np.random.default_rng(4)
    p = j.preference_prob(0.7, 0.45)
    assert math.isclose(float(p), 1 / (1 + math.exp(-1.0)))
    wins = j.compare(np.full(100_000, 0.7), np.full(100_000, 0.45), rng)
    assert abs(wins.mean() - p) < 4 * math.sqrt(p * (1 - p) / 100_000)


def test_checklist_reward_by_hand_and_noisy():
    checks = [{"valid": True, "right_tool": True, "right_arg_names": False, "confirmation": None},
              {"valid": True, "right_tool": True, "right_arg_names": True, "right_values": True},
              {}]
    r, m = checklist_reward(checks)
    assert np.allclose(r, [2 / 3, 1.0, 0.0]) and m["checklist/num_criteria"] == 7
    assert math.isclose(episode_quality(checks), 6 / 7)
    rng = np.random.default_rng(5)
    flips = [checklist_reward(checks, NoisyJudge(flip=0.25), rng)[1]["checklist/flipped"]
             for _ in range(4000)]
    assert abs(np.mean(flips) - 0.25) < 0.01
    with pytest.raises(ValueError, match="rng"):
        checklist_reward(checks, NoisyJudge(flip=0.1))


def test_holistic_reward():
    checks = [{"a": True, "b": False}]
    s, m = holistic_reward(checks, NoisyJudge(), np.random.default_rng(0))
    assert s == 0.5 and m["holistic/true_quality"] == 0.5
    s, _ = holistic_reward(checks, NoisyJudge(), np.random.default_rng(0), success=True,
                           success_weight=0.5)
    assert s == 0.75


def test_judged_checks_make_checklist_rewards_draws():
    checks = [{"valid": True, "right_tool": False, "right_values": False, "confirmation": None},
              {"valid": True, "right_tool": True, "right_values": True}, {"valid": None}]
    judge = NoisyJudge(flip=0.3)
    r_direct, _ = checklist_reward(checks, judge, np.random.default_rng(11))
    rng = np.random.default_rng(11)
    judged = [judged_checks(c, judge, rng) for c in checks]
    assert np.array_equal(checklist_reward(judged)[0], r_direct)  # the same draws, in order
    assert judged[0]["confirmation"] is None and judged[2] == {"valid": None}
    assert judged_checks(checks[0], NoisyJudge(), None) == checks[0]  # noiseless: unchanged
