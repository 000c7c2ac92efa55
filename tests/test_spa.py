"""SPA-RL: the sum-to-outcome progress fit, the grounding term and the step advantages."""

import copy

import numpy as np
import pytest
import torch

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


# --- the released pipeline (prm/rl_data_org.py, ppo/step_ppotrainer.py), by hand ---------------
def test_loo_contributions_as_rl_data_org():
    eps = [Episode.of("ab", [0, 1.0]), Episode.of("abc", [0, 0, 0.5]), Episode.of("a", [0.0]),
           Episode.of("ab", [0, 1.0])]
    c = spa.loo_contributions(eps, ids=[7, 7, 7, 9])
    # episode 0: 1 - mean(0.5, 0) = 0.75 on every turn; 1: 0.5 - mean(1, 0) = 0; 2: 0 - 0.75
    assert [x.tolist() for x in c] == [[0.75, 0.75], [0.0, 0.0, 0.0], [-0.75], [1.0, 1.0]]


def test_released_grounding_and_turn_rewards():
    e = Episode.of("abcd", [0, 0, 0, 1.0], valid=[True, False, True, False])
    g = spa.released_grounding([e])[0]
    assert g.tolist() == [0.5, 0.0, 0.5, 0.5]  # the last turn always 0.5
    s = spa.step_scores([e], contributions=[np.array([0.1, 0.2, 0.3, 0.4])])[0]
    assert np.allclose(s, [0.6, 0.2, 0.8, 0.9])
    assert np.allclose(spa.released_turn_rewards([s])[0], [0.6 * 3, 0.2 * 2, 0.8 * 1, 0.0])


def test_released_token_rewards_by_hand():
    # three turns: action tokens at 1-2, 5, 7-8 (observations in between)
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 1, 1, 0], [1, 1, 0, 1, 0, 0, 0, 0, 0, 0]])
    kl = torch.full((2, 10), 0.2)
    r = spa.released_token_rewards([[1.0, 2.0, 3.0], [4.0, 5.0]], mask, kl, kl_coef=0.5)
    want = -0.5 * 0.2 * mask.double()
    want[0, 2] += 1.0 * 2  # turn 0's score x (T - 0 - 1)
    want[0, 5] += 2.0 * 1
    want[0, 8] += 3.0 * 0  # the last turn's score counts 0 times
    want[1, 1] += 4.0 * 1
    assert torch.allclose(r, want)


def trl_compute_advantages(values, rewards, mask, gamma, lam):
    """TRL's PPOTrainer.compute_advantages (trl 0.11), verbatim but for self.config."""
    lastgaelam = 0
    advantages_reversed = []
    gen_len = rewards.shape[-1]
    values = values * mask
    rewards = rewards * mask
    for t in reversed(range(gen_len)):
        nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1]).transpose(0, 1)
    returns = advantages + values
    mean = (advantages * mask).sum() / mask.sum()
    var = ((advantages - mean) ** 2 * mask).sum() / mask.sum()
    var = var * mask.sum() / (mask.sum() - 1)  # masked_var, unbiased
    return (advantages - mean) * torch.rsqrt(var + 1e-8), returns


def test_trl_gae_equals_trl_loop():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(3, 9, generator=g) < 0.6).double()
    r, v = torch.randn(3, 9, generator=g).double(), torch.randn(3, 9, generator=g).double()
    adv, ret = spa.trl_gae(r, v, mask, gamma=0.99, lam=0.95)
    ref_adv, ref_ret = trl_compute_advantages(v, r, mask, 0.99, 0.95)
    assert torch.allclose(adv, ref_adv * mask) and torch.allclose(ret, ref_ret)


def test_adaptive_kl_controller():
    kl = spa.AdaptiveKLController(0.3, target=6.0, horizon=10000)
    assert abs(kl.update(3.0, 8) - 0.3 * (1 - 0.2 * 8 / 10000)) < 1e-15  # clipped at -0.2
    assert abs(kl.update(6.6, 8) - 0.3 * (1 - 0.00016) * (1 + 0.1 * 8 / 10000)) < 1e-15


def test_released_credit_by_hand():
    eps = [Episode.of("ab", [0, 1.0]), Episode.of("ab", [0, 0.0], valid=[False, True])]
    cr = spa.ReleasedCredit(gamma=1.0, lam=1.0, norm_adv=False)
    adv = cr(eps)
    # scores: [1 + 0.5, 1 + 0.5] and [-1 + 0, -1 + 0.5]; turn rewards x (T - t - 1) = (1, 0)
    # V = 0, gamma = lam = 1: A_t = sum_{k >= t} r_k
    assert np.allclose(adv[0], [1.5, 0.0]) and np.allclose(adv[1], [-1.0, 0.0])
    assert cr.critic["a"] == pytest.approx(0.75 + 0.5 * (-1.0 - 0.75))  # critic_lr 0.5 and cr.critic["b"] == 0.0
    white = spa.ReleasedCredit(gamma=1.0, lam=1.0)([eps[0], eps[1]])
    flat = np.array([1.5, 0.0, -1.0, 0.0])
    assert np.allclose(np.concatenate(white), (flat - flat.mean()) / flat.std(ddof=1), atol=1e-6)


def test_ppo_train_one_update(tiny_lm):
    from agentrl_lib.algorithms import grpo
    from agentrl_lib.algorithms.ppo_lm import PPOLMConfig
    from agentrl_lib.envs.shop import ShopEnv, make_catalog

    model, tok = tiny_lm
    cat = make_catalog(1, 2, 2, 2, 2, seed=0)
    make_env = lambda: ShopEnv(cat, max_turns=2)  # noqa: E731
    gcfg = grpo.GRPOConfig(num_prompts=2, group_size=2, max_new_tokens=3, max_turns=2, seed=0)
    data = spa.collect(grpo.episode_sampler(tok, make_env, list(range(8)), gcfg), model, 1)
    ref = copy.deepcopy(model)
    cfg = PPOLMConfig(critic="shared", gamma=0.99, lam=0.95, beta=0.3, num_iters=1, lr=1e-2,
                      max_new_tokens=3, num_prompts=2, group_size=2)
    before = [p.detach().clone() for p in model.parameters()]
    def scores(eps):  # scores that differ between episodes (the tiny random LM rarely succeeds)
        return [np.full(len(e), float(i)) for i, e in enumerate(eps)]
    rows = spa.ppo_train(model, spa.offline_sampler(data), cfg, scores, ref)
    assert np.isfinite(rows[-1]["losses/loss"]) and rows[-1]["losses/kl"] == pytest.approx(0.0)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_packed_logps_values_equal_padded(tiny_lm):
    from agentrl_lib.algorithms import grpo, ppo_lm
    from agentrl_lib.envs.shop import ShopEnv, make_catalog

    model, tok = tiny_lm
    cat = make_catalog(1, 2, 2, 2, 2, seed=0)
    gcfg = grpo.GRPOConfig(num_prompts=2, group_size=2, max_new_tokens=3, max_turns=3, seed=1)
    g = grpo.episode_sampler(tok, lambda: ShopEnv(cat, max_turns=3), list(range(8)),
                             gcfg)(model).seqs
    critic = ppo_lm.make_value_model(model, "shared")
    torch.nn.init.normal_(critic.head.weight)  # a head that is not all zero
    packed = spa.episode_logps_values(model, critic, g)
    padded = ppo_lm.logps_values(model, critic, g.prompt_ids, g.prompt_mask, g.completion_ids,
                                 g.completion_mask, 1.0, g.loss_mask)
    for a, b in zip(packed, padded):
        assert torch.allclose(a, b, atol=1e-5)
    assert torch.allclose(packed[0], g.logps * g.loss_mask, atol=1e-5)  # the sampling log-probs


def test_released_credit_kl_term():
    eps = [Episode.of("ab", [0, 1.0]), Episode.of("ab", [0, 0.0])]
    logp = torch.tensor([-1.0, -2.0, -0.5, -1.5], dtype=torch.float64)  # (N,) turn log-probs
    ref = torch.full((4,), -1.0, dtype=torch.float64)
    cr = spa.ReleasedCredit(logp_fn=lambda e: logp, ref_logp_fn=lambda e: ref, kl_coef=0.3,
                            gamma=1.0, lam=1.0, norm_adv=False)
    adv = cr(eps)
    kl = (logp - ref).numpy()  # [0, -1, 0.5, -0.5]
    r0 = np.array([1.5 * 1, 0.0]) - 0.3 * kl[:2]  # scores x (T - t - 1) - kl_coef KL
    r1 = np.array([-0.5 * 1, 0.0]) - 0.3 * kl[2:]  # s = -1 + 0.5
    assert np.allclose(adv[0], np.cumsum(r0[::-1])[::-1])
    assert np.allclose(adv[1], np.cumsum(r1[::-1])[::-1])
    assert cr.metrics["kl"] == pytest.approx(((0 - 1) + (0.5 - 0.5)) / 2)
    assert cr.kl.value == pytest.approx(0.3 * (1 - 0.2 * 2 / 10000))  # adapted after the batch
