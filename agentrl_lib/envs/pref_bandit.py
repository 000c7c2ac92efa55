"""A response bandit with a general preference matrix: the table level of preference learning.

One prompt, K candidate responses, and a labeller described by a K x K matrix
``P[i, j] = Pr(i preferred to j)`` with ``P + P.T = 1`` and ``P[i, i] = 1/2``. Nothing requires
P to come from scores: Bradley-Terry (``transitive``) is the special case
``P[i, j] = sigmoid(u_i - u_j)``; ``rock_paper_scissors`` is the classic intransitive cycle, where
no reward explains the labels; ``noisy`` mixes in a random labeller; ``confounded`` makes the
labeller prefer a hidden attribute (quality) that is correlated with response length, the
verbosity confound.

The solution concept for a general P is the *Minimax Winner* (von Neumann winner): the
symmetric Nash equilibrium ``pi*`` of the zero-sum game with payoff ``P - 1/2``. No response beats
it more than half the time, ``max_j (P @ pi*)[j] <= 1/2``. ``minimax_winner`` computes it by linear
programming; ``exploitability`` measures how far a policy is from it.
"""

from __future__ import annotations

import numpy as np

_TOL = 1e-8


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _check_P(P) -> np.ndarray:
    P = np.asarray(P, dtype=np.float64)
    if P.ndim != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"P must be a square (K, K) matrix, got shape {P.shape}")
    if np.any(P < -_TOL) or np.any(P > 1 + _TOL):
        raise ValueError("P must hold probabilities in [0, 1]")
    if not np.allclose(np.diag(P), 0.5, atol=1e-6):
        raise ValueError("P must have 1/2 on its diagonal")
    if not np.allclose(P + P.T, 1.0, atol=1e-6):
        raise ValueError("P must satisfy P + P.T = 1 (Pr(i over j) + Pr(j over i) = 1)")
    return np.clip(P, 0.0, 1.0)


class PrefBandit:
    """A response bandit with a general preference matrix P (K x K): P[i, j] = Pr(i preferred to j),
    P + P.T = 1, diag 1/2. Optional per-response ``features`` (K, d), ``lengths`` (K,), ``names``,
    and ``hidden`` (K,), the attribute the labeller really scores (``confounded``)."""

    def __init__(self, P, features=None, lengths=None, names=None, hidden=None):
        self.P = _check_P(P)  # (K, K)
        K = self.P.shape[0]
        self.features = None if features is None else np.asarray(features, dtype=np.float64)
        if self.features is not None and (self.features.ndim != 2 or self.features.shape[0] != K):
            raise ValueError(f"features must be (K, d) with K={K}, got {self.features.shape}")
        self.lengths = None if lengths is None else np.asarray(lengths)
        if self.lengths is not None and self.lengths.shape != (K,):
            raise ValueError(f"lengths must be (K,) with K={K}, got {self.lengths.shape}")
        self.names = list(names) if names is not None else [f"y{i}" for i in range(K)]
        if len(self.names) != K:
            raise ValueError(f"names must have K={K} entries, got {len(self.names)}")
        self.hidden = None if hidden is None else np.asarray(hidden, dtype=np.float64)

    @property
    def K(self) -> int:
        return self.P.shape[0]

    def __repr__(self):
        return f"PrefBandit(K={self.K}, names={self.names})"

    # --- sampling and exact win rates ---------------------------------------------------------
    def compare(self, i, j, rng, n: int | None = None) -> np.ndarray:
        """Sampled labels: 1.0 where response i beats response j, Bernoulli(P[i, j]).

        i, j: ints or (N,) integer arrays (broadcast); ``n`` repeats a single pair n times.
        Returns (N,) floats."""
        i, j = np.broadcast_arrays(np.atleast_1d(np.asarray(i)), np.atleast_1d(np.asarray(j)))
        if n is not None:
            if i.size != 1:
                raise ValueError("n repeats a single pair; pass i, j as arrays instead")
            i, j = np.full(n, i.item()), np.full(n, j.item())
        if np.any((i < 0) | (i >= self.K) | (j < 0) | (j >= self.K)):
            raise ValueError(f"response indices must lie in [0, {self.K})")
        p = self.P[i, j]  # (N,)
        return (rng.random(p.shape) < p).astype(np.float64)

    def win_rate(self, pi, j=None):
        """``(P @ pi)[k]``: Pr(response k beats a response drawn from pi), all k (K,) or one k=j."""
        pi = np.asarray(pi, dtype=np.float64)
        w = self.P @ pi  # (K,)
        return w if j is None else float(w[j])

    def preference(self, pi, rho) -> float:
        """``pi^T P rho``: Pr(a draw from pi beats a draw from rho)."""
        return float(np.asarray(pi, np.float64) @ self.P @ np.asarray(rho, np.float64))

    # --- builders -----------------------------------------------------------------------------
    @classmethod
    def transitive(cls, utilities, temperature: float = 1.0, **kwargs) -> "PrefBandit":
        """Bradley-Terry: ``P[i, j] = sigmoid((u_i - u_j) / temperature)``."""
        u = np.asarray(utilities, dtype=np.float64)
        P = _sigmoid((u[:, None] - u[None, :]) / temperature)  # (K, K)
        return cls(P, **kwargs)

    @classmethod
    def rock_paper_scissors(cls, margins=(1.0, 1.0, 1.0), num_dominated: int = 0,
                            dominated_margin: float = 0.5, **kwargs) -> "PrefBandit":
        """The intransitive cycle 0 beats 1 beats 2 beats 0, plus optional dominated arms.

        ``P[0, 1] = (1 + m_0) / 2``, ``P[1, 2] = (1 + m_1) / 2``, ``P[2, 0] = (1 + m_2) / 2``, with
        margins m in (0, 1]. Its Minimax Winner is ``pi* ∝ (m_1, m_2, m_0)`` (uniform when the
        margins are equal): solve ``(P - 1/2) pi = 0``. Each of the ``num_dominated`` extra arms
        loses to each cycle arm with probability ``(1 + dominated_margin) / 2`` and ties the other
        extra arms, so pi* puts no mass on them."""
        m = np.asarray(margins, dtype=np.float64)
        if m.shape != (3,) or np.any(m <= 0) or np.any(m > 1):
            raise ValueError("margins must be three numbers in (0, 1]")
        if not 0 < dominated_margin <= 1:
            raise ValueError("dominated_margin must lie in (0, 1]")
        K = 3 + int(num_dominated)
        P = np.full((K, K), 0.5)
        for a, b, mk in ((0, 1, m[0]), (1, 2, m[1]), (2, 0, m[2])):
            P[a, b], P[b, a] = (1 + mk) / 2, (1 - mk) / 2
        P[:3, 3:] = (1 + dominated_margin) / 2
        P[3:, :3] = (1 - dominated_margin) / 2
        names = kwargs.pop("names", None) or (["rock", "paper", "scissors"] +
                                              [f"dominated{k}" for k in range(K - 3)])
        return cls(P, names=names, **kwargs)

    @classmethod
    def noisy(cls, base, noise: float, rng=None, perturb: float = 0.0) -> "PrefBandit":
        """A noisier labeller: with probability ``noise`` it flips a fair coin,
        ``P' = (1 - noise) P + noise / 2`` (the Minimax Winner is unchanged: the game is only
        scaled), then, if ``perturb > 0``, an antisymmetric Gaussian perturbation of scale
        ``perturb`` drawn from ``rng`` is added and P' clipped back to [0, 1] (this one can move
        the Minimax Winner). ``base`` is a PrefBandit or a P matrix; its metadata is kept."""
        if not 0 <= noise <= 1:
            raise ValueError("noise must lie in [0, 1]")
        src = base if isinstance(base, PrefBandit) else cls(base)
        P = (1 - noise) * src.P + noise / 2
        if perturb > 0:
            if rng is None:
                raise ValueError("perturb > 0 needs an rng")
            E = rng.normal(0.0, perturb, size=P.shape)
            E = np.triu(E, 1)
            P = np.clip(P + E - E.T, 0.0, 1.0)
        return cls(P, features=src.features, lengths=src.lengths, names=src.names,
                   hidden=src.hidden)

    @classmethod
    def confounded(cls, K: int = 8, corr: float = 0.8, length_bias: float = 0.0,
                   scale: float = 2.0, num_features: int = 4, mean_length: float = 60.0,
                   length_sd: float = 20.0, rng=None) -> "PrefBandit":
        """The verbosity confound: the labeller scores a hidden attribute q (quality), and length
        is correlated with q, so a learner that sees lengths can "explain" the labels by length.

        q ~ N(0, 1) standardised (K,); z = corr q + sqrt(1 - corr^2) e, standardised (K,) is the
        standardised length; ``lengths = max(1, round(mean_length + length_sd z))``.
        The labeller is Bradley-Terry on ``u = scale q + length_bias z`` (``length_bias = 0``: length
        itself is irrelevant, only correlated). ``features`` (K, num_features): column 0 = z
        (length), column 1 = q (the hidden attribute, e.g. what a rationale reveals), the rest
        nuisance N(0, 1). ``hidden`` = q."""
        if not -1 <= corr <= 1:
            raise ValueError("corr must lie in [-1, 1]")
        if num_features < 2:
            raise ValueError("num_features must be >= 2 (length and the hidden attribute)")
        rng = np.random.default_rng(0) if rng is None else rng

        def standardise(x):
            return (x - x.mean()) / (x.std() + 1e-12)

        q = standardise(rng.normal(size=K))
        z = standardise(corr * q + np.sqrt(max(0.0, 1 - corr ** 2)) * rng.normal(size=K))
        lengths = np.maximum(1, np.round(mean_length + length_sd * z)).astype(int)
        feats = np.concatenate([z[:, None], q[:, None], rng.normal(size=(K, num_features - 2))], 1)
        bandit = cls.transitive(scale * q + length_bias * z, features=feats, lengths=lengths,
                                hidden=q)
        return bandit


# --- the Minimax Winner --------------------------------------------------------------------------
def minimax_winner(P) -> np.ndarray:
    """The Minimax Winner: the symmetric Nash equilibrium of the zero-sum game ``P - 1/2``,
    by linear programming (scipy.optimize.linprog):

        max_{pi, v}  v   s.t.   (P^T pi)[j] >= v for every j,   sum(pi) = 1,   pi >= 0,

    i.e. pi's worst-case win rate against any single response is as large as possible (it is
    exactly 1/2 at the optimum, since the game is symmetric). Returns pi (K,)."""
    from scipy.optimize import linprog

    P = _check_P(P.P if isinstance(P, PrefBandit) else P)
    K = P.shape[0]
    c = np.zeros(K + 1)
    c[-1] = -1.0  # minimise -v
    A_ub = np.concatenate([-P.T, np.ones((K, 1))], axis=1)  # v - (P^T pi)_j <= 0
    b_ub = np.zeros(K)
    A_eq = np.concatenate([np.ones((1, K)), np.zeros((1, 1))], axis=1)
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=[1.0],
                  bounds=[(0, None)] * K + [(None, None)], method="highs")
    if not res.success:
        raise RuntimeError(f"linprog failed: {res.message}")
    pi = np.clip(res.x[:K], 0.0, None)
    return pi / pi.sum()


def exploitability(pi, P) -> float:
    """``max_j (P @ pi)[j] - 1/2``: how much the best single response beats pi. >= 0, and 0
    exactly at a Minimax Winner."""
    P = P.P if isinstance(P, PrefBandit) else np.asarray(P, dtype=np.float64)
    return float(np.max(P @ np.asarray(pi, dtype=np.float64)) - 0.5)


def total_variation(pi, rho) -> float:
    """``1/2 sum_k |pi_k - rho_k|``."""
    return float(0.5 * np.abs(np.asarray(pi, np.float64) - np.asarray(rho, np.float64)).sum())
