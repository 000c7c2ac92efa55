"""Pure tensor math shared by every algorithm: returns, GAE, group advantages, whitening, masked
means and aggregation, the PPO clipped surrogate, the value loss and KL estimators.

Nothing here knows about environments, models or optimisers. Time is the last axis:
``(B, T)`` is B sequences of T steps (or tokens); ``(B, G)`` is B prompts times G samples.

Conventions (where papers differ, the choice is stated and the alternative is an argument):
- ``done_t`` means the episode ended *after* step t, so ``r_t`` is its last reward and no value
  is bootstrapped from s_{t+1} (CleanRL's convention, with the flag shifted to the step that ends).
- GRPO's group std uses ``ddof=1`` (unbiased), as ``torch.std`` does and TRL's GRPOTrainer uses;
  the DeepSeekMath paper writes only "std". Pass ``ddof=0`` for the population std.
- A group whose rewards are all equal gets advantage exactly 0 under every group estimator (its
  float32 std is not always 0: 2/3 eight times has a std of about 6e-8).
- ``whiten`` states its ddof and where its eps goes: CleanRL divides by ``std + eps`` (ddof=1);
  TRL and lm-human-preferences multiply by ``rsqrt(var + eps)`` (ddof=0).
- The fraction of clipped entries (``clipfrac``) counts where the clipped branch of the PPO
  minimum is active, i.e. the gradient is zero: rho > 1 + eps_high with A > 0, or rho < 1 - eps
  with A < 0 (TRL's "clip ratio"; CleanRL counts |rho - 1| > eps whatever the sign of A).

References: Schulman et al. 2016 (GAE, arXiv:1506.02438); Schulman et al. 2017 (PPO,
arXiv:1707.06347); Shao et al. 2024 (GRPO, arXiv:2402.03300); Ahmadian et al. 2024 (RLOO,
arXiv:2402.14740); Liu et al. 2025 (Dr. GRPO, arXiv:2503.20783; Lite-PPO, arXiv:2508.08221);
Schulman 2020, "Approximating KL divergence" (k1, k2, k3).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

# The advantage estimators of the critic-free family, one name per baseline:
#   reinforce   A = r                                   (no baseline; Williams 1992)
#   batch_mean  A = r - mean of all rewards of the batch (REINFORCE with a batch-mean baseline)
#   rloo        A = r - mean of the other G-1 rewards of the group (Ahmadian et al. 2024)
#   grpo        A = (r - group mean) / (group std + eps) (Shao et al. 2024)
#   dr_grpo     A = r - group mean                       (Liu et al. 2025, Dr. GRPO)
#   lite_ppo    A = (r - group mean) / (batch std + eps) (Liu et al. 2025, Tricks or Traps)
ESTIMATORS = ("reinforce", "batch_mean", "rloo", "grpo", "dr_grpo", "lite_ppo")
AGGREGATIONS = ("seq_mean", "token_mean", "const_norm")


def masked_mean(x: Tensor, mask: Tensor | None = None, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over entries where ``mask`` is 1; an all-zero mask gives 0, not NaN."""
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def aggregate(x: Tensor, mask: Tensor | None = None, loss_agg: str = "token_mean",
              max_len: int | None = None) -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar over the entries where ``mask`` is 1.

    'token_mean': the mean over every real token of the batch (DAPO, Lite-PPO; TRL "bnpo");
    'seq_mean': the mean over each sequence's tokens, then over sequences (GRPO; TRL "grpo");
    'const_norm': the sum divided by B * max_len, a constant (Dr. GRPO; TRL "dr_grpo"; max_len
    defaults to T). An empty mask contributes 0, never NaN.

    >>> x, m = torch.tensor([[1.0, 1.0, 4.0], [2.0, 0.0, 0.0]]), torch.tensor([[1, 1, 1], [1, 0, 0]])
    >>> [round(aggregate(x, m, a, max_len=4).item(), 4) for a in AGGREGATIONS]
    [2.0, 2.0, 1.0]
    """
    if loss_agg == "token_mean":
        return masked_mean(x, mask)
    m = torch.ones_like(x) if mask is None else mask.to(x.dtype)
    if loss_agg == "seq_mean":
        return ((x * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if loss_agg == "const_norm":
        return (x * m).sum() / (x.shape[0] * (max_len or x.shape[-1]))
    raise ValueError(f"unknown loss_agg {loss_agg!r}; expected one of {AGGREGATIONS}")


def whiten(x: Tensor, mask: Tensor | None = None, ddof: int = 0, eps: float = 1e-8,
           eps_in_sqrt: bool = False) -> Tensor:
    """(x - mean) / (std + eps) over the entries where ``mask`` is 1 (all when None); 0 elsewhere.

    ddof: 0 for the population std, 1 for the unbiased one. eps_in_sqrt: multiply by
    rsqrt(var + eps) instead (TRL's ``masked_whiten``, lm-human-preferences' ``tf.nn.moments``).

    >>> whiten(torch.tensor([1.0, 3.0])).tolist()
    [-1.0, 1.0]
    >>> whiten(torch.tensor([1.0, 3.0, 9.0]), torch.tensor([1, 1, 0]), ddof=1).tolist()
    [-0.7071067690849304, 0.7071067690849304, 0.0]
    """
    if mask is None:
        mean = x.mean()
        var = x.var(correction=ddof) if eps_in_sqrt else None
        std = None if eps_in_sqrt else x.std(correction=ddof)
    else:
        m = mask.to(x.dtype)
        mean = masked_mean(x, m)
        var = ((x - mean) ** 2 * m).sum() / (m.sum() - ddof).clamp(min=1.0)
        std = var.sqrt()
    centred = x - mean
    out = centred * torch.rsqrt(var + eps) if eps_in_sqrt else centred / (std + eps)
    return out if mask is None else out * mask.to(x.dtype)


def discounted_returns(r_t: Tensor, gamma: float, done_t: Tensor | None = None) -> Tensor:
    """G_t = r_t + gamma * G_{t+1} * (1 - done_t), computed right to left along the last axis.

    r_t: (..., T) rewards; done_t: (..., T) episode ended after step t. Returns (..., T).
    A return never looks past the end of the given window (G_T = 0).

    >>> discounted_returns(torch.tensor([0.0, 0.0, 1.0]), 0.5).tolist()
    [0.25, 0.5, 1.0]
    """
    not_done = torch.ones_like(r_t) if done_t is None else 1.0 - done_t.to(r_t.dtype)
    g_t = torch.zeros_like(r_t)
    running = r_t.new_zeros(r_t.shape[:-1])  # (...); an empty window (T = 0) returns (..., 0)
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
    rewards: Tensor, norm_adv: bool = True, ddof: int = 1, eps: float = 1e-4
) -> Tensor:
    """Group-relative advantage: A_i = (r_i - mean(r)) / (std(r) + eps) within each group.

    rewards: (..., G), one row per prompt. ``norm_adv=False`` drops the std division (Dr. GRPO,
    Liu et al. 2025). eps=1e-4 as in TRL. A group whose rewards are all equal gets A = 0.
    """
    centred = rewards - rewards.mean(dim=-1, keepdim=True)  # (..., G)
    if norm_adv:
        std = rewards.std(dim=-1, keepdim=True, correction=ddof)  # (..., 1)
        centred = centred / (std + eps)
    return centred * ~all_equal(rewards)[..., None]  # exactly 0 where the group has no signal


def rloo_advantages(rewards: Tensor) -> Tensor:
    """Leave-one-out baseline: A_i = r_i - mean_{j != i} r_j = G/(G-1) * (r_i - mean(r)).

    rewards: (..., G) with G >= 2. Unbiased: the baseline does not depend on sample i.
    """
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError(f"RLOO needs a group of at least 2 samples, got group_size={g}")
    loo_mean = (rewards.sum(dim=-1, keepdim=True) - rewards) / (g - 1)  # (..., G)
    return (rewards - loo_mean) * ~all_equal(rewards)[..., None]


def all_equal(rewards: Tensor) -> Tensor:
    """Whether every reward of a group (the last axis) is the same, exactly: (..., G) -> (...).
    What dynamic sampling drops and what gets advantage 0. Testing ``std > 0`` instead fails in
    float32: eight rewards of 2/3 have a std of about 6e-8, and (r - mean) / (std + eps) is then
    about 6e-4, not 0.

    >>> all_equal(torch.tensor([[2 / 3] * 8, [0.0, 1.0] * 4])).tolist()
    [True, False]
    """
    return rewards.amax(dim=-1) == rewards.amin(dim=-1)


def group_advantages(rewards: Tensor, estimator: str, ddof: int = 1, eps: float = 1e-4) -> Tensor:
    """Per-sample advantages of the critic-free estimators (``ESTIMATORS``, see above).

    rewards: (..., B, G) -> (..., B, G). Leading axes (e.g. independent draws K) are kept apart;
    'batch_mean' and the batch std of 'lite_ppo' use the last two axes (the B*G rewards of one
    batch), the group estimators the last one. ``ddof`` and ``eps`` are those of the std.

    >>> r = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    >>> group_advantages(r, "rloo").mul(3).tolist()
    [[2.0, -2.0, -2.0, 2.0]]
    >>> group_advantages(r, "dr_grpo").tolist()
    [[0.5, -0.5, -0.5, 0.5]]
    """
    if estimator == "reinforce":
        return rewards.clone()
    if estimator == "batch_mean":
        flat = rewards.flatten(-2)  # (..., B*G)
        return (rewards - rewards.mean(dim=(-2, -1), keepdim=True)) * ~all_equal(flat)[..., None, None]
    if estimator == "rloo":
        return rloo_advantages(rewards)
    if estimator == "grpo":
        return grpo_advantages(rewards, norm_adv=True, ddof=ddof, eps=eps)
    if estimator == "dr_grpo":
        return grpo_advantages(rewards, norm_adv=False)
    if estimator == "lite_ppo":  # group-mean centring, batch-level std (Tricks or Traps, sec. 4)
        batch_std = rewards.std(dim=(-2, -1), keepdim=True, correction=ddof)  # (..., 1, 1)
        return grpo_advantages(rewards, norm_adv=False) / (batch_std + eps)
    raise ValueError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")


def clipped_token_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor,
                       clip_eps: float = 0.2, clip_eps_high: float | None = None) -> Tensor:
    """The PPO clipped surrogate per entry, to be minimised (Schulman et al. 2017, eq. 7):

    l = -min(rho A, clip(rho, 1 - eps, 1 + eps_high) A),   rho = exp(logps - old_logps)

    logps, old_logps: (B,) actions or (B, T) tokens; advantages: the same shape, or (B,) one per
    sequence of a (B, T) batch. ``clip_eps_high`` (DAPO's clip-higher) defaults to ``clip_eps``.
    """
    adv = advantages[:, None] if advantages.dim() == 1 and logps.dim() == 2 else advantages
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logps - old_logps)
    return -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high) * adv)


@torch.no_grad()
def clip_stats(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor | None = None,
               clip_eps: float = 0.2, clip_eps_high: float | None = None) -> dict[str, float]:
    """``clipfrac``: the fraction of entries whose gradient the clip zeroes (module docstring);
    ``approx_kl``: the k3 estimate of KL(old || new), mean(rho - 1 - log rho)."""
    adv = advantages[:, None] if advantages.dim() == 1 and logps.dim() == 2 else advantages
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = logps - old_logps
    ratio = torch.exp(log_ratio)
    adv = adv.expand_as(ratio)
    clipped = ((ratio < 1.0 - clip_eps) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    m = None if mask is None else mask.to(ratio.dtype)
    return {"clipfrac": masked_mean(clipped.to(ratio.dtype), m).item(),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, m).item()}


def ppo_clip_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    loss_agg: str = "token_mean",
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate, aggregated over the entries where ``mask`` is 1 (``aggregate``):

    L = agg[ -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A) ]

    Returns (loss, metrics) with ``clipfrac`` and ``approx_kl`` (``clip_stats``).
    """
    per_entry = clipped_token_loss(logps, old_logps, advantages, clip_eps, clip_eps_high)
    loss = aggregate(per_entry, mask, loss_agg, max_len)
    return loss, clip_stats(logps, old_logps, advantages, mask, clip_eps, clip_eps_high)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip_eps: float, clip: bool = True
) -> Tensor:
    """0.5 * mean[(V - R)^2], or with clipping (openai/baselines, CleanRL):

    V_clip = V_old + clip(V - V_old, -eps, eps);  L = 0.5 * mean[max((V - R)^2, (V_clip - R)^2)]

    values, old_values, returns: (B,). Returns a scalar.
    """
    unclipped = (values - returns) ** 2  # (B,)
    if not clip:
        return 0.5 * unclipped.mean()
    v_clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)  # (B,)
    return 0.5 * torch.maximum(unclipped, (v_clipped - returns) ** 2).mean()


def explained_variance(values: Tensor, returns: Tensor) -> float:
    """1 - Var[R - V] / Var[R]: 1 is a perfect critic, 0 no better than a constant; NaN if
    Var[R] = 0.

    >>> explained_variance(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0]))
    1.0
    """
    var_r = returns.var()
    return float("nan") if var_r == 0 else (1.0 - (returns - values).var() / var_r).item()


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
