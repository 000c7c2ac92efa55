"""Distances between tabular reward functions: EPIC (Gleave et al. 2021), STARC (Skalse et al.
2023) and raw L2 as the baseline. Also DARD (Wulfe et al. 2022), the STARC paper's other baseline.

Rewards are transition rewards R (S, A, S) over (s, a, s'). Two rewards that differ by potential
shaping (``rewards.shaping.pbrs``), by a positive rescaling, or (for STARC) by an
S'-redistribution (a change e(s, a, s') with E_{s'~P(.|s,a)} e = 0) order all policies the same,
so a good distance should call them equal. Both EPIC and STARC first *canonicalise* (remove
shaping), then *normalise* (remove scale), then measure.

EPIC canonicalisation, with state and action distributions D_S, D_A (uniform by default) and
S, S' ~ D_S, A ~ D_A independent:

    C(R)(s, a, s') = R(s, a, s') + E[gamma R(s', A, S') - R(s, A, S') - gamma R(S, A, S')]

and D_EPIC(R1, R2) = sqrt((1 - rho) / 2), rho the Pearson correlation of C(R1) and C(R2) under a
coverage distribution over transitions (uniform over S x A x S by default).

DARD canonicalisation (Wulfe et al. 2022), with the transitions T and A ~ D_A (uniform by default):

    C_T(R)(s, a, s') = R(s, a, s') + E[gamma R(s', A, S'') - R(s, A, S') - gamma R(S', A, S'')],
    S' ~ T(.|s, A), S'' ~ T(.|s', A) (one A for the whole expectation),

as the STARC authors' experiment code computes it in closed form (lucyfarnik/starc @ e13f8fa,
``src/distance/canon/dard.py``, ``dard_canon``). It removes shaping exactly (the Phi terms cancel
in expectation) but not S'-redistribution: its last term reads R on (S', A, S'') with S'' drawn
from s', not from S'. The STARC code compares DARD-canonical rewards as STARC does (L2-normalise,
then the L2 distance: ``distance_funcs.dard``); ``dard_distance`` is the DARD paper's Pearson form.

STARC: d(R1, R2) = m(s(R1), s(R2)) with s(R) = c(R) / n(c(R)) (0 when n(c(R)) = 0), c a
canonicalisation, n a norm, m a metric. Here c is ``"epic"`` (the EPIC canonicalisation) or
``"val"`` (value-adjusted levelling, Skalse et al.: with the value V^pi of a fixed policy pi under R,

    c(R)(s, a, s') = E_{S'~P(.|s,a)}[R(s, a, S') - V^pi(s) + gamma V^pi(S')] = Q^pi(s, a) - V^pi(s),

which also removes S'-redistribution); n is the L2 norm (``"l2"``) or L1 (``"l1"``); m is
half the L2 distance, so d is in [0, 1] (our convention: then STARC with the EPIC
canonicalisation and L2 equals EPIC under uniform distributions, since C(R) has mean 0 there).

Pure functions of arrays (pass the transitions P and gamma in): nothing from envs or models.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor
DTYPE = torch.float64
CANONICALISATIONS = ("epic", "dard", "val", "none")
NORMS = ("l2", "l1")


def _reward(R, name: str = "R") -> Tensor:
    R = torch.as_tensor(R, dtype=DTYPE)
    if R.dim() != 3 or R.shape[0] != R.shape[2]:
        raise ValueError(f"{name} must be a transition reward (S, A, S), got shape {tuple(R.shape)}")
    return R


def _dist(d, n: int, name: str) -> Tensor:
    if d is None:
        return torch.full((n,), 1.0 / n, dtype=DTYPE)
    d = torch.as_tensor(d, dtype=DTYPE)
    if d.shape != (n,) or (d < 0).any() or abs(d.sum().item() - 1.0) > 1e-8:
        raise ValueError(f"{name} must be a probability vector of length {n}")
    return d


def epic_canonicalize(R, gamma: float, d_s=None, d_a=None) -> Tensor:
    """C(R)(s, a, s') = R(s, a, s') + gamma m(s') - m(s) - gamma E_{D_S}[m], with
    m(x) = E_{A~D_A, S'~D_S}[R(x, A, S')]. R: (S, A, S) -> (S, A, S).

    C(R) is R shaped with the potential psi = m + gamma E[m] / (1 - gamma), and
    C(R + gamma phi(s') - phi(s)) = C(R) for every phi."""
    R = _reward(R)
    S, A, _ = R.shape
    d_s, d_a = _dist(d_s, S, "d_s"), _dist(d_a, A, "d_a")
    m = torch.einsum("xat,a,t->x", R, d_a, d_s)  # (S,)
    return R + gamma * m[None, None, :] - m[:, None, None] - gamma * (d_s @ m)


def dard_canonicalize(R, P, gamma: float, d_a=None) -> Tensor:
    """C_T(R)(s, a, s') = R(s, a, s') + gamma m(s') - m(s) - gamma E[R(S', A, S'')], with
    m(x) = E_{A~D_A, S'~T(.|x,A)}[R(x, A, S')] and, in the last term, A ~ D_A, S' ~ T(.|s, A),
    S'' ~ T(.|s', A). R, P: (S, A, S) -> (S, A, S); the last term depends on (s, s') only.

    Ported from lucyfarnik/starc @ e13f8fa, ``src/distance/canon/dard.py::dard_canon``."""
    R, P = _reward(R), torch.as_tensor(P, dtype=DTYPE)
    if P.shape != R.shape:
        raise ValueError(f"P {tuple(P.shape)} and R {tuple(R.shape)} must both be (S, A, S)")
    d_a = _dist(d_a, R.shape[1], "d_a")
    m = torch.einsum("xat,xat,a->x", P, R, d_a)  # (S,)
    # E[R(S', A, S'')] for every (s, s'): sum_a D_A(a) T(S'|s, a) T(S''|s', a) R(S', a, S'')
    w = torch.einsum("tay,xay->xat", P, R)  # E_{S''~T(.|t, a)} R(x, a, S''): (S, A, S)
    last = torch.einsum("a,sax,xat->st", d_a, P, w)  # (S, S)
    return R + gamma * m[None, None, :] - m[:, None, None] - gamma * last[:, None, :]


def policy_values(R, P, gamma: float, pi=None) -> tuple[Tensor, Tensor]:
    """(Q^pi (S, A), V^pi (S,)) of pi (uniform by default) under the transition reward R (S, A, S)
    and transitions P (S, A, S), by the linear solve (I - gamma P_pi) V = r_pi."""
    R, P = _reward(R), torch.as_tensor(P, dtype=DTYPE)
    if P.shape != R.shape:
        raise ValueError(f"P {tuple(P.shape)} and R {tuple(R.shape)} must both be (S, A, S)")
    S, A, _ = R.shape
    pi = torch.full((S, A), 1.0 / A, dtype=DTYPE) if pi is None else torch.as_tensor(pi, dtype=DTYPE)
    r = (P * R).sum(-1)  # (S, A)
    P_pi = torch.einsum("sa,sat->st", pi, P)  # (S, S)
    v = torch.linalg.solve(torch.eye(S, dtype=DTYPE) - gamma * P_pi, (pi * r).sum(-1))  # (S,)
    q = r + gamma * torch.einsum("sat,t->sa", P, v)  # (S, A)
    return q, v


def val_canonicalize(R, P, gamma: float, pi=None) -> Tensor:
    """Value-adjusted levelling: c(R)(s, a, s') = Q^pi(s, a) - V^pi(s) for every s' (the
    advantage of pi under R, pi uniform by default). R, P: (S, A, S) -> (S, A, S)."""
    q, v = policy_values(R, P, gamma, pi)
    adv = q - v[:, None]  # (S, A)
    return adv[:, :, None].expand(*adv.shape, adv.shape[0]).clone()


def canonicalize(R, gamma: float, canonicalization: str = "val", P=None, pi=None,
                 d_s=None, d_a=None) -> Tensor:
    """The canonicalisation named by ``canonicalization``: "epic", "dard" (needs P), "val" (needs
    P) or "none"."""
    if canonicalization == "epic":
        return epic_canonicalize(R, gamma, d_s, d_a)
    elif canonicalization == "dard":
        if P is None:
            raise ValueError("the DARD canonicalisation needs the transitions P (S, A, S)")
        return dard_canonicalize(R, P, gamma, d_a)
    elif canonicalization == "val":
        if P is None:
            raise ValueError("value-adjusted levelling needs the transitions P (S, A, S)")
        return val_canonicalize(R, P, gamma, pi)
    elif canonicalization == "none":
        return _reward(R)
    raise ValueError(f"unknown canonicalization {canonicalization!r}; expected one of {CANONICALISATIONS}")


def normalize(R, norm: str = "l2", eps: float = 1e-12) -> tuple[Tensor, Tensor]:
    """(R / n(R), n(R)); the zero reward (n(R) <= eps) maps to 0. n: "l2" or "l1" over all entries."""
    R = torch.as_tensor(R, dtype=DTYPE)
    if norm == "l2":
        n = R.pow(2).sum().sqrt()
    elif norm == "l1":
        n = R.abs().sum()
    else:
        raise ValueError(f"unknown norm {norm!r}; expected one of {NORMS}")
    return (torch.zeros_like(R) if n <= eps else R / n), n


def starc_distance(R1, R2, gamma: float, P=None, canonicalization: str = "val", norm: str = "l2",
                   pi=None, d_s=None, d_a=None) -> tuple[float, dict]:
    """d(R1, R2) = ||s(R1) - s(R2)||_2 / 2 with s(R) = c(R) / n(c(R)). In [0, 1] for n = L2.

    Returns (d, metrics) with the canonical rewards' norms (``norm1``, ``norm2``): a norm of 0
    means the reward is trivial (all policies equally good) under that canonicalisation."""
    c1 = canonicalize(R1, gamma, canonicalization, P, pi, d_s, d_a)
    c2 = canonicalize(R2, gamma, canonicalization, P, pi, d_s, d_a)
    s1, n1 = normalize(c1, norm)
    s2, n2 = normalize(c2, norm)
    d = 0.5 * (s1 - s2).pow(2).sum().sqrt().item()
    return d, {"norm1": n1.item(), "norm2": n2.item()}


def pearson_distance(x, y, weights=None) -> float:
    """D_rho = sqrt((1 - rho) / 2), rho the Pearson correlation of x and y (same shape) under
    ``weights`` (a distribution over entries; uniform by default). A constant x or y has no
    correlation: it raises."""
    x, y = torch.as_tensor(x, dtype=DTYPE).flatten(), torch.as_tensor(y, dtype=DTYPE).flatten()
    if x.shape != y.shape:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)} differ in size")
    w = torch.full_like(x, 1.0 / x.numel()) if weights is None else \
        torch.as_tensor(weights, dtype=DTYPE).flatten() / torch.as_tensor(weights, dtype=DTYPE).sum()
    xc, yc = x - w @ x, y - w @ y
    vx, vy = w @ (xc * xc), w @ (yc * yc)
    if vx <= 1e-24 or vy <= 1e-24:
        raise ValueError("Pearson distance of a constant reward is undefined")
    rho = ((w @ (xc * yc)) / (vx * vy).sqrt()).clamp(-1.0, 1.0)
    return ((1.0 - rho) / 2.0).clamp_min(0.0).sqrt().item()


def epic_distance(R1, R2, gamma: float, coverage=None, d_s=None, d_a=None) -> tuple[float, dict]:
    """D_EPIC = D_rho(C(R1), C(R2)) under ``coverage`` (S, A, S) (uniform by default).
    Returns (d, metrics) with the Pearson correlation ``rho``."""
    c1, c2 = epic_canonicalize(R1, gamma, d_s, d_a), epic_canonicalize(R2, gamma, d_s, d_a)
    d = pearson_distance(c1, c2, coverage)
    return d, {"rho": 1.0 - 2.0 * d * d}


def dard_distance(R1, R2, P, gamma: float, coverage=None, d_a=None) -> tuple[float, dict]:
    """D_DARD = D_rho(C_T(R1), C_T(R2)), the Pearson distance of the DARD-canonical rewards under
    ``coverage`` (S, A, S) (uniform by default), as EPIC's. Returns (d, metrics) with ``rho``.
    (The STARC code instead compares them by ``starc_distance(..., canonicalization="dard")``.)"""
    c1, c2 = dard_canonicalize(R1, P, gamma, d_a), dard_canonicalize(R2, P, gamma, d_a)
    d = pearson_distance(c1, c2, coverage)
    return d, {"rho": 1.0 - 2.0 * d * d}


def l2_distance(R1, R2) -> tuple[float, dict]:
    """||R1 - R2||_2 over all (s, a, s') entries: the raw baseline (sees shaping and scale)."""
    R1, R2 = _reward(R1, "R1"), _reward(R2, "R2")
    if R1.shape != R2.shape:
        raise ValueError(f"R1 {tuple(R1.shape)} and R2 {tuple(R2.shape)} differ in shape")
    d = (R1 - R2).pow(2).sum().sqrt().item()
    return d, {"relative": d / max(R1.pow(2).sum().sqrt().item(), 1e-12)}
