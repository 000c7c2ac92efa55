"""Tabular MDPs and oracles: hand-computed values and independent routes to the same number."""

import math

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import dp
from agentrl_lib.envs import tabular as T


def test_corridor_values_by_hand():
    m = T.gridworld(["S.G"], gamma=0.9)
    v, pi, _, _ = dp.value_iteration(m)
    assert torch.allclose(v, torch.tensor([0.9, 1.0, 0.0], dtype=torch.float64))
    assert pi[0].argmax() == 2 and pi[1].argmax() == 2  # both go right
    q = dp.q_values(m, pi)
    assert math.isclose(q[0, 0].item(), 0.9 * 0.9)  # bump the wall, then act optimally


def test_slip_probabilities():
    m = T.gridworld(["...", ".S.", "..."], slip=0.2)
    s = 4  # centre; action right (2) -> right 0.8, up/down 0.1 each
    row = m.P[s, 2]
    assert math.isclose(row[5].item(), 0.8) and math.isclose(row[1].item(), 0.1)
    assert math.isclose(row[7].item(), 0.1)
    assert torch.allclose(m.P.sum(-1), torch.ones(9, 4, dtype=torch.float64))


def test_bad_layouts():
    with pytest.raises(ValueError, match="start cell"):
        T.gridworld(["..G"])
    with pytest.raises(ValueError, match="unknown layout character 'x'"):
        T.gridworld(["Sx"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vi_pi_linear_solve_agree(seed):
    m = T.random_mdp(12, 3, gamma=0.9, seed=seed)
    v_vi, pi_vi, _, _ = dp.value_iteration(m, tol=1e-12)
    v_pi, pi_pi, _ = dp.policy_iteration(m)
    assert torch.allclose(v_vi, v_pi, atol=1e-9)
    assert torch.allclose(dp.policy_evaluation(m, pi_vi), v_vi, atol=1e-9)
    adv = dp.advantages(m, pi_vi)
    assert adv.max().item() < 1e-9 and torch.allclose(adv.max(-1).values, torch.zeros(12, dtype=torch.float64), atol=1e-9)


def test_policy_evaluation_matches_monte_carlo():
    m = T.gridworld(["S..", ".H.", "..G"], slip=0.2, gamma=0.9, step_reward=-0.05)
    pi = dp.uniform_policy(m)
    exact = (m.init @ dp.policy_evaluation(m, pi)).item()
    rng = np.random.default_rng(0)
    rets = []
    for ep in range(3000):
        s, _ = m.reset(seed=ep)
        g, disc, done = 0.0, 1.0, False
        while not done:
            s, r, term, trunc, _ = m.step(int(rng.integers(4)))
            g += disc * r
            disc *= m.gamma
            done = term or trunc
        rets.append(g)
    se = np.std(rets) / np.sqrt(len(rets))
    # max_steps=100 truncation changes the value by at most 0.9^100 * 0.5 ~ 1e-5
    assert abs(np.mean(rets) - exact) < 4 * se


def test_exact_policy_gradient_matches_finite_differences():
    m = T.random_mdp(5, 3, gamma=0.8, seed=3)
    logits = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    dp.expected_return(m, torch.softmax(logits, -1)).backward()
    eps, fd = 1e-6, torch.zeros(5, 3, dtype=torch.float64)
    with torch.no_grad():
        for i in range(5):
            for j in range(3):
                d = torch.zeros(5, 3, dtype=torch.float64)
                d[i, j] = eps
                fd[i, j] = (dp.expected_return(m, torch.softmax(logits + d, -1))
                            - dp.expected_return(m, torch.softmax(logits - d, -1))) / (2 * eps)
    assert torch.allclose(logits.grad, fd, atol=1e-7)


def test_visit_distribution_by_hand():
    # "S.G": at S right w.p. 1/2 (else up: bump, stay); at the middle right or left w.p. 1/2.
    # Expected steps: n_M = n_S / 2, n_S = 1 + n_S / 2 + n_M / 2, so n_S = 4, n_M = 2.
    m = T.gridworld(["S.G"])
    UP, RIGHT, LEFT = 3, 2, 0
    assert m.P[0, RIGHT, 1] == 1 and m.P[1, LEFT, 0] == 1 and m.P[0, UP, 0] == 1
    pi = torch.zeros(3, 4, dtype=torch.float64)
    pi[0, RIGHT] = pi[0, UP] = 0.5
    pi[1, RIGHT] = pi[1, LEFT] = 0.5
    pi[2, 0] = 1.0
    rho = dp.visit_distribution(m, pi)
    assert torch.allclose(rho, torch.tensor([2 / 3, 1 / 3, 0.0], dtype=torch.float64))


def test_softmax_entropy_grad_by_hand_and_autograd():
    # two actions, pi = (1/4, 3/4): dH/dtheta_0 = p (1 - p) log((1 - p) / p) = 3/16 log 3
    g = dp.softmax_entropy_grad(torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64),
                                torch.tensor([2.0], dtype=torch.float64))
    assert abs(g[0, 0].item() - 2 * 3 / 16 * math.log(3.0)) < 1e-12
    assert abs(g[0, 1].item() + 2 * 3 / 16 * math.log(3.0)) < 1e-12
    theta = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.tensor([0.1, 0.5, 0.0, 0.4], dtype=torch.float64)
    logp = torch.log_softmax(theta, -1)
    ent = -(logp.exp() * logp).sum(-1)
    auto, = torch.autograd.grad((w * ent).sum(), theta)
    assert torch.allclose(dp.softmax_entropy_grad(theta.detach(), w), auto, atol=1e-12)


def test_from_gymnasium_values():
    # non-slippery 4x4 FrozenLake: the shortest safe path takes 6 moves, reward 1 at the 6th
    lake = T.from_gymnasium("FrozenLake-v1", gamma=0.9, is_slippery=False)
    v, _, _, _ = dp.value_iteration(lake)
    assert math.isclose((lake.init @ v).item(), 0.9**5, rel_tol=1e-9)
    cliff = T.from_gymnasium("CliffWalking-v1", gamma=1.0)
    v, pi, _, _ = dp.value_iteration(cliff)
    assert (cliff.init @ v).item() == -13.0  # 13 steps of -1 along the cliff edge
    with pytest.raises(ValueError, match="transition table"):
        T.from_gymnasium("CartPole-v1")


def _greedy_return_in_env(env, start: int, pi_star, gamma: float, max_steps: int = 500) -> float:
    """Discounted return of the tabular greedy policy played in the gymnasium env itself from
    ``start`` (the deterministic toy-text envs: one rollout is the exact value)."""
    env.reset(seed=0)
    env.unwrapped.s = start
    total, discount, s = 0.0, 1.0, start
    for _ in range(max_steps):
        s, r, term, _, _ = env.unwrapped.step(int(pi_star[s].argmax()))
        total += discount * r
        discount *= gamma
        if term:
            break
    return total


@pytest.mark.parametrize("name,kw", [("Taxi-v4", {}), ("CliffWalking-v1", {}),
                                     ("FrozenLake-v1", {"is_slippery": False})])
def test_from_gymnasium_terminality_follows_the_env(name, kw):
    """Termination is a property of a transition: every (s, a) of the tabular form ends or goes on
    exactly as the env's table says, and V*(s) equals the greedy policy's return played in the env,
    from every state (also those the start distribution never reaches)."""
    import gymnasium as gym

    gamma = 0.9
    env = gym.make(name, **kw)
    P = env.unwrapped.P
    S = env.observation_space.n
    m = T.from_gymnasium(env, gamma=gamma)
    for s in np.flatnonzero(~m.terminal[:S].numpy()):  # a terminal state is absorbing: its own
        for a in range(env.action_space.n):        # row in P is never used by the env's episode
            for prob, s2, r, term in P[s][a]:
                target = s2 if not term or m.terminal[s2] else S  # S: the added absorbing state
                assert m.P[s, a, target] >= prob - 1e-12
                assert bool(m.terminal[target]) == bool(term)
    v, pi, _, _ = dp.value_iteration(m, tol=1e-12)
    for s in np.flatnonzero(~m.terminal[:S].numpy()):
        assert _greedy_return_in_env(env, int(s), pi, gamma) == pytest.approx(v[s].item(), abs=1e-8)
    if name == "Taxi-v4":
        # the drop-off cell with the passenger at its destination is also entered by a move, so it
        # is not terminal; the drop-off itself ends the episode through the added state
        assert m.num_states == S + 1 and m.terminal.sum() == 1 and m.terminal[S]
        dest_states = [s for s in range(S) if (lambda d: d[2] == d[3] and (d[0], d[1]) ==
                       env.unwrapped.locs[d[3]])(list(env.unwrapped.decode(s)))]
        assert len(dest_states) == 4 and not any(m.terminal[s] for s in dest_states)
        assert m.init[S] == 0 and abs(m.init.sum().item() - 1) < 1e-12
    else:
        assert m.num_states == S  # every terminating transition enters a state that always ends


def test_sampled_rewards_follow_source_env():
    lake = T.from_gymnasium("FrozenLake-v1", gamma=0.99, is_slippery=False)
    s, _ = lake.reset(seed=0)
    total = 0.0
    for a in [1, 1, 2, 1, 2, 2]:  # down, down, right, down, right, right: the safe path
        s, r, term, _, _ = lake.step(a)
        total += r
    assert term and total == 1.0 and s == 15


def test_chain_critical_gamma():
    n, small, big = 6, 0.2, 1.0
    g_c = (small / big) ** (1 / (n - 1))
    below = dp.value_iteration(T.chain_mdp(n, small, big, gamma=g_c - 0.01), tol=1e-12)[1]
    above = dp.value_iteration(T.chain_mdp(n, small, big, gamma=g_c + 0.01), tol=1e-12)[1]
    assert below[0].argmax() == 0 and above[0].argmax() == 1


def test_step_errors():
    m = T.chain_mdp(3)
    with pytest.raises(RuntimeError, match="reset"):
        m.step(0)
    m.reset(seed=0)
    with pytest.raises(ValueError, match="out of range"):
        m.step(5)


def test_optimal_q_equals_value_iteration():
    """The envs' oracle (``TabularMDP.optimal_q``) agrees with the teaching solver in ``dp``."""
    from agentrl_lib.algorithms.dp import q_from_v, value_iteration
    from agentrl_lib.envs.tabular import chain_mdp, gridworld, random_mdp

    for mdp in (random_mdp(12, 3, gamma=0.9, seed=3), chain_mdp(8), gridworld(["S..", ".#.", "..G"])):
        v, _, _, _ = value_iteration(mdp)
        assert torch.allclose(mdp.optimal_q(), q_from_v(mdp, v), atol=1e-8)


def test_thresholded_random_mdp_by_hand():
    # one row of logits (2, 0.5, 1.5) with threshold 1: 0.5 becomes -20, so the probabilities are
    # e^2 / Z, e^-20 / Z, e^1.5 / Z with Z = e^2 + e^-20 + e^1.5
    P = T.thresholded_softmax(np.array([[2.0, 0.5, 1.5]]), 1.0)
    Z = math.exp(2) + math.exp(-20) + math.exp(1.5)
    want = [math.exp(2) / Z, math.exp(-20) / Z, math.exp(1.5) / Z]
    assert np.allclose(P[0], want, rtol=1e-12, atol=0)
    assert [T.random_env_threshold(n) for n in (32, 64, 128)] == [1.0, 1.5, 1.8]
    # the builder is that softmax of its seed's Gaussians, uniform start, nothing terminal
    m = T.thresholded_random_mdp(5, 2, gamma=0.95, seed=3)
    z = np.random.default_rng(3).normal(size=(5, 2, 5))
    assert np.allclose(m.P.numpy(), T.thresholded_softmax(z, 1.0))
    kept = z > 1.0
    some = kept.any(-1)  # rows where a logit passed; a row where none did is uniform
    assert some.any() and not some.all()  # seed 3 has both kinds
    assert np.all(m.P.numpy()[~kept & some[..., None]] < 1e-8)
    assert np.all(m.P.numpy()[kept] > 1e-3)
    assert np.allclose(m.P.numpy()[~some], 0.2)
    assert torch.allclose(m.init, torch.full((5,), 0.2, dtype=torch.float64))
    assert not m.terminal.any() and m.gamma == 0.95
