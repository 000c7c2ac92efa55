"""The DQN value learner of Stop Regressing: TD targets, the three losses and the n-step sums by
hand, the reward-noise wrapper's moments, exact grid scoring of Q*, and a short seeded run."""

import math

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import dqn
from agentrl_lib.envs import GridAgentEnv
from agentrl_lib.envs.reward_noise import RewardNoise


def test_td_target_by_hand():
    y = dqn.td_target(torch.tensor([1.0, 0.5]), torch.tensor([0.9, 0.0]),
                      torch.tensor([[0.2, 0.7], [5.0, 3.0]]))
    assert torch.allclose(y, torch.tensor([1.0 + 0.9 * 0.7, 0.5]))


def test_td_loss_mse_and_two_hot_by_hand():
    head = torch.tensor([[[0.3], [2.0]], [[-1.0], [0.5]]])  # (B=2, A=2, 1)
    loss, m = dqn.td_loss(head, torch.tensor([1, 0]), torch.tensor([1.0, 0.0]), "mse")
    assert loss.item() == pytest.approx(((2.0 - 1.0) ** 2 + (-1.0 - 0.0) ** 2) / 2)
    assert m["q_mean"] == pytest.approx(0.5)
    z = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    logits = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]])  # (1, 2, 3)
    loss, m = dqn.td_loss(logits, torch.tensor([1]), torch.tensor([1.25]), "two_hot", z)
    lsm = [1 - math.log(math.exp(1) + math.exp(2) + math.exp(3)) + k for k in range(3)]
    assert loss.item() == pytest.approx(-(0.75 * lsm[1] + 0.25 * lsm[2]), rel=1e-6)
    p = np.exp(lsm)
    assert m["q_mean"] == pytest.approx(p[1] + 2 * p[2], rel=1e-6)


def test_head_q_values_is_the_expectation():
    z = torch.tensor([-1.0, 0.0, 1.0])
    head = torch.log(torch.tensor([[[0.2, 0.3, 0.5]]]))  # (1, 1, 3)
    assert dqn.head_q_values(head, "hl_gauss", z).item() == pytest.approx(0.3)


def test_n_step_transitions_by_hand():
    pend = [("x0", 0, 1.0), ("x1", 1, 2.0), ("x2", 2, 3.0)]
    out = dqn.n_step_transitions(list(pend), 0.5, None, terminated=False, flush=True)
    assert [(x, r, d) for x, _, r, d in out] == [("x0", 2.75, 0.125), ("x1", 3.5, 0.25),
                                                ("x2", 3.0, 0.5)]
    out = dqn.n_step_transitions(list(pend), 0.5, None, terminated=True, flush=True)
    assert [d for *_, d in out] == [0.0, 0.0, 0.0]
    p = list(pend)
    out = dqn.n_step_transitions(p, 0.5, None, terminated=False, flush=False)
    assert len(out) == 1 and out[0][2] == 2.75 and len(p) == 2


def test_reward_noise_moments_and_zero_std():
    clean = GridAgentEnv("5x5", tasks=[((0, 0), (4, 4))])
    env = RewardNoise(GridAgentEnv("5x5", tasks=[((0, 0), (4, 4))]), std=0.5, noise_seed=3)
    env.reset(seed=0)
    rs = []
    for t in range(4000):
        _, r, done, _ = env.step("left")  # never reaches the goal: the clean reward is 0
        rs.append(r)
        if done:
            env.reset(seed=t + 1)
    assert abs(np.mean(rs)) < 4 * 0.5 / math.sqrt(len(rs))
    assert np.std(rs) == pytest.approx(0.5, rel=0.05)
    quiet = RewardNoise(clean, std=0.0)
    quiet.reset(seed=0)
    assert quiet.step("right")[1] == 0.0 and quiet.tasks == clean.tasks


class _Oracle:
    """A 'network' whose Q is the exact Q* (in the env's text action order)."""

    def __init__(self, env, goal):
        self.q = env.tabular_form((0, 0), goal).optimal_q().float()  # (S, A) tabular order
        self.order = [["left", "down", "right", "up"].index(a) for a in env.actions]
        self.n = env.rows * env.cols

    def q_values(self, x):
        cells = x[:, : self.n].argmax(-1)
        return self.q[cells][:, self.order]


def test_evaluate_grid_is_exact_at_q_star():
    env = GridAgentEnv("5x5", tasks=[((0, 0), (4, 4)), ((2, 0), (4, 4))], slip=0.1, gamma=0.9)
    out = dqn.evaluate_grid(_Oracle(env, (4, 4)), env)
    assert out["q_rmse"] < 1e-6 and out["norm_return"] == pytest.approx(1.0)
    assert out["optimal"] == 1.0
    bad = _Oracle(env, (4, 4))
    bad.q = -bad.q  # the worst greedy choices
    assert dqn.evaluate_grid(bad, env)["norm_return"] < 0.5


def test_qnet_heads_and_unknown_estimator():
    for est, k in [("mse", 1), ("two_hot", 11), ("hl_gauss", 11)]:
        net = dqn.QNet(6, 4, dqn.DQNConfig(estimator=est, num_bins=11, hidden=8))
        assert net(torch.zeros(3, 6)).shape == (3, 4, k) and net.q_values(torch.zeros(3, 6)).shape == (3, 4)
    with pytest.raises(ValueError):
        dqn.QNet(6, 4, dqn.DQNConfig(estimator="huber"))


def test_short_run_is_seeded_and_updates():
    def run():
        env = GridAgentEnv("5x5", tasks=[((0, 0), (4, 4))], max_turns=12)
        cfg = dqn.DQNConfig(estimator="hl_gauss", hidden=16, num_iters=150, learning_starts=50,
                            batch_size=16, target_every=20)
        return dqn.train(env, cfg, dqn.grid_features, evaluate=lambda q: dqn.evaluate_grid(q, env))
    (q1, rows1), (q2, rows2) = run(), run()
    assert rows1[-1] == rows2[-1] and "eval/norm_return" in rows1[-1]
    assert "losses/loss" in rows1[-1]
    torch.manual_seed(0)  # the initial network of both runs (train seeds torch with cfg.seed)
    fresh = dqn.QNet(50, 4, dqn.DQNConfig(estimator="hl_gauss", hidden=16))
    assert any(not torch.equal(a, b) for a, b in zip(fresh.parameters(), q1.parameters()))
