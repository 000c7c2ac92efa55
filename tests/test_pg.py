"""Tests of agentrl_lib.algorithms.pg: hand-computed advantages, the surrogate's gradient against
autograd and the closed form, exact expectations by enumerating every batch of a tiny case, and a
training step that changes the parameters."""

import itertools
import math

import pytest
import torch

from agentrl_lib.algorithms.pg import (
    ESTIMATORS,
    PGConfig,
    exact_gradient,
    expected_gradient_scale,
    expected_rewards,
    flatten_tables,
    pg_surrogate_loss,
    sample_responses,
    sampled_gradients,
    stack_rewards,
    tabular_score_gradient,
    train_pg,
)
from agentrl_lib.core import group_advantages
from agentrl_lib.envs.token_tree import TokenTreeMDP
from agentrl_lib.models.policies import PromptSetPolicy, TabularTreePolicy

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


# --- advantages ---------------------------------------------------------------------------------
def test_advantages_hand_computed():
    r = t([[1.0, 0.0, 0.0, 0.0]])
    assert torch.equal(group_advantages(r, "reinforce"), r)
    assert torch.allclose(group_advantages(r, "rloo"), t([[1.0, -1 / 3, -1 / 3, -1 / 3]]))
    assert torch.allclose(group_advantages(r, "dr_grpo"), t([[0.75, -0.25, -0.25, -0.25]]))
    # ddof=1: var = (0.75^2 + 3 * 0.25^2) / 3 = 0.25, std = 0.5
    assert torch.allclose(group_advantages(r, "grpo", eps=0.0), t([[1.5, -0.5, -0.5, -0.5]]))
    # ddof=0: std = sqrt(0.75 / 4) = sqrt(3) / 4
    s0 = math.sqrt(3) / 4
    assert torch.allclose(group_advantages(r, "grpo", ddof=0, eps=0.0),
                          t([[0.75 / s0, -0.25 / s0, -0.25 / s0, -0.25 / s0]]))
    # eps=1e-4 (TRL's) divides by std + eps
    assert torch.allclose(group_advantages(r, "grpo"), t([[1.5, -0.5, -0.5, -0.5]]) * 0.5 / 0.5001)


def test_batch_mean_uses_every_group():
    r = t([[1.0, 0.0], [1.0, 1.0]])  # batch mean 0.75
    assert torch.allclose(group_advantages(r, "batch_mean"), t([[0.25, -0.75], [0.25, 0.25]]))
    # with leading draw axes each (B, G) batch is separate
    rk = torch.stack([r, torch.zeros_like(r)])  # (K=2, B, G)
    assert torch.allclose(group_advantages(rk, "batch_mean")[1], torch.zeros_like(r))


def test_edge_cases_all_equal_and_group_of_two():
    same = t([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    for est in ("rloo", "grpo", "dr_grpo"):
        assert torch.equal(group_advantages(same, est), torch.zeros_like(same)), est
    assert torch.equal(group_advantages(same, "reinforce"), same)
    pair = t([[1.0, 0.0]])
    assert torch.allclose(group_advantages(pair, "rloo"), t([[1.0, -1.0]]))
    assert torch.allclose(group_advantages(pair, "grpo", eps=0.0), t([[1.0, -1.0]]) / math.sqrt(2))
    assert torch.allclose(group_advantages(pair, "grpo", ddof=0, eps=0.0), t([[1.0, -1.0]]))
    with pytest.raises(ValueError):
        group_advantages(t([[1.0]]), "rloo")
    with pytest.raises(ValueError):
        group_advantages(pair, "ppo")


def test_baselines_are_shift_invariant_and_reinforce_is_not():
    r = torch.rand(3, 5, dtype=D)
    for est in ("batch_mean", "rloo", "grpo", "dr_grpo"):
        assert torch.allclose(group_advantages(r + 3.0, est), group_advantages(r, est), atol=1e-12), est
    assert torch.allclose(group_advantages(r + 3.0, "reinforce"), r + 3.0)


# --- the surrogate and the score function --------------------------------------------------------
def test_surrogate_value_mask_and_gradient():
    logps = torch.log(t([[0.5, 0.5], [0.25, 1.0]]))
    loss, m = pg_surrogate_loss(logps, t([1.0, 0.5]))
    assert loss.item() == pytest.approx(-1.5 * math.log(0.25) / 2)
    assert m["adv_mean"] == pytest.approx(0.75) and m["tokens_per_response"] == 2
    # a masked token contributes nothing
    loss_m, m = pg_surrogate_loss(logps, t([1.0, 0.5]), mask=t([[1.0, 0.0], [1.0, 1.0]]))
    assert loss_m.item() == pytest.approx(-(math.log(0.5) + 0.5 * math.log(0.25)) / 2)
    assert m["tokens_per_response"] == 1.5
    # advantages are constants: no gradient flows into them
    adv = t([1.0, -1.0]).requires_grad_()
    x = torch.zeros(2, 2, dtype=D, requires_grad=True)
    pg_surrogate_loss(torch.log_softmax(x, -1), adv)[0].backward()
    assert adv.grad is None and x.grad is not None


def test_closed_form_score_gradient_matches_autograd():
    torch.manual_seed(0)
    trees = [TokenTreeMDP(3, 3, num_correct=5, seed=s) for s in range(2)]
    reward = stack_rewards(trees)
    pol = PromptSetPolicy(2, 3, 3)
    with torch.no_grad():
        for lg in pol.logits:
            lg.normal_()
    gen = torch.Generator().manual_seed(1)
    tokens, nodes, r = sample_responses(reward, pol.probs(), 6, gen)  # (B, G, H)
    adv = group_advantages(r, "grpo")
    loss, _ = pg_surrogate_loss(pol.log_prob(nodes, tokens), adv)
    auto = torch.autograd.grad(-loss, list(pol.logits))
    with torch.no_grad():
        closed = tabular_score_gradient(pol.probs(), nodes[None], tokens[None], adv[None] / 12)
    assert torch.allclose(closed[0], flatten_tables(list(auto)), atol=1e-12)


def test_prompt_set_matches_token_tree_one_prompt_at_a_time():
    torch.manual_seed(0)
    trees = [TokenTreeMDP(3, 3, num_correct=k, seed=s) for s, k in enumerate((2, 9))]
    pol = PromptSetPolicy(2, 3, 3)
    with torch.no_grad():
        for lg in pol.logits:
            lg.normal_()
    reward = stack_rewards(trees)
    j = expected_rewards(reward, pol.probs())
    tokens, nodes, r = sample_responses(reward, pol.probs(), 50, torch.Generator().manual_seed(0))
    lp = pol.log_prob(nodes, tokens)  # (B, N, H)
    for b, tree in enumerate(trees):
        ref = TabularTreePolicy(tree)
        with torch.no_grad():
            for d in range(tree.H):
                ref.logits[d].copy_(pol.logits[d][b])
        assert j[b].item() == pytest.approx(tree.expected_reward(ref.probs()).item(), abs=1e-12)
        assert torch.allclose(lp[b], ref.log_prob(nodes[b], tokens[b]), atol=1e-12)
        leaf = torch.tensor([tree.leaf_id(tok) for tok in tokens[b].tolist()])
        assert torch.equal(r[b], tree.reward[leaf])
        assert torch.equal(nodes[b, :, 1], tokens[b, :, 0])  # the state after one token


def test_stack_rewards_needs_same_shape():
    with pytest.raises(ValueError):
        stack_rewards([TokenTreeMDP(3, 2, num_correct=1), TokenTreeMDP(3, 3, num_correct=1)])


# --- exact expectations by enumeration -----------------------------------------------------------
def _exact_expected_estimate(reward, pol, estimator, group_size):
    """E[g_hat] by summing over every possible batch (B prompts x G leaves) with its probability."""
    probs = [p.detach() for p in pol.probs()]
    b, leaves = reward.shape
    v, h = probs[0].shape[-1], len(probs)
    leaf_p = torch.ones(b, 1, dtype=D)
    for d in range(h):
        leaf_p = (leaf_p[..., None] * probs[d]).reshape(b, -1)  # (B, V^(d+1))
    powers = v ** torch.arange(h - 1, -1, -1)
    leaf = torch.tensor(list(itertools.product(range(leaves), repeat=b * group_size)))
    leaf = leaf.reshape(-1, b, group_size)  # (K, B, G): every possible batch
    prob = leaf_p[None].expand(len(leaf), -1, -1).gather(2, leaf).prod(-1).prod(-1)  # (K,)
    tokens = (leaf[..., None] // powers) % v  # (K, B, G, H)
    nodes = torch.stack([leaf // v ** (h - d) for d in range(h)], -1)  # prefix ids (K, B, G, H)
    r = reward[None].expand(len(leaf), -1, -1).gather(2, leaf)  # (K, B, G)
    adv = group_advantages(r, estimator)
    g = tabular_score_gradient(probs, nodes, tokens, adv / (b * group_size))  # (K, B, P_b)
    assert prob.sum().item() == pytest.approx(1.0)
    return (prob[:, None, None] * g).sum(0)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_expected_estimate_is_c_times_exact_gradient(estimator):
    """On 2 prompts of a V=2, H=2 tree with G=3, E[g_hat] = c(p_b) grad J_b for each prompt b,
    with c = 1 for REINFORCE and RLOO (unbiased): checked exactly, not by sampling."""
    trees = [TokenTreeMDP(2, 2, correct=[0]), TokenTreeMDP(2, 2, correct=[1, 2, 3])]
    reward = stack_rewards(trees)
    pol = PromptSetPolicy(2, 2, 2)
    with torch.no_grad():
        pol.logits[0].copy_(t([[[0.3, -0.2]], [[-0.5, 0.4]]]))
        pol.logits[1].copy_(t([[[0.1, 0.7], [-0.3, 0.2]], [[0.0, 0.5], [0.9, -0.1]]]))
    grad = exact_gradient(reward, pol)  # (B, P_b)
    p = expected_rewards(reward, pol.probs()).detach()
    c = expected_gradient_scale(p, 3, estimator, num_groups=2)
    expected = _exact_expected_estimate(reward, pol, estimator, 3)
    assert torch.allclose(expected, c[:, None] * grad, atol=1e-12)
    if estimator in ("reinforce", "rloo"):
        assert torch.allclose(expected, grad, atol=1e-12)


def test_expected_gradient_scale_values():
    assert expected_gradient_scale(0.2, 5, "rloo").item() == 1.0
    assert expected_gradient_scale(0.2, 5, "dr_grpo").item() == pytest.approx(0.8)
    assert expected_gradient_scale(0.2, 5, "batch_mean", num_groups=4).item() == pytest.approx(0.95)
    p = torch.linspace(0.05, 0.95, 7, dtype=D)
    # G = 2: 0.5 / std([0, 1]) for every p; ddof=1 -> 1/sqrt(2), ddof=0 -> 1
    assert torch.allclose(expected_gradient_scale(p, 2, "grpo", eps=0.0),
                          torch.full_like(p, 1 / math.sqrt(2)))
    assert torch.allclose(expected_gradient_scale(p, 2, "grpo", ddof=0, eps=0.0),
                          torch.ones_like(p))
    # G = 3 by hand at p = 0.5, ddof=1, eps=0: k ~ Bin(2, .5); groups {1,0,0}: A(1) = (2/3)/std,
    # std = sqrt(1*2/3/2) = 1/sqrt(3); {1,1,0}: A(0) = -(2/3)/(1/sqrt 3). c = .25*A1(k=0) +
    # .5*(A1(k=1) - A0(k=1)) - .25*A0(k=2) = (2/sqrt(3)) * (.25 + .5*(.5+.5) ... ) computed below
    s = 1 / math.sqrt(3)
    a1_k0, a1_k1, a0_k1, a0_k2 = (2 / 3) / s, (1 / 3) / s, -(1 / 3) / s, -(2 / 3) / s
    hand = 0.25 * a1_k0 + 0.5 * (a1_k1 - a0_k1) - 0.25 * a0_k2
    assert expected_gradient_scale(0.5, 3, "grpo", eps=0.0).item() == pytest.approx(hand)
    # large G: c -> 1/sqrt(p(1-p)) up to (G-1)/G and the ddof choice
    assert expected_gradient_scale(0.3, 400, "grpo", eps=0.0).item() == pytest.approx(
        1 / math.sqrt(0.21), rel=0.01)
    with pytest.raises(ValueError):
        expected_gradient_scale(0.3, 4, "ppo")


def test_sampled_gradients_mean_approaches_exact():
    """Monte Carlo version of the enumeration test on a bigger tree (loose, 4-sigma tolerance)."""
    trees = [TokenTreeMDP(3, 3, num_correct=k, seed=s) for s, k in enumerate((3, 10))]
    reward = stack_rewards(trees)
    pol = PromptSetPolicy(2, 3, 3)
    g = exact_gradient(reward, pol)
    grads, rewards = sampled_gradients(reward, pol, "rloo", 4, 20000,
                                       torch.Generator().manual_seed(0))
    assert grads.shape == (20000, 2, g.shape[-1]) and rewards.shape == (20000, 2, 4)
    proj = (grads * g).sum((1, 2)) / (g * g).sum()  # (K,)
    assert abs(proj.mean().item() - 1.0) < 4 * proj.std().item() / 20000**0.5


# --- training ------------------------------------------------------------------------------------
def test_one_update_changes_parameters_and_training_improves_j():
    trees = [TokenTreeMDP(3, 2, num_correct=3, seed=s) for s in range(2)]
    one = train_pg(trees, PGConfig(estimator="rloo", group_size=4, num_iters=1, lr=1.0))
    assert any(lg.abs().sum() > 0 for lg in one["policy"].logits)
    assert len(one["J"]) == 2 and one["samples"] == [0, 8]
    run = train_pg(trees, PGConfig(estimator="grpo", group_size=8, num_iters=60, lr=2.0))
    assert run["J"][0] == pytest.approx(3 / 9)
    assert run["J"][-1] > run["J"][0] + 0.3
    assert len(run["J_per_prompt"]) == 61 and len(run["metrics"]) == 60


def test_reward_shift_leaves_group_baselines_unchanged():
    trees = [TokenTreeMDP(3, 2, num_correct=3, seed=s) for s in range(2)]
    cfg = {"group_size": 4, "num_iters": 20, "lr": 1.0, "seed": 3}
    base = train_pg(trees, PGConfig(estimator="rloo", **cfg))["J"]
    shifted = train_pg(trees, PGConfig(estimator="rloo", reward_shift=2.0, **cfg))["J"]
    assert base == pytest.approx(shifted, abs=1e-9)
    r0 = train_pg(trees, PGConfig(estimator="reinforce", **cfg))["J"]
    r2 = train_pg(trees, PGConfig(estimator="reinforce", reward_shift=2.0, **cfg))["J"]
    assert r0 != pytest.approx(r2, abs=1e-6)
