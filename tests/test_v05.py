"""V0.5's fused baseline, reliability test, extra-rollout allocation and loop: hand-computed values,
RLOO from core as an independent route, the closed-form gradient bias of each baseline, budgets."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import v05
from agentrl_lib.core import rloo_advantages
from agentrl_lib.envs.prompt_bandit import PromptBandit


def test_fusion_weight_is_inverse_variance_and_minimises_mse():
    v, n, tau2 = 0.3, 4, 0.02
    w, _ = v05.fusion_weight([v], [n], tau2)
    sigma2 = v * (1 - v)
    assert np.isclose(w[0], (1 / tau2) / (1 / tau2 + n / sigma2))
    # the MSE of w v + (1 - w) m for independent errors of variances tau2 and sigma2/n, on a grid
    ws = np.linspace(0, 1, 10001)
    mse = ws ** 2 * tau2 + (1 - ws) ** 2 * sigma2 / n
    assert abs(ws[np.argmin(mse)] - w[0]) < 1e-3
    assert np.isclose(mse.min(), 1 / (1 / tau2 + n / sigma2), rtol=1e-6)
    assert v05.fusion_weight([0.5], [0], 0.1)[0][0] == 1.0 and v05.fusion_weight([0.5], [4], 0.0)[0][0] == 1.0


def test_group_mean_baselines_match_core_and_masks():
    rng = np.random.default_rng(0)
    r = (rng.random((5, 6)) < 0.4).astype(float)
    b, _ = v05.fused_baseline(r)
    assert np.allclose(b, r.mean(1, keepdims=True))
    b_loo, _ = v05.fused_baseline(r, leave_one_out=True)
    assert np.allclose(r - b_loo, rloo_advantages(torch.from_numpy(r)).numpy())
    # a mask: the first row has 2 rollouts, the second 3
    r = np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    mask = np.array([[True, True, False], [True, True, True]])
    b, _ = v05.fused_baseline(r, mask)
    assert np.allclose(b, [[0.5, 0.5, 0.0], [2 / 3, 2 / 3, 2 / 3]])
    b, _ = v05.fused_baseline(r, mask, leave_one_out=True)
    assert np.allclose(b, [[0.0, 1.0, 0.0], [0.5, 0.5, 1.0]])
    with pytest.raises(ValueError, match="at least 2"):
        v05.fused_baseline(np.array([[1.0]]), leave_one_out=True)


def test_fused_baseline_by_hand_and_rejected_prior():
    r = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    v = np.array([0.2, 0.2])
    # w = 0.16 / (0.16 + 4 * 0.01) = 0.8: b = 0.8 * 0.2 + 0.2 * m
    b, m = v05.fused_baseline(r, prior=v, prior_var=0.01)
    assert np.allclose(b[:, 0], [0.16 + 0.1, 0.16]) and np.isclose(m["prior_weight"], 0.8)
    b, _ = v05.fused_baseline(r, prior=v, prior_var=0.01, use_prior=[False, True])
    assert np.allclose(b[:, 0], [0.5, 0.16])
    # left out: w = 0.16 / (0.16 + 3 * 0.01), the other three's mean
    w3 = 0.16 / 0.19
    b, _ = v05.fused_baseline(r, prior=v, prior_var=0.01, leave_one_out=True)
    assert np.allclose(b[0], w3 * 0.2 + (1 - w3) * np.array([1 / 3, 1 / 3, 2 / 3, 2 / 3]))


def test_prior_test_and_allocation_by_hand():
    r = np.array([[1.0, 1, 1, 0], [0.0, 0, 0, 0], [0.0, 0, 0, 0]])
    rej, m = v05.prior_test(r, prior=[0.2, 0.2, 0.9], prior_var=0.01, z_crit=2.0)
    sd = np.sqrt([0.16 / 4 + 0.01, 0.16 / 4 + 0.01, 0.09 / 4 + 0.01])
    assert np.allclose(m["z"], (np.array([0.75, 0.0, 0.0]) - [0.2, 0.2, 0.9]) / sd)
    assert rej.tolist() == [True, False, True]
    # pooled per round: rounds {0, 1} and {2}; round 0's discrepancy 0.55 - 0.2 = 0.35 over sd sqrt(0.1)
    rej, m = v05.prior_test(r, prior=[0.2, 0.2, 0.9], prior_var=0.01, pooled=True, groups=[0, 0, 1])
    assert np.isclose(m["z_pool"][0], 0.35 / np.sqrt(0.1)) and rej.tolist() == [True, False, True]
    # allocation: q = (s + 1) / (n + 2); k = ceil(q (1 - q) / target) - n, capped
    k, _ = v05.allocate_extra(r, reject=[True, True, False], mse_target=0.02, max_extra=8)
    q0 = 4 / 6
    assert k.tolist() == [int(np.ceil(q0 * (1 - q0) / 0.02)) - 4, 3, 0] == [8, 3, 0]
    k, _ = v05.allocate_extra(r, reject=[True, True, False], mse_target=0.02, max_extra=4)
    assert k.tolist() == [4, 3, 0]
    # per-round budgets: the same two prompts in two rounds each get their own budget of 3
    r2 = np.array([[1.0, 1, 1, 0], [0.0, 0, 0, 0]] * 2)
    k, _ = v05.allocate_extra(r2, reject=[True] * 4, budget=3, groups=[0, 0, 1, 1])
    assert k.sum() == 6 and k[:2].tolist() == k[2:].tolist()


def test_policy_gradient_equals_bandit_and_the_closed_form_biases():
    bandit = PromptBandit(num_prompts=3, seed=2)
    rng = np.random.default_rng(0)
    r = bandit.rewards([0, 1, 2], 4, rng)
    b = np.array([0.1, 0.5, 0.9])
    g, _ = v05.policy_gradient(r, np.ones_like(r, bool), np.repeat(b[:, None], 4, 1), bandit.p)
    assert np.allclose(g, bandit.policy_gradient([0, 1, 2], r, b))
    # estimator_study: GRPO's ratio (G-1)/G; the fused baseline, not left out and without a test,
    # 1 - (1 - w)/G with w at the prior (noise 0: w is fixed); left out: 1
    bandit = PromptBandit(num_prompts=8, seed=3, prior_noise=0.0)
    G, tau2 = 4, 0.01
    grpo = v05.estimator_study(bandit, v05.V05Config("grpo", group_size=G), 20000, np.random.default_rng(1))
    assert abs(grpo["grad_ratio"] - 0.75) < 0.01 and grpo["rollouts_per_prompt"] == G
    fused = v05.estimator_study(bandit, v05.V05Config("fused", group_size=G, prior_var=tau2), 20000,
                                np.random.default_rng(1))
    p, exact = bandit.p, bandit.exact_gradient(np.arange(8))
    w = p * (1 - p) / (p * (1 - p) + G * tau2)
    assert abs(fused["grad_ratio"] - (exact * (1 - (1 - w) / G)).sum() / exact.sum()) < 0.01
    loo = v05.estimator_study(bandit, v05.V05Config("fused", leave_one_out=True), 20000, np.random.default_rng(1))
    assert abs(loo["grad_ratio"] - 1.0) < 0.01
    # the exact prior (noise 0, bias 0) with tau2 = 0: b = p, baseline MSE 0, and the gradient
    # variance p (1 - p) (1 - 2p)^2 / G of a fixed baseline b = p
    exactp = v05.estimator_study(bandit, v05.V05Config("fused", prior_var=0.0), 20000, np.random.default_rng(2))
    assert exactp["baseline_mse"] < 1e-20
    assert np.isclose(exactp["grad_var"], np.mean(p * (1 - p) * (1 - 2 * p) ** 2 / G), rtol=0.05)


def test_rounds_count_every_rollout_and_train_respects_budget():
    bandit = PromptBandit(num_prompts=32, seed=0, prior_bias=3.0)
    cfg = v05.V05Config("v05", num_prompts=8, extra_per_prompt=1.5)
    rnd = v05.sample_round(bandit, np.arange(8), cfg, np.random.default_rng(0))
    assert rnd.rollouts == rnd.mask.sum() and 32 <= rnd.rollouts <= 32 + 12
    dapo = v05.V05Config("dapo", num_prompts=8, max_resample_rounds=3)
    rnd = v05.sample_round(bandit, np.arange(8), dapo, np.random.default_rng(0))
    assert rnd.rollouts >= rnd.r.size and np.all(rnd.r.max(1) != rnd.r.min(1))
    before = bandit.theta.copy()
    out = v05.train(bandit, v05.V05Config("grpo", num_prompts=8, rollout_budget=320, lr=1.0),
                    np.random.default_rng(0))
    assert out["rollouts"][-1] == 320 and len(out["success"]) == 11
    assert np.all(bandit.theta >= before)  # every step of a baseline in [0, 1] raises the logit
    assert np.allclose(v05.curve_on_grid(out["rollouts"], out["success"], [0, 31, 32]),
                       [out["success"][0], out["success"][0], out["success"][1]])
    with pytest.raises(ValueError, match="estimator"):
        v05.V05Config("ppo")
