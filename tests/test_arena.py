"""The credit arena's scores against hand-computed numbers and the exact tabular oracles."""

import math

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import dp
from agentrl_lib.analysis import arena
from agentrl_lib.envs import tabular as T
from agentrl_lib.rollout import Episode


def _ep(keys, rewards):
    return Episode.of(keys, rewards)


def test_pearson_spearman_by_hand():
    # x = [1, 2, 3], y = [2, 4, 7]: cov = (-1)(-2.333)+0+(1)(2.667) = 5, |xc| = sqrt 2,
    # |yc|^2 = 5.444 + 0.111 + 7.111 = 12.667 -> r = 5 / sqrt(2 * 12.667)
    assert arena.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 38 / 3))
    assert arena.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(arena.pearson([1, 1, 1], [1, 2, 3]))  # constant estimate
    assert math.isnan(arena.pearson([1.0], [2.0]))
    # monotone but not linear: Spearman 1, Pearson < 1
    x, y = [1, 2, 3, 4], [1, 10, 100, 1000]
    assert arena.spearman(x, y) == pytest.approx(1.0)
    assert arena.pearson(x, y) < 0.9
    # ties get the average rank
    assert arena.ranks([5, 5, 1]).tolist() == [1.5, 1.5, 0.0]


def test_sign_agreement_edge_cases():
    exact = np.array([0.5, -0.2, 0.0005, -1.0])
    assert arena.sign_agreement([1, -1, -9, -3], exact) == 1.0  # |0.0005| <= tol is ignored
    assert arena.sign_agreement([1, 1, 0, 0], exact) == pytest.approx(1 / 3)  # 0 is a miss
    assert math.isnan(arena.sign_agreement([1.0], [0.0]))


def test_affine_and_scaled_mse():
    exact = np.array([1.0, -1.0, 2.0, 0.0])
    assert arena.affine_mse(3 * exact + 7, exact) == pytest.approx(0.0, abs=1e-12)
    assert arena.affine_mse(np.ones(4), exact) == pytest.approx(exact.var())
    est = np.array([0.0, 1.0, 1.0, 3.0])
    r = arena.pearson(est, exact)
    assert arena.affine_mse(est, exact) == pytest.approx(exact.var() * (1 - r * r))
    # global scale pooled over batches: est [1, 2] vs [2, 4] and [1] vs [2] -> c = 2
    assert arena.global_scale([np.array([1.0, 2.0]), np.array([1.0])],
                              [np.array([2.0, 4.0]), np.array([2.0])]) == pytest.approx(2.0)
    assert arena.global_scale(np.zeros(3), np.ones(3)) == 0.0
    assert arena.scaled_mse([1.0, 2.0], [2.0, 5.0], 2.0) == pytest.approx(0.5)


def test_score_and_flat():
    est = [np.array([1.0, 2.0]), np.array([3.0])]
    assert arena.flat(est).tolist() == [1.0, 2.0, 3.0]
    s = arena.score(arena.flat(est), [1.0, 2.0, 3.0])
    assert s["pearson"] == pytest.approx(1.0) and s["sign"] == 1.0
    assert s["affine_mse"] == pytest.approx(0.0, abs=1e-12)


def test_mc_critic_by_hand():
    # gamma 0.5; episode 1: keys a, b, rewards 0, 1 -> G = 0.5, 1; episode 2: key a, reward 0 -> 0
    eps = [_ep(["a", "b"], [0.0, 1.0]), _ep(["a"], [0.0])]
    v = arena.mc_critic(eps, 0.5)
    assert v == {"a": pytest.approx(0.25), "b": pytest.approx(1.0)}
    lookup = arena.turn_lookup(eps, lambda ep, t: v[ep.state_keys[t]])
    assert [x.tolist() for x in lookup] == [[0.25, 1.0], [0.25]]


def test_finite_horizon_matches_infinite_and_hand():
    mdp = T.gridworld(["S..", ".#.", "..G"], slip=0.2, gamma=0.9)
    pi = torch.softmax(torch.randn(mdp.num_states, mdp.num_actions, dtype=torch.float64,
                                   generator=torch.Generator().manual_seed(0)), -1)
    adv, val = dp.finite_horizon_advantages(mdp, pi, 400)
    assert adv.shape == (400, 9, 4) and val.shape == (400, 9)
    # far from the cap the time-limited values are the stationary ones
    assert torch.allclose(adv[0], dp.advantages(mdp, pi), atol=1e-10)
    assert torch.allclose(val[0], dp.policy_evaluation(mdp, pi), atol=1e-10)
    # one turn left: A = R - sum_a pi R (0 at the terminal goal)
    r = mdp.R * (~mdp.terminal)[:, None]
    assert torch.allclose(adv[-1], r - (pi * r).sum(-1, keepdim=True))
    # sum_a pi A_t = 0 at every t
    assert torch.allclose((pi[None] * adv).sum(-1), torch.zeros(400, 9, dtype=torch.float64),
                          atol=1e-12)


def test_deterministic_chain_by_hand():
    # corridor S . G, gamma 0.5, uniform over (left, down, right, up); from the cell next to G
    # with 1 turn left: Q(right) = 1, others 0 -> V = 0.25, A(right) = 0.75, A(left) = -0.25
    mdp = T.gridworld(["S.G"], gamma=0.5)
    pi = dp.uniform_policy(mdp)
    adv, val = dp.finite_horizon_advantages(mdp, pi, 2)
    assert val[1, 1].item() == pytest.approx(0.25)
    assert adv[1, 1].tolist() == pytest.approx([-0.25, -0.25, 0.75, -0.25])
    # from the start with 2 turns left: only 'right' then 'right' pays gamma * 1
    # Q(right) = 0.5 * V_1(cell 1) = 0.125, Q(other) = 0.5 * V_1(cell 0) = 0
    assert adv[0, 0].tolist() == pytest.approx([-0.03125, -0.03125, 0.09375, -0.03125])
    d = dp.alive_distribution(mdp, pi, 2)
    assert d[0].tolist() == [1.0, 0.0, 0.0] and d[1].tolist() == [0.75, 0.25, 0.0]


def test_pg_direction_by_hand_and_against_sampling():
    probs = np.array([[0.5, 0.5], [0.25, 0.75]])
    # one turn in row 0 taking action 1 with A = 2: 2 * ([0, 1] - [0.5, 0.5]); episodes = 2
    g = arena.pg_direction([0], [1], [2.0], probs, 2, 2)
    assert g.tolist() == [[-0.5, 0.5], [0.0, 0.0]]
    # the exact direction is the mean of the sampled one when A_t is exact
    mdp = T.gridworld(["S.", ".G"], slip=0.1, gamma=0.9)
    pi = torch.softmax(torch.tensor([[0.3, 1.0, 0.2, -0.5]] * 4, dtype=torch.float64), -1)
    H = 3
    adv, _ = dp.finite_horizon_advantages(mdp, pi, H)
    rng = np.random.default_rng(0)
    rows, acts, advs, n = [], [], [], 6000
    for _ in range(n):
        s, _ = mdp.reset(seed=int(rng.integers(1 << 30)))
        for t in range(H):
            a = int(rng.choice(4, p=pi[s].numpy()))
            rows.append(s), acts.append(a), advs.append(adv[t, s, a].item())
            s, _, term, _, _ = mdp.step(a)
            if term:
                break
    g_hat = arena.pg_direction(rows, acts, advs, pi.numpy(), 4, n)
    g = dp.exact_pg_direction(mdp, pi, H).numpy()
    assert arena.cosine(g_hat, g) > 0.98
    assert np.abs(g_hat - g).max() < 0.02


def test_relative_variance_and_cosine():
    assert arena.relative_variance([[1.0, 0.0], [3.0, 0.0]]) == pytest.approx(0.5)
    # invariant to a global scale
    g = np.random.default_rng(0).normal(size=(5, 3)) + 1.0
    assert arena.relative_variance(7 * g) == pytest.approx(arena.relative_variance(g))
    assert arena.relative_variance([[1.0, -1.0], [-1.0, 1.0]]) == math.inf
    assert arena.cosine([1, 0], [0, 2]) == 0.0 and arena.cosine([1, 1], [2, 2]) == pytest.approx(1)
    assert math.isnan(arena.cosine([0, 0], [1, 1]))


def test_finite_horizon_advantages_per_turn_policy():
    # corridor S.G, gamma 0.5, 2 turns: at turn 0 the policy goes right for sure, at turn 1 it is
    # uniform. From the middle cell at turn 1: Q(right) = 1, others 0, V = 1/4. From the start at
    # turn 0 with 'right' for sure: V_0 = 0.5 * V_1(middle) = 1/8.
    mdp = T.gridworld(["S.G"], gamma=0.5)
    right = T.GRID_ACTIONS.index("right")
    pi = torch.full((2, 3, 4), 0.25, dtype=torch.float64)
    pi[0] = 0.0
    pi[0, :, right] = 1.0
    adv, val = dp.finite_horizon_advantages(mdp, pi, 2)
    assert val[1, 1].item() == 0.25 and val[0, 0].item() == 0.125
    assert adv[1, 1].tolist() == [-0.25, -0.25, 0.75, -0.25]
    assert adv[0, 0, right].item() == 0.0  # the action the policy takes for sure
    # a per-turn policy equal at every turn is the stationary one
    u = dp.uniform_policy(mdp)
    a1, v1 = dp.finite_horizon_advantages(mdp, u, 3)
    a3, v3 = dp.finite_horizon_advantages(mdp, u.expand(3, -1, -1), 3)
    assert torch.equal(a1, a3) and torch.equal(v1, v3)
    with pytest.raises(ValueError, match="rows"):
        dp.finite_horizon_advantages(mdp, pi, 3)


def test_lm_action_probs_against_token_by_token():
    from agentrl_lib.models.tiny_lm import new_model
    from agentrl_lib.rollout import prompt_text, token_ids

    torch.manual_seed(0)
    model, tok = new_model("tiny-64", seed=0)
    model.eval()
    actions = ["up", "down", "left"]
    contexts = [token_ids(tok, prompt_text(tok, o, "sys")) for o in ["At (0,0).", "At (2,1). Go", "x"]]
    probs, mass = arena.lm_action_probs(model, tok, contexts, actions, batch_size=2)  # 2 chunks
    assert probs.shape == (3, 3) and np.allclose(probs.sum(-1), 1.0)
    for i, ctx in enumerate(contexts):  # the product of next-token probabilities, one at a time
        p = []
        for a in actions:
            ids, lp = list(ctx), 0.0
            for t in token_ids(tok, a) + [tok.eos_token_id]:
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                lp += torch.log_softmax(logits.double(), -1)[t].item()
                ids.append(t)
            p.append(math.exp(lp))
        assert mass[i] == pytest.approx(sum(p), rel=1e-4)
        assert probs[i] == pytest.approx(np.array(p) / sum(p), rel=1e-4)
