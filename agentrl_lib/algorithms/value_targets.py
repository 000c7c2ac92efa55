"""Value functions trained by classification: the targets of "Stop Regressing" (Farebrother et
al. 2024, arXiv:2403.03950). A scalar target y is turned into a distribution over a fixed
support z_1 < ... < z_K, the value head outputs K logits, and the loss is the cross-entropy
against that distribution instead of the squared error to y; the value read out is the
expectation sum_k p_k z_k.

- **two-hot** (``two_hot``): all mass on the two support points around y, split linearly so the
  expectation is exactly y: for z_i <= y <= z_{i+1},
  p_i = (z_{i+1} - y) / (z_{i+1} - z_i), p_{i+1} = 1 - p_i (y outside the support is clipped).
- **HL-Gauss** (``hl_gauss``): the histogram of a Gaussian N(y, sigma^2) on bins centred on the
  support points (edges halfway between them, the outer edges half a bin outside),
  p_k = Phi((e_{k+1} - y) / sigma) - Phi((e_k - y) / sigma), renormalised to the mass inside
  [e_1, e_{K+1}] (computed in log space: a target far outside puts its mass on the nearest edge
  bin, never a zero row). The paper's default sigma is 0.75 bin widths.
- ``value_loss(logits_or_values, y, kind, support, sigma)``: 'mse' (the value head is a scalar:
  (v - y)^2), 'two_hot' or 'hl_gauss' (cross-entropy), averaged over the batch.

Issue 15's notebook (``stop-regressing``) compares the three on a DQN-style learner.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

KINDS = ("mse", "two_hot", "hl_gauss")


def uniform_support(v_min: float, v_max: float, num_bins: int) -> Tensor:
    """K evenly spaced support points from v_min to v_max (float64). (K,)"""
    if num_bins < 2 or not v_max > v_min:
        raise ValueError(f"need num_bins >= 2 and v_max > v_min, got {num_bins}, {v_min}, {v_max}")
    return torch.linspace(v_min, v_max, num_bins, dtype=torch.float64)


def two_hot(y: Tensor, support: Tensor) -> Tensor:
    """The two-hot distribution of each target on the support: (B,) -> (B, K), rows sum to 1 and
    their expectation is y clipped to [z_1, z_K].

    >>> two_hot(torch.tensor([0.25]), torch.tensor([0.0, 1.0, 2.0])).tolist()
    [[0.75, 0.25, 0.0]]
    """
    z = support.to(torch.float64)
    y = y.to(torch.float64).clamp(z[0], z[-1])  # (B,)
    i = torch.searchsorted(z, y, right=True).clamp(1, len(z) - 1) - 1  # left neighbour (B,)
    lo, hi = z[i], z[i + 1]
    w_hi = (y - lo) / (hi - lo)  # (B,)
    p = torch.zeros(len(y), len(z), dtype=torch.float64)
    p.scatter_(1, i[:, None], (1 - w_hi)[:, None])
    p.scatter_add_(1, (i + 1)[:, None], w_hi[:, None])
    return p


def hl_gauss(y: Tensor, support: Tensor, sigma: float) -> Tensor:
    """The HL-Gauss distribution of each target: (B,) -> (B, K) (module docstring), rows summing
    to 1 for every finite target: far outside the support all the mass is on the nearest edge bin.

    Computed in log space, so no bin's mass underflows to a zero row: with u = (e - y) / sigma,
    log p_k = log(Phi(u_{k+1}) - Phi(u_k)) from ``log_ndtr`` (log Phi, exact in the lower tail),
    as log Phi(b) + log(1 - exp(log Phi(a) - log Phi(b))) for a bin below the target's middle and
    the same of (-b, -a) above it (Phi(b) - Phi(a) = Phi(-a) - Phi(-b)), so neither side differences
    two numbers near 1; then a softmax over k (the renormalisation). The plain difference of
    ``0.5 * (1 + erf(.))`` gave an all-zero row beyond about 8 sigma of the outer edge.

    >>> hl_gauss(torch.tensor([1e6]), torch.tensor([0.0, 1.0, 2.0]), 0.75).tolist()
    [[0.0, 0.0, 1.0]]
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    z = support.to(torch.float64)
    mid = (z[1:] + z[:-1]) / 2
    edges = torch.cat([z[:1] - (z[1] - z[0]) / 2, mid, z[-1:] + (z[-1] - z[-2]) / 2])  # (K+1,)
    y = y.to(torch.float64)[:, None]  # (B, 1)
    if not torch.isfinite(y).all():
        raise ValueError("hl_gauss needs finite targets")
    u = (edges[None, :] - y) / sigma  # (B, K+1)
    lo, hi = u[:, :-1], u[:, 1:]  # each bin's standardised edges (B, K)
    above = (lo + hi) > 0  # the bin's middle is above the target: use the mirrored tail
    a, b = torch.where(above, -hi, lo), torch.where(above, -lo, hi)  # a < b, Phi(b) - Phi(a) same
    log_b, log_a = torch.special.log_ndtr(b), torch.special.log_ndtr(a)
    log_mass = log_b + torch.log1p(-torch.exp(log_a - log_b))  # (B, K)
    return torch.softmax(log_mass, dim=1)


def expectation(probs: Tensor, support: Tensor) -> Tensor:
    """sum_k p_k z_k: (B, K) -> (B,)."""
    return probs @ support.to(probs.dtype)


def target_distribution(y: Tensor, kind: str, support: Tensor, sigma: float | None = None) -> Tensor:
    """two_hot(y) or hl_gauss(y, sigma) (sigma default: 0.75 of the first bin width)."""
    if kind == "two_hot":
        return two_hot(y, support)
    if kind == "hl_gauss":
        width = float(support[1] - support[0])
        return hl_gauss(y, support, 0.75 * width if sigma is None else sigma)
    raise ValueError(f"unknown target kind {kind!r}; the distributional ones are 'two_hot', 'hl_gauss'")


def value_loss(pred: Tensor, y: Tensor, kind: str, support: Tensor | None = None,
               sigma: float | None = None) -> Tensor:
    """The batch-mean loss of a value head. 'mse': pred (B,) values, (pred - y)^2; 'two_hot' /
    'hl_gauss': pred (B, K) logits, cross-entropy -sum_k p_k(y) log softmax(pred)_k."""
    if kind == "mse":
        return ((pred - y.to(pred.dtype)) ** 2).mean()
    if kind not in KINDS:
        raise ValueError(f"unknown value loss {kind!r}; choose one of {KINDS}")
    if support is None or pred.shape[-1] != len(support):
        raise ValueError(f"{kind} needs logits (B, K) and a support of K points")
    target = target_distribution(y, kind, support, sigma).to(pred.dtype)  # (B, K)
    return -(target * torch.log_softmax(pred, dim=-1)).sum(-1).mean()
