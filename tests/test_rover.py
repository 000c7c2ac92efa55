"""ROVER on the TokenTreeMDP: hand-computed Q^unif, the greedy theorem, Monte Carlo, the softmax
limits, the practical loss and the tree trainers (agentrl_lib/algorithms/rover.py)."""

import math

import numpy as np
import pytest
import torch

from agentrl_lib import core
from agentrl_lib.algorithms import rover
from agentrl_lib.envs.token_tree import TokenTreeMDP
from agentrl_lib.models.policies import TabularTreePolicy


@pytest.fixture
def tiny():
    """V=2, H=3, correct leaves 001, 011, 110 (the notebook's hand example)."""
    return TokenTreeMDP(vocab_size=2, depth=3, correct=[(0, 0, 1), (0, 1, 1), (1, 1, 0)])


def test_uniform_q_by_hand(tiny):
    q = tiny.uniform_q()
    assert q[0].tolist() == [[0.5, 0.25]]  # 2 of 4 leaves below 0, 1 of 4 below 1
    assert q[1].tolist() == [[0.5, 0.5], [0.0, 0.5]]
    assert q[2].tolist() == [[0.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]
    # V^u(root) is the fraction of correct leaves
    assert tiny.expected_reward(tiny.uniform_policy()).item() == pytest.approx(3 / 8)


def test_greedy_on_uniform_q_is_optimal_on_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(100):
        V, H = int(rng.integers(2, 6)), int(rng.integers(1, 6))
        c = int(rng.integers(1, min(V**H, 10) + 1))
        tree = TokenTreeMDP(V, H, num_correct=c, seed=int(rng.integers(1 << 30)))
        assert tree.expected_reward(rover.greedy_policy(tree.uniform_q())).item() == pytest.approx(
            1.0, abs=1e-12)


def test_greedy_splits_ties_evenly(tiny):
    p = tiny.leaf_distribution(rover.greedy_policy(tiny.uniform_q()))
    assert p[tiny.correct_ids].tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_greedy_fails_with_graded_reward():
    tree = TokenTreeMDP(2, 2, correct=[0])
    tree.reward = torch.tensor([1.0, 1.0, 1.5, 0.0], dtype=torch.float64)
    assert tree.expected_reward(rover.greedy_policy(tree.uniform_q())).item() == 1.0  # not 1.5


def test_softmax_by_hand_and_limits(tiny):
    p = rover.softmax_policy([torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)], tau=0.5)[0]
    e2 = math.exp(2.0)
    assert p[0].tolist() == pytest.approx([e2 / (e2 + 2), 1 / (e2 + 2), 1 / (e2 + 2)])
    q = tiny.uniform_q()
    for a, b in zip(rover.softmax_policy(q, 1e-4), rover.greedy_policy(q)):
        assert torch.allclose(a, b, atol=1e-12)
    for a in rover.softmax_policy(q, 1e6):
        assert torch.allclose(a, torch.full_like(a, 0.5), atol=1e-6)
    # pass@1 falls monotonically as tau grows, from 1 (greedy) to 3/8 (uniform)
    js = [tiny.expected_reward(rover.softmax_policy(q, t)).item() for t in [0, 0.01, 0.1, 1, 1e4]]
    assert js[0] == pytest.approx(1.0) and js[-1] == pytest.approx(3 / 8, abs=1e-3)
    assert all(a >= b for a, b in zip(js, js[1:]))
    with pytest.raises(ValueError):
        rover.softmax_policy(q, -1.0)


def test_q_proportional_is_uniform_over_correct_leaves():
    tree = TokenTreeMDP(3, 4, num_correct=7, seed=3)
    p = tree.leaf_distribution(rover.q_proportional_policy(tree.uniform_q()))
    assert torch.allclose(p[tree.correct_ids], torch.full((7,), 1 / 7, dtype=torch.float64))
    assert p.sum().item() == pytest.approx(1.0)


def test_mc_q_is_exact_when_every_leaf_is_seen_once():
    tree = TokenTreeMDP(3, 3, num_correct=5, seed=1)
    leaves = torch.arange(tree.num_leaves)
    q_hat, counts = rover.mc_uniform_q(leaves, tree.reward[leaves], 3, 3)
    for a, b, n, d in zip(q_hat, tree.uniform_q(), counts, range(3)):
        assert torch.allclose(a, b)
        assert (n == 3 ** (3 - d - 1)).all()  # leaves below each child


def test_mc_q_unvisited_fill_and_convergence():
    tree = TokenTreeMDP(2, 3, correct=[(0, 0, 1), (0, 1, 1), (1, 1, 0)])
    q_hat, counts = rover.mc_uniform_q(torch.tensor([1]), torch.tensor([1.0]), 2, 3, fill=-1.0)
    assert q_hat[0].tolist() == [[1.0, -1.0]] and counts[0].tolist() == [[1.0, 0.0]]
    g = torch.Generator().manual_seed(0)
    leaves, r = rover.uniform_rollouts(tree, 200_000, g)
    errs = []
    for n in [100, 200_000]:
        q_hat, counts = rover.mc_uniform_q(leaves[:n], r[:n], 2, 3)
        errs.append(max((a - b).abs().max().item() for a, b in zip(q_hat, tree.uniform_q())))
    q0 = tree.uniform_q()[0]
    se = (q0 * (1 - q0) / counts[0]).sqrt()
    assert ((q_hat[0] - q0).abs() < 5 * se).all()
    assert errs[1] < errs[0] and errs[1] < 0.01


def test_implied_pass_at_1_and_temperature_rule():
    tree = TokenTreeMDP(4, 4, num_correct=8, seed=0)
    q = tree.uniform_q()
    taus = [float(t) for t in np.logspace(-4, 0, 17)]
    for tau in [0.0, 0.01, 0.3]:
        probs = rover.softmax_policy(q, tau)
        assert rover.implied_pass_at_1(q, probs).item() == pytest.approx(
            tree.expected_reward(probs).item(), abs=1e-12)
    tau = rover.temperature_for_pass1(q, 0.95, taus)
    assert tree.expected_reward(rover.softmax_policy(q, tau)).item() >= 0.95
    bigger = [t for t in taus if t > tau]
    assert tree.expected_reward(rover.softmax_policy(q, bigger[0])).item() < 0.95
    # a Q table with no success anywhere: the rule falls back to the smallest tau
    zeros = [torch.zeros_like(x) for x in q]
    assert rover.temperature_for_pass1(zeros, 0.95, taus) == min(taus)


def test_evaluate_uniform_by_hand(tiny):
    m = rover.evaluate(tiny, tiny.uniform_policy(), ks=(1, 4), num_samples=10,
                              generator=torch.Generator().manual_seed(0))
    assert m["pass@1"] == pytest.approx(3 / 8)
    assert m["pass@4"] == pytest.approx(1 - (5 / 8) ** 4)
    assert m["distinct_expected"] == pytest.approx(3 * (1 - (7 / 8) ** 10))
    assert m["entropy_correct"] == pytest.approx(math.log(3))
    assert 0 <= m["distinct_sampled"] <= 3


def test_rover_loss_by_hand():
    logps = torch.tensor([[-0.5, -1.0]], dtype=torch.float64)
    old = torch.tensor([[-0.7, -0.9]], dtype=torch.float64)
    mean_lp = torch.tensor([[-0.8, -1.2]], dtype=torch.float64)
    old_mean = torch.tensor([[-0.8, -1.0]], dtype=torch.float64)
    # Q = 2 * (0.2, -0.1) = (0.4, -0.2); next term at t=0: 2 * (-1.2 + 1.0) = -0.4, none at t=1
    # target = (0.5 - 0.4, 0.5); loss = ((0.4 - 0.1)^2 + (-0.2 - 0.5)^2) / 2 = 0.29
    r_c = torch.tensor([0.5], dtype=torch.float64)
    loss, m = rover.rover_loss(logps, old, mean_lp, old_mean, r_c, rho=2.0)
    assert loss.item() == pytest.approx(0.29)
    assert m["next_q_mean"] == pytest.approx(-0.2)


def test_rover_first_step_is_mean_baseline_policy_gradient():
    tree = TokenTreeMDP(3, 3, num_correct=6, seed=2)
    pol = TabularTreePolicy(tree)
    with torch.no_grad():
        for lg in pol.logits:
            lg.normal_(generator=torch.Generator().manual_seed(0))
    tokens, nodes, _, r = tree.sample(pol.probs(), 32, generator=torch.Generator().manual_seed(1))
    r = r.clone()
    r[:8] = 1.0
    with torch.no_grad():
        old, old_mean = pol.log_prob(nodes, tokens), rover.mean_logps(pol, nodes)
    r_c = core.grpo_advantages(r[None], norm_adv=False)[0]
    rho = 0.7
    loss, _ = rover.rover_loss(pol.log_prob(nodes, tokens), old, rover.mean_logps(pol, nodes),
                               old_mean, r_c, rho=rho)
    g_rover = torch.autograd.grad(loss, list(pol.logits))
    loss_pg = -(r_c[:, None] * pol.log_prob(nodes, tokens)).mean()
    g_pg = torch.autograd.grad(loss_pg, list(pol.logits))
    for a, b in zip(g_rover, g_pg):
        assert torch.allclose(a, 2 * rho * b, atol=1e-12)


def test_mean_logps_of_uniform_policy():
    tree = TokenTreeMDP(4, 3, num_correct=2, seed=0)
    pol = TabularTreePolicy(tree)
    _, nodes, _, _ = tree.sample(pol.probs(), 5, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(rover.mean_logps(pol, nodes), torch.full((5, 3), math.log(1 / 4),
                                                                  dtype=torch.float64))


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "reinforce", "rover"])
def test_train_tree_moves_parameters_and_learns(estimator):
    tree = TokenTreeMDP(2, 3, num_correct=2, seed=0)
    cfg = rover.TreeRLConfig(estimator=estimator, num_iters=30, group_size=8, lr=0.1, eval_every=10)
    pol, hist = rover.train_tree(tree, cfg, generator=torch.Generator().manual_seed(0))
    assert any(lg.abs().max() > 0 for lg in pol.logits)
    assert [h["iter"] for h in hist] == [0, 10, 20, 30]
    assert hist[0]["eval/pass@1"] == pytest.approx(0.25)
    assert hist[-1]["eval/pass@1"] > 0.5


@pytest.mark.parametrize("estimator", ["grpo", "rover"])
def test_all_equal_rewards_leave_the_policy_unchanged(estimator):
    tree = TokenTreeMDP(2, 2, correct=[0, 1, 2, 3])  # every leaf correct: every group is all-1
    cfg = rover.TreeRLConfig(estimator=estimator, num_iters=3, group_size=4)
    pol, _ = rover.train_tree(tree, cfg, generator=torch.Generator().manual_seed(0))
    assert all((lg == 0).all() for lg in pol.logits)


def test_unknown_estimator():
    with pytest.raises(ValueError):
        rover.train_tree(TokenTreeMDP(2, 2, num_correct=1), rover.TreeRLConfig(estimator="ppo"))
