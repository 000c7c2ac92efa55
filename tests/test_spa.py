"""SPA-RL: the sum-to-outcome progress fit, the grounding term and the step advantages."""

import numpy as np
import pytest

from agentrl_lib.algorithms import spa
from agentrl_lib.algorithms.credit import grpo_broadcast
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.policies import tabular_agent
from agentrl_lib.rollout import Episode, play_episodes


def ep(keys, R, valid=None, group_id=0):
    """An episode that takes action 'a' in each state of ``keys`` and gets R at the end."""
    T = len(keys)
    return Episode.of(keys, [0.0] * (T - 1) + [R], group_id, valid=list(valid or [True] * T),
                      observations=[str(k) for k in keys])


def test_sum_to_outcome_fit_recovers_known_contributions():
    c = {"x": 0.2, "y": 0.3, "z": 0.5}
    eps = [ep(k, sum(c[s] for s in k)) for k in (["x", "y"], ["y", "z"], ["x", "z"], ["x", "y", "z"])]
    model = spa.ProgressModel(spa.SPAConfig(l2=1e-12))
    metrics = model.fit(eps)
    assert metrics["fit_mse"] < 1e-18 and metrics["num_features"] == 3
    got = model.contributions(eps)
    assert np.allclose(got[3], [0.2, 0.3, 0.5], atol=1e-9)
    assert np.allclose(model.progress(eps)[3], [0.2, 0.5, 1.0], atol=1e-9)
    # an unseen (state, action) pair contributes 0
    assert model.contributions([ep(["w", "x"], 0.0)])[0][0] == 0.0


def test_underdetermined_fit_is_minimum_norm_and_ridge_shrinks():
    # one episode x -> y with R = 1: every c_x + c_y = 1 fits; min-norm is (1/2, 1/2)
    model = spa.ProgressModel(spa.SPAConfig(l2=1e-12))
    model.fit([ep(["x", "y"], 1.0)])
    assert np.allclose(model.contributions([ep(["x", "y"], 1.0)])[0], [0.5, 0.5])
    # ridge by hand: X = [1, 1], w = X^T R / (X X^T + l2) = 1 / (2 + l2) each
    model = spa.ProgressModel(spa.SPAConfig(l2=2.0))
    model.fit([ep(["x", "y"], 1.0)])
    assert np.allclose(model.w, [0.25, 0.25])


def test_grounding_and_fused_rewards_by_hand():
    e = ep(["x", "y", "z"], 1.0, valid=[True, False, True])
    assert spa.grounding([e])[0].tolist() == [1.0, 0.0, 1.0]
    contrib = lambda eps: [np.array([0.2, 0.3, 0.5])]  # noqa: E731
    r = spa.fused_rewards(contrib([e]), spa.grounding([e]), 1.0, 0.5)[0]
    assert np.allclose(r, [0.7, 0.3, 1.0])
    cfg = spa.SPAConfig(gamma=1.0, norm_adv=False)
    assert np.allclose(spa.spa_advantages([e], contrib, cfg)[0], [2.0, 1.3, 1.0])
    cfg = spa.SPAConfig(gamma=0.5, norm_adv=False, beta=0.0)
    # 0.2 + 0.5 * (0.3 + 0.5 * 0.5) = 0.475
    assert np.allclose(spa.spa_advantages([e], contrib, cfg)[0], [0.475, 0.55, 0.5])
    # whitened over the batch: mean 0, std 1 over all turns
    adv = spa.spa_advantages([e, e], contrib, spa.SPAConfig())
    flat = np.concatenate(adv)
    assert abs(flat.mean()) < 1e-12 and abs(flat.std() - 1.0) < 1e-6
    with pytest.raises(ValueError):
        spa.SPAConfig(model="gru")


def test_mlp_estimator_fits_the_sums():
    c = {"x": 0.2, "y": 0.3, "z": 0.5}
    eps = [ep(k, sum(c[s] for s in k)) for k in (["x", "y"], ["y", "z"], ["x", "z"], ["x", "y", "z"])]
    onehot = {"x": [1, 0, 0], "y": [0, 1, 0], "z": [0, 0, 1]}
    cfg = spa.SPAConfig(model="mlp", num_epochs=2000, lr=0.01, l2=0.0)
    model = spa.ProgressModel(cfg, features=lambda s, a: onehot[s])
    assert model.fit(eps)["fit_mse"] < 1e-4
    assert np.allclose(model.contributions(eps)[3], [0.2, 0.3, 0.5], atol=0.02)


def test_works_on_grid_episodes_in_credit_shape():
    env = GridAgentEnv(tasks=[((0, 0), (0, 3))], max_turns=8)
    uniform = np.full((1, 4), 0.25)
    eps = play_episodes(lambda: GridAgentEnv(tasks=[((0, 0), (0, 3))], max_turns=8),
                        tabular_agent(uniform, lambda e: 0, np.random.default_rng(0)),
                        seeds=list(range(16)), group_size=4)
    credit = spa.SPACredit(spa.ProgressModel(spa.SPAConfig()))
    adv = credit(eps)
    ref = grpo_broadcast(eps)
    assert [a.shape for a in adv] == [a.shape for a in ref]
    assert all(a.dtype == np.float64 for a in adv) and len(credit.history) == 1
    assert credit.history[0]["num_features"] > 4 and env.actions  # (cell, goal) x move pairs



def test_mlp_init_is_seeded_and_within_linear_bounds():
    import torch

    state = torch.random.get_rng_state()
    a, b = spa.mlp_init(5, 7, seed=3), spa.mlp_init(5, 7, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG untouched
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q) and p.dtype == torch.float64
    assert a[0].weight.abs().max() <= 1 / np.sqrt(5) and a[2].weight.abs().max() <= 1 / np.sqrt(7)
    assert not torch.equal(a[0].weight, spa.mlp_init(5, 7, seed=4)[0].weight)


def test_sum_to_outcome_mse_by_hand():
    import torch

    c = torch.tensor([0.2, 0.3, 0.5, 1.0], dtype=torch.float64)
    owner = torch.tensor([0, 0, 1, 1])
    y = torch.tensor([1.0, 1.0], dtype=torch.float64)
    # sums (0.5, 1.5): errors -0.5, +0.5 -> mean square 0.25
    assert abs(spa.sum_to_outcome_mse(c, owner, y).item() - 0.25) < 1e-12
    assert abs(spa.sum_to_outcome_loss([[0.2, 0.3], [0.5, 1.0]], [1.0, 1.0]) - 0.25) < 1e-12


def test_mlp_fit_equals_a_from_scratch_loop():
    import torch

    c = {"x": 0.2, "y": 0.3, "z": 0.5}
    eps = [ep(k, sum(c[s] for s in k)) for k in (["x", "y"], ["y", "z"], ["x", "z"], ["x", "y", "z"])]
    onehot = {"x": [1.0, 0, 0], "y": [0, 1.0, 0], "z": [0, 0, 1.0]}
    cfg = spa.SPAConfig(model="mlp", num_epochs=50, lr=0.01, l2=1e-3, hidden=8)
    model = spa.ProgressModel(cfg, features=lambda s, a: onehot[s], seed=2)
    model.fit(eps)
    net = spa.mlp_init(3, 8, 2)
    x = torch.tensor([onehot[s] for e in eps for s in e.state_keys], dtype=torch.float64)
    owner = torch.tensor([i for i, e in enumerate(eps) for _ in e.state_keys])
    y = torch.tensor([e.ret for e in eps], dtype=torch.float64)
    opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=1e-3)
    for _ in range(50):
        sums = torch.stack([net(x[owner == i]).sum() for i in range(len(eps))])
        loss = ((sums - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        ours = net(x).squeeze(-1).numpy()
    assert np.allclose(np.concatenate(model.contributions(eps)), ours, atol=1e-10)


def test_spa_credit_runs_with_the_default_device_on_meta():
    import torch

    c = {"x": 0.2, "y": 0.3, "z": 0.5}
    eps = [ep(k, sum(c[s] for s in k)) for k in (["x", "y"], ["y", "z"], ["x", "z"], ["x", "y", "z"])]
    onehot = {"x": [1.0, 0, 0], "y": [0, 1.0, 0], "z": [0, 0, 1.0]}
    cfg = spa.SPAConfig(model="mlp", num_epochs=5, gamma=0.0)
    credit = spa.SPACredit(spa.ProgressModel(cfg, features=lambda s, a: onehot[s]), cfg)
    torch.set_default_device("meta")
    try:
        adv = credit(eps)
    finally:
        torch.set_default_device(None)
    assert [len(a) for a in adv] == [2, 2, 2, 3] and np.isfinite(np.concatenate(adv)).all()
