"""The multi-turn policy-gradient loop for table policies."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import agent_pg, credit
from agentrl_lib.algorithms.agent_pg import AgentPGConfig
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.policies import KeyTablePolicy
from agentrl_lib.rollout import play_episodes

LAYOUT = ["....", ".#..", "...."]


def make_env():
    return GridAgentEnv(LAYOUT, tasks=[((0, 0), (2, 3)), ((2, 0), (0, 3))], max_turns=10)


def test_episode_logps_match_the_table():
    pol = KeyTablePolicy(4, seed=0)
    with torch.no_grad():
        pol.logits.normal_()
    eps = play_episodes(make_env, pol.act, [0, 1], group_size=3)
    logps = pol.episode_logps(eps)
    assert logps.shape == (sum(len(e) for e in eps),)
    ep = eps[0]
    row = pol.rows[ep.state_keys[0]]
    want = torch.log_softmax(pol.logits[row], -1)[ep.action_ids[0]]
    assert logps[0].item() == pytest.approx(want.item())
    obs_pol = KeyTablePolicy(4, key="observation")
    assert len(obs_pol.episode_logps(eps)) == len(logps)
    with pytest.raises(ValueError, match="key"):
        KeyTablePolicy(4, key="history")


def test_estimate_dispatch_and_bad_name():
    eps = play_episodes(make_env, KeyTablePolicy(4).act, [0], group_size=4)
    cfg = AgentPGConfig(estimator="gigpo", gamma=0.9)
    for a, b in zip(agent_pg.estimate(eps, cfg), credit.gigpo_advantages(eps, gamma=0.9)):
        assert np.allclose(a, b)
    rf = agent_pg.estimate(eps, AgentPGConfig(estimator="reinforce"))
    assert all(np.allclose(a, e.ret) for a, e in zip(rf, eps))
    with pytest.raises(ValueError, match="estimator"):
        AgentPGConfig(estimator="ppo")


def test_fit_critic_moves_toward_returns():
    eps = play_episodes(make_env, KeyTablePolicy(4).act, [0], group_size=2)
    critic = agent_pg.fit_critic({}, eps[:1], gamma=0.5, step=1.0)
    g = credit.episode_returns_to_go(eps[:1], 0.5)[0]
    last = {}
    for k, v in zip(eps[0].state_keys, g):
        last[k] = v  # with step 1 the last visit wins
    assert critic == pytest.approx(last)


@pytest.mark.parametrize("estimator", ["grpo", "gigpo", "turn_gae"])
def test_training_raises_success(estimator):
    pol = KeyTablePolicy(4, seed=1)
    cfg = AgentPGConfig(num_iters=30, num_prompts=2, group_size=8, lr=0.3, estimator=estimator,
                        seed=1)
    before = agent_pg.evaluate(make_env, pol, [0, 1, 2, 3], greedy=False)
    hist = agent_pg.train(make_env, pol, cfg, train_seeds=[0, 1])
    after = np.mean([h["rollout/success"] for h in hist[-5:]])
    assert after > before["success"] + 0.3, (estimator, before, after)
    assert hist[-1]["episodes"] == 30 * 16
