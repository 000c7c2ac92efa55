"""SearchGym-RL's hop curriculum: schedules by hand, the seed sampler's distribution, the
agent_pg hook, collapse counting."""

import numpy as np
import pytest

from agentrl_lib.algorithms import agent_pg, curriculum
from agentrl_lib.algorithms.agent_pg import AgentPGConfig
from agentrl_lib.envs.kg_search import KGSearchEnv
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.policies import KeyTablePolicy


def test_staged_schedule_by_hand():
    # K = 4 hop counts, 10 iterations, ramp 0.8: 8 ramp iterations, 2 per stage, then uniform
    w = [curriculum.hop_weights(it, 10, 4, "staged", 0.8) for it in range(10)]
    expected = [[1, 0, 0, 0]] * 2 + [[.5, .5, 0, 0]] * 2 + [[1 / 3, 1 / 3, 1 / 3, 0]] * 2 \
        + [[.25] * 4] * 4
    assert np.allclose(np.array(w), np.array(expected))


def test_linear_and_uniform_by_hand():
    # ramp of 5 iterations over K = 2: f = it / 5, w = (1 - f) (1, 0) + f (1/2, 1/2)
    got = np.array([curriculum.hop_weights(it, 10, 2, "linear", 0.5) for it in range(7)])
    f = np.minimum(np.arange(7) / 5, 1.0)
    assert np.allclose(got[:, 0], 1 - f / 2) and np.allclose(got[:, 1], f / 2)
    assert np.allclose(curriculum.hop_weights(0, 10, 3, "uniform"), [1 / 3] * 3)
    for sched in curriculum.SCHEDULES:  # every schedule is a distribution and ends uniform
        for it in range(20):
            w = curriculum.hop_weights(it, 20, 4, sched, 0.6)
            assert w.min() >= 0 and np.isclose(w.sum(), 1.0)
        assert np.allclose(curriculum.hop_weights(19, 20, 4, sched, 0.6), 0.25)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="schedule"):
        curriculum.hop_weights(0, 10, 2, "cosine")
    with pytest.raises(ValueError, match="ramp_frac"):
        curriculum.hop_weights(0, 10, 2, "staged", 0.0)
    pools = {1: np.array([3, 5])}
    with pytest.raises(ValueError, match="no training seed has \\[2\\] hops"):
        curriculum.sample_task_seeds(np.random.default_rng(0), pools, [1, 2], [0.5, 0.5], 4)
    with pytest.raises(ValueError, match="probability"):
        curriculum.sample_task_seeds(np.random.default_rng(0), pools, [1], [0.5], 4)


def test_pools_and_sampler_follow_the_weights():
    env = KGSearchEnv(num_entities=40, hops=(1, 2, 3, 4))
    pools = curriculum.hop_pools(lambda s: env.question(s)["hops"], range(400))
    assert sorted(pools) == [1, 2, 3, 4] and sum(len(p) for p in pools.values()) == 400
    for k, p in pools.items():  # every pooled seed really has k hops
        assert all(env.question(int(s))["hops"] == k for s in p[:20])
    inv = {int(s): k for k, p in pools.items() for s in p}
    rng = np.random.default_rng(0)
    w = np.array([0.1, 0.2, 0.3, 0.4])
    seeds = curriculum.sample_task_seeds(rng, pools, [1, 2, 3, 4], w, 20_000)
    freq = np.bincount([inv[int(s)] for s in seeds], minlength=5)[1:] / 20_000
    assert np.abs(freq - w).max() < 0.015  # 3 binomial std at n = 20000 is < 0.011
    # a one-hot weight draws from its pool only, each seed about equally often
    one = curriculum.sample_task_seeds(rng, pools, [1, 2, 3, 4], [0, 0, 1, 0], 3000)
    assert set(one.tolist()) <= set(pools[3].tolist())
    counts = np.bincount(np.searchsorted(pools[3], one), minlength=len(pools[3]))
    assert counts.min() > 0


def test_seed_fn_logs_and_drives_agent_pg():
    # the GridAgentEnv's two tasks stand in for two "hop counts": seed 0 -> easy, 1 -> hard
    pools = {1: np.array([0]), 2: np.array([1])}
    log = []
    fn = curriculum.curriculum_seed_fn(pools, [1, 2], num_iters=4, schedule="staged",
                                       ramp_frac=1.0, log=log)

    def make_env():
        return GridAgentEnv(["....", ".#..", "...."], tasks=[((0, 0), (2, 3)), ((2, 0), (0, 3))],
                            max_turns=6)

    cfg = AgentPGConfig(num_iters=4, num_prompts=3, group_size=2, lr=0.1, seed=0)
    hist = agent_pg.train(make_env, KeyTablePolicy(4, seed=0), cfg, train_seeds=fn)
    assert len(hist) == 4 and [it for it, _, _ in log] == [0, 1, 2, 3]
    # stages of 2 iterations: only the easy pool first, then both
    assert log[0][2] == [1, 1, 1] and log[1][2] == [1, 1, 1]
    assert np.allclose(log[2][1], [0.5, 0.5]) and np.allclose(log[3][1], [0.5, 0.5])
    # a plain list still works
    hist2 = agent_pg.train(make_env, KeyTablePolicy(4, seed=0), cfg, train_seeds=[0, 1])
    assert len(hist2) == 4


def test_collapse_events_by_hand():
    # running peak 0.1, 0.6, 0.6, 0.7, 0.7, 0.7: below peak - 0.2 at 0.3 and 0.45
    assert curriculum.collapse_events([0.1, 0.6, 0.3, 0.7, 0.65, 0.45], drop=0.2) == 2
    assert curriculum.collapse_events([0.2, 0.3, 0.4]) == 0
    assert curriculum.collapse_events([]) == 0


def test_lm_sampler_plays_the_scheduled_seeds():
    from agentrl_lib.algorithms.grpo import GRPOConfig
    from agentrl_lib.models.tiny_lm import new_model

    model, tok = new_model("tiny-64", seed=0)
    plan = {0: [5, 6], 1: [7, 8]}  # round -> the seeds the schedule asks for

    def seed_fn(it, rng, n):
        assert n == 2
        return np.array(plan[it])

    cfg = GRPOConfig(num_prompts=2, group_size=2, max_turns=1, max_new_tokens=3, seed=0)
    sample = curriculum.lm_episode_sampler(
        tok, lambda: KGSearchEnv(num_entities=10, hops=(1, 2), max_turns=1), seed_fn, cfg)
    for it in range(2):
        batch = sample(model, it)
        played = sorted({ep.task["seed"] for ep in batch.episodes})
        assert played == plan[it] and len(batch.episodes) == 4
        assert np.isfinite(batch.metrics["rollout/hops"])
