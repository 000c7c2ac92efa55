"""Pure tensor math shared by every algorithm: returns, GAE, group advantages, masked means,
the PPO clipped surrogate and KL estimators.

Nothing here knows about environments, models or optimisers. Time is the last axis:
``(B, T)`` is B sequences of T steps (or tokens); ``(B, G)`` is B prompts times G samples.

Conventions (where papers differ, the choice is stated and the alternative is a flag):
- ``done_t`` means the episode ended *after* step t, so ``r_t`` is its last reward and no value
  is bootstrapped from s_{t+1} (CleanRL's convention, with the flag shifted to the step that ends).
- GRPO's group std uses ``ddof=1`` (unbiased), as ``torch.std`` does and TRL's GRPOTrainer uses;
  the DeepSeekMath paper writes only "std". Pass ``ddof=0`` for the population std.

References: Schulman et al. 2016 (GAE, arXiv:1506.02438); Schulman et al. 2017 (PPO,
arXiv:1707.06347); Shao et al. 2024 (GRPO, arXiv:2402.03300); Ahmadian et al. 2024 (RLOO,
arXiv:2402.14740); Schulman 2020, "Approximating KL divergence" (k1, k2, k3).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def masked_mean(x: Tensor, mask: Tensor | None = None, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over entries where ``mask`` is 1; an all-zero mask gives 0, not NaN."""
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def discounted_returns(r_t: Tensor, gamma: float, done_t: Tensor | None = None) -> Tensor:
    """G_t = r_t + gamma * G_{t+1} * (1 - done_t), computed right to left along the last axis.

    r_t: (..., T) rewards; done_t: (..., T) episode ended after step t. Returns (..., T).
    A return never looks past the end of the given window (G_T = 0).
    """
    not_done = torch.ones_like(r_t) if done_t is None else 1.0 - done_t.to(r_t.dtype)
    g_t = torch.zeros_like(r_t)
    running = torch.zeros_like(r_t[..., 0])  # (...)
    for t in range(r_t.shape[-1] - 1, -1, -1):
        running = r_t[..., t] + gamma * running * not_done[..., t]
        g_t[..., t] = running
    return g_t


def gae_advantages(
    r_t: Tensor,
    v_t: Tensor,
    done_t: Tensor,
    v_last: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation.

    delta_t = r_t + gamma * V(s_{t+1}) * (1 - done_t) - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}

    r_t, v_t, done_t: (B, T); v_last: (B,) the value of the state after the window.
    Returns (advantages, returns) with returns = advantages + v_t, both (B, T).
    lam=1 gives Monte-Carlo returns minus V; lam=0 gives the one-step TD error.
    """
    not_done = 1.0 - done_t.to(r_t.dtype)  # (B, T)
    v_next = torch.cat([v_t[..., 1:], v_last.unsqueeze(-1)], dim=-1)  # (B, T)
    delta = r_t + gamma * v_next * not_done - v_t  # (B, T)
    adv = torch.zeros_like(r_t)
    running = torch.zeros_like(v_last)  # (B,)
    for t in range(r_t.shape[-1] - 1, -1, -1):
        running = delta[..., t] + gamma * lam * not_done[..., t] * running
        adv[..., t] = running
    return adv, adv + v_t


def grpo_advantages(
    rewards: Tensor, scale: bool = True, ddof: int = 1, eps: float = 1e-4
) -> Tensor:
    """Group-relative advantage: A_i = (r_i - mean(r)) / (std(r) + eps) within each group.

    rewards: (B, G), one row per prompt. ``scale=False`` drops the std division (Dr. GRPO,
    Liu et al. 2025). eps=1e-4 as in TRL. A group whose rewards are all equal gets A = 0.
    """
    centred = rewards - rewards.mean(dim=-1, keepdim=True)  # (B, G)
    if not scale:
        return centred
    std = rewards.std(dim=-1, keepdim=True, correction=ddof)  # (B, 1)
    return centred / (std + eps)


def rloo_advantages(rewards: Tensor) -> Tensor:
    """Leave-one-out baseline: A_i = r_i - mean_{j != i} r_j = G/(G-1) * (r_i - mean(r)).

    rewards: (B, G) with G >= 2. Unbiased: the baseline does not depend on sample i.
    """
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError(f"RLOO needs a group of at least 2 samples, got group_size={g}")
    loo_mean = (rewards.sum(dim=-1, keepdim=True) - rewards) / (g - 1)  # (B, G)
    return rewards - loo_mean


def reinforce_advantages(returns: Tensor, baseline: Tensor | float | None = None) -> Tensor:
    """REINFORCE weight: G_t, or G_t - b(s_t) with a baseline (any b not depending on the action)."""
    return returns if baseline is None else returns - baseline


def ppo_clip_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate, to be minimised.

    L = -mean[ min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A) ],  rho = exp(logps - old_logps)

    logps, old_logps, advantages: same shape, e.g. (B,) actions or (B, T) tokens; mask: which
    entries count (the mean is over all of them at once: token-level aggregation).
    ``clip_eps_high`` (DAPO's clip-higher) defaults to ``clip_eps``.
    Returns (loss, metrics) with the fraction of entries whose gradient is clipped to zero and the k3 estimate of KL(old || new).
    """
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = logps - old_logps
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high) * advantages
    loss = -masked_mean(torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        # where the clipped branch wins the min, the gradient is zero (TRL's "clip ratio";
        # CleanRL's clipfrac counts |rho - 1| > eps instead, whichever branch wins)
        clipfrac = masked_mean((clipped < unclipped).to(ratio.dtype), mask)
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, mask)
    return loss, {"clipfrac": clipfrac.item(), "approx_kl": approx_kl.item()}


def kl_estimate(logps: Tensor, ref_logps: Tensor, kind: str = "k3") -> Tensor:
    """Per-sample estimate of KL(pi || pi_ref) from samples of pi, with log r = ref_logps - logps.

    k1 = -log r (unbiased, high variance, can be negative); k2 = (log r)^2 / 2 (biased, low
    variance); k3 = (r - 1) - log r (unbiased, always >= 0; the GRPO paper's choice).
    """
    log_r = ref_logps - logps
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    if kind == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator kind={kind!r}; expected 'k1', 'k2' or 'k3'")
