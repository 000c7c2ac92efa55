"""PrefBandit, the Minimax Winner by LP and exploitability, against hand-computed numbers and a
brute-force grid."""

import itertools

import numpy as np
import pytest

from agentrl_lib.envs.pref_bandit import (PrefBandit, exploitability, minimax_winner,
                                          total_variation)


def test_rps_matrix_by_hand():
    b = PrefBandit.rock_paper_scissors()
    # the cycle 0 beats 1 beats 2 beats 0; margin 1 -> certain wins
    assert np.allclose(b.P, [[0.5, 1.0, 0.0], [0.0, 0.5, 1.0], [1.0, 0.0, 0.5]])
    assert b.K == 3 and b.names == ["rock", "paper", "scissors"]


def test_rps_minimax_winner_is_uniform_with_zero_exploitability():
    b = PrefBandit.rock_paper_scissors()
    pi = minimax_winner(b.P)
    assert np.allclose(pi, [1 / 3] * 3, atol=1e-7)
    assert exploitability(pi, b.P) == pytest.approx(0.0, abs=1e-7)


def test_rps_exploitability_by_hand():
    P = PrefBandit.rock_paper_scissors().P
    # pure rock: scissors (arm 2) beats it surely -> 1 - 1/2
    assert exploitability([1, 0, 0], P) == pytest.approx(0.5)
    # (1/2, 1/2, 0): P @ pi = (0.25 + 0.5, 0 + 0.25, 0.5 + 0) -> max 0.75 -> 0.25
    assert exploitability([0.5, 0.5, 0], P) == pytest.approx(0.25)
    # margins 0.5: pure rock is beaten by scissors with probability 0.75 -> 0.25
    P2 = PrefBandit.rock_paper_scissors(margins=(0.5, 0.5, 0.5)).P
    assert exploitability([1, 0, 0], P2) == pytest.approx(0.25)


def test_unequal_rps_minimax_winner_by_hand():
    # margins m = (0.2, 0.4, 0.6): pi* ∝ (m1, m2, m0) = (0.4, 0.6, 0.2) -> (1/3, 1/2, 1/6)
    b = PrefBandit.rock_paper_scissors(margins=(0.2, 0.4, 0.6))
    pi = minimax_winner(b)
    assert np.allclose(pi, [1 / 3, 1 / 2, 1 / 6], atol=1e-7)
    assert np.allclose(b.win_rate(pi), 0.5, atol=1e-7)  # every response ties pi*


def test_dominated_arms_get_no_mass():
    b = PrefBandit.rock_paper_scissors(num_dominated=2, dominated_margin=0.4)
    assert b.K == 5 and b.P[0, 3] == pytest.approx(0.7) and b.P[4, 2] == pytest.approx(0.3)
    pi = minimax_winner(b.P)
    assert np.allclose(pi, [1 / 3, 1 / 3, 1 / 3, 0, 0], atol=1e-7)
    # a dominated arm against the uniform over the cycle wins 0.3
    assert b.win_rate(pi, 3) == pytest.approx(0.3)


def test_transitive_minimax_winner_is_top_arm():
    b = PrefBandit.transitive([0.0, 1.0, 0.3, -2.0])
    assert b.P[1, 0] == pytest.approx(1 / (1 + np.exp(-1.0)))
    assert np.allclose(minimax_winner(b.P), [0, 1, 0, 0], atol=1e-7)
    assert exploitability([0, 1, 0, 0], b.P) == pytest.approx(0.0, abs=1e-12)
    # uniform: the top arm beats it by mean_j sigmoid(1 - u_j) - 1/2
    u = np.array([0.0, 1.0, 0.3, -2.0])
    top = np.mean(1 / (1 + np.exp(-(1.0 - u))))
    assert exploitability(np.full(4, 0.25), b.P) == pytest.approx(top - 0.5)


def _random_P(rng, K):
    A = np.triu(rng.uniform(0, 1, (K, K)), 1)
    return np.where(np.triu(np.ones((K, K)), 1) > 0, A, 0) + np.tril(1 - A.T, -1) + 0.5 * np.eye(K)


def test_lp_matches_brute_force_grid_on_k3():
    rng = np.random.default_rng(0)
    step = 1 / 200
    grid = np.array([(a, b, 1 - a - b) for a, b in itertools.product(np.arange(0, 1 + 1e-9, step),
                                                                    repeat=2) if a + b <= 1 + 1e-9])
    grid = np.clip(grid, 0, 1)
    for _ in range(5):
        P = _random_P(rng, 3)
        pi = minimax_winner(P)
        expl_grid = (grid @ P.T).max(1) - 0.5  # exploitability of every grid point
        best = grid[np.argmin(expl_grid)]
        assert exploitability(pi, P) <= expl_grid.min() + 1e-9
        assert exploitability(pi, P) == pytest.approx(0.0, abs=1e-7)
        assert total_variation(pi, best) < 0.02


def test_minimax_winner_value_is_half_on_random_games():
    rng = np.random.default_rng(1)
    for K in (4, 7):
        P = _random_P(rng, K)
        pi = minimax_winner(P)
        assert pi.min() >= 0 and pi.sum() == pytest.approx(1.0)
        assert (P.T @ pi).min() == pytest.approx(0.5, abs=1e-7)  # pi* wins >= 1/2 vs every arm
        assert exploitability(pi, P) == pytest.approx(0.0, abs=1e-7)


def test_compare_frequencies():
    b = PrefBandit.rock_paper_scissors(margins=(0.5, 0.2, 0.8))
    rng = np.random.default_rng(0)
    n = 20000
    for i, j in [(0, 1), (1, 2), (2, 0), (1, 0), (0, 0)]:
        y = b.compare(i, j, rng, n=n)
        assert y.shape == (n,) and set(np.unique(y)) <= {0.0, 1.0}
        se = np.sqrt(b.P[i, j] * (1 - b.P[i, j]) / n) + 1e-12
        assert abs(y.mean() - b.P[i, j]) < 4 * se + 1e-3
    i = rng.integers(0, 3, size=30000)
    j = rng.integers(0, 3, size=30000)
    y = b.compare(i, j, rng)
    for a in range(3):
        for c in range(3):
            sel = (i == a) & (j == c)
            assert abs(y[sel].mean() - b.P[a, c]) < 0.05
    with pytest.raises(ValueError, match="indices"):
        b.compare(0, 3, rng, n=2)


def test_win_rate_and_preference():
    b = PrefBandit.rock_paper_scissors()
    pi = np.array([0.5, 0.5, 0.0])
    assert np.allclose(b.win_rate(pi), [0.75, 0.25, 0.5])
    assert b.win_rate(pi, 2) == pytest.approx(0.5)
    # pi against itself: 1/2 in any symmetric game
    assert b.preference(pi, pi) == pytest.approx(0.5)
    assert b.preference([0, 1, 0], [1, 0, 0]) == pytest.approx(0.0)


def test_noisy_shrinks_and_keeps_the_winner():
    base = PrefBandit.rock_paper_scissors(margins=(0.2, 0.4, 0.6))
    nb = PrefBandit.noisy(base, noise=0.5)
    assert nb.P[0, 1] == pytest.approx(0.5 * 0.6 + 0.25)
    assert np.allclose(minimax_winner(nb), minimax_winner(base), atol=1e-7)
    assert exploitability([1, 0, 0], nb) == pytest.approx(0.5 * exploitability([1, 0, 0], base))
    pert = PrefBandit.noisy(base, 0.0, rng=np.random.default_rng(0), perturb=0.1)
    assert np.allclose(pert.P + pert.P.T, 1) and not np.allclose(pert.P, base.P)
    with pytest.raises(ValueError, match="rng"):
        PrefBandit.noisy(base, 0.0, perturb=0.1)


def test_confounded_length_correlates_with_hidden_preference():
    b = PrefBandit.confounded(K=12, corr=0.9, rng=np.random.default_rng(0))
    assert b.features.shape == (12, 4) and b.lengths.shape == (12,)
    assert np.allclose(b.features[:, 1], b.hidden)
    assert np.corrcoef(b.lengths, b.hidden)[0, 1] > 0.7
    # the labeller is Bradley-Terry on 2 q (length_bias 0): the top-quality response is the winner
    assert np.argmax(minimax_winner(b)) == np.argmax(b.hidden)
    assert b.P[0, 1] == pytest.approx(1 / (1 + np.exp(-2 * (b.hidden[0] - b.hidden[1]))))
    # corr 0: length carries no information about quality (up to sampling)
    b0 = PrefBandit.confounded(K=2000, corr=0.0, rng=np.random.default_rng(1))
    assert abs(np.corrcoef(b0.features[:, 0], b0.hidden)[0, 1]) < 0.1


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="P \\+ P.T"):
        PrefBandit([[0.5, 0.9], [0.9, 0.5]])
    with pytest.raises(ValueError, match="diagonal"):
        PrefBandit([[0.4, 0.5], [0.5, 0.6]])
    with pytest.raises(ValueError, match="square"):
        PrefBandit(np.full((2, 3), 0.5))
    with pytest.raises(ValueError, match="margins"):
        PrefBandit.rock_paper_scissors(margins=(0.5, 0.0, 1.0))
    with pytest.raises(ValueError, match="features"):
        PrefBandit(np.full((2, 2), 0.5), features=np.zeros((3, 2)))
