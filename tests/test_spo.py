"""SPO's self-play reward, the shared REINFORCE step and the tabular Bradley-Terry fit, against
hand-computed numbers, autograd and ``rewards.reward_model``."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import spo
from agentrl_lib.envs.pref_bandit import PrefBandit, exploitability, minimax_winner
from agentrl_lib.rewards import reward_model


def test_self_play_rewards_by_hand():
    wins = np.array([[0, 1, 0, 1], [0, 0, 1, 1], [1, 0, 0, 0], [0, 0, 1, 0]])
    assert np.allclose(spo.self_play_rewards(wins), [2 / 3, 2 / 3, 1 / 3, 1 / 3])
    with pytest.raises(ValueError, match="N >= 2"):
        spo.self_play_rewards(np.zeros((1, 1)))


def test_sample_wins_is_antisymmetric_and_its_mean_reward_is_the_win_rate():
    b = PrefBandit.rock_paper_scissors(margins=(0.6, 0.9, 0.3))
    rng = np.random.default_rng(0)
    pi = np.array([0.5, 0.3, 0.2])
    totals, counts = np.zeros(3), np.zeros(3)
    for _ in range(3000):
        ys = rng.choice(3, size=6, p=pi)
        w = spo.sample_wins(b, ys, rng)
        off = ~np.eye(6, dtype=bool)
        assert np.allclose((w + w.T)[off], 1.0) and np.allclose(np.diag(w), 0)
        np.add.at(totals, ys, spo.self_play_rewards(w))
        np.add.at(counts, ys, 1)
    # E[r_i | y_i = k] = (P @ pi)[k]: the other N-1 samples are iid draws from pi
    assert np.allclose(totals / counts, b.win_rate(pi), atol=0.01)


def test_pg_step_equals_autograd():
    theta = np.array([0.3, -0.2, 0.5, 0.0])
    ys = np.array([0, 2, 2, 3, 1])
    r = np.array([1.0, 0.5, 0.25, 0.0, 0.75])
    alpha, lr = 0.1, 0.7
    new, _ = spo.pg_step(theta, ys, r, lr, alpha)
    th = torch.tensor(theta, requires_grad=True)
    logp = torch.log_softmax(th, 0)[torch.tensor(ys)]
    rs = torch.tensor(r) - alpha * logp.detach()
    obj = ((rs - rs.mean()) * logp).mean()
    obj.backward()
    assert np.allclose(new, theta + lr * th.grad.numpy(), atol=1e-12)
    # equal rewards and alpha 0: no step
    same, _ = spo.pg_step(theta, ys, np.ones(5), lr, 0.0)
    assert np.allclose(same, theta)


def test_fit_tabular_bt_recovers_utilities_and_equals_reward_model_fit():
    u_true = np.array([0.0, 1.0, -0.5, 0.4])
    b = PrefBandit.transitive(u_true)
    rng = np.random.default_rng(0)
    i, j = rng.integers(0, 4, 4000), rng.integers(0, 4, 4000)
    keep = i != j
    i, j = i[keep], j[keep]
    y = b.compare(i, j, rng)
    c, r = np.where(y > 0, i, j), np.where(y > 0, j, i)
    u, m = spo.fit_tabular_bt(4, c, r, l2=0.0)
    assert np.allclose(u, u_true - u_true.mean(), atol=0.15)
    # the stationarity of bt_loss over the raw pairs (the reward model's loss) at u
    ut = torch.tensor(u, requires_grad=True)
    loss, _ = reward_model.bt_loss(ut[torch.tensor(c)], ut[torch.tensor(r)])
    loss.backward()
    assert ut.grad.abs().max() < 1e-8
    assert m["rm/loss"] == pytest.approx(loss.item(), abs=1e-10)
    # and reward_model.fit of a TabularRM gets there too
    torch.manual_seed(0)
    rm = reward_model.TabularRM(4).double()
    reward_model.fit(rm.parameters(), reward_model.index_pair_rewards(
        rm, torch.tensor(c), torch.tensor(r)), len(c), lr=0.1, num_epochs=400, batch_size=len(c))
    u_rm = rm.scores.detach().numpy()
    assert np.allclose(u_rm - u_rm.mean(), u, atol=1e-3)


def test_reward_model_route_collapses_and_spo_average_reaches_the_minimax_winner():
    b = PrefBandit.rock_paper_scissors(margins=(0.6, 0.9, 0.3), num_dominated=2)
    mw = minimax_winner(b)
    s = spo.train(b, spo.SPOConfig(arm="spo", num_iters=400, seed=0), target=mw)
    rm = spo.train(b, spo.SPOConfig(arm="reward_model", num_iters=400, seed=0), target=mw)
    assert s["avg_exploitability"][-1] < 0.05
    assert rm["final_pi"].max() > 0.8 and rm["exploitability"][-1] > 0.15
    assert len(s["exploitability"]) == 400 and len(s["avg_tv"]) == 400


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="unknown arm"):
        spo.SPOConfig(arm="dpo")
    with pytest.raises(ValueError, match="num_samples"):
        spo.SPOConfig(num_samples=1)


def test_lm_train_lr0_keeps_the_reference_and_the_rm_is_the_bt_fit_of_uniform_draws():
    import torch

    from agentrl_lib.algorithms import inpo
    from agentrl_lib.models.tiny_lm import new_model

    model, tok = new_model("tiny-64", seed=0)
    game = PrefBandit.rock_paper_scissors(margins=(0.6, 0.9, 0.3), num_dominated=1)
    prompts, cands = ["1+2=", "3+4="], [["3", "4", "2", "13"], ["7", "8", "6", "17"]]
    with torch.no_grad():
        ref = inpo.lm_candidate_logps(model, tok, prompts, cands).exp().double().numpy()
    want = np.mean([exploitability(p, game.P) for p in ref])
    for arm in spo.ARMS:
        out = spo.lm_train(model, tok, prompts, cands, game, spo.SPOConfig(arm, 3, 4, 0.0, 0.05, seed=1))
        assert np.allclose(out["final_pi"], ref, atol=1e-6) and np.allclose(out["avg_pi"], ref, atol=1e-6)
        assert np.allclose(out["exploitability"], want, atol=1e-6)
        assert np.allclose(out["avg_exploitability"], want, atol=1e-6)
    rng = np.random.default_rng(1)  # the reward model's draws replayed: 3 steps x 2 prompts x 4*3/2 pairs
    i, j = rng.integers(0, 4, 36), rng.integers(0, 4, 36)
    y = game.compare(i, j, rng)
    u, _ = spo.fit_tabular_bt(4, np.where(y > 0, i, j), np.where(y > 0, j, i), l2=1e-3)
    assert np.allclose(out["r_hat"], u)
    with pytest.raises(ValueError, match="optimizer"):
        spo.lm_train(model, tok, prompts, cands, game, spo.SPOConfig("spo", 1, 4, 0.0), optimizer="rmsprop")
    with pytest.raises(ValueError, match="candidates"):
        spo.lm_train(model, tok, prompts, [["3", "4"], ["7", "8"]], game, spo.SPOConfig("spo", 1, 4, 0.0))
