"""EPO: entropy-regularised policy optimisation for long-horizon, sparse-reward agents.

Xu et al. (2025), *EPO: Entropy-regularized Policy Optimization for LLM Agents Reinforcement
Learning*, arXiv:2509.22576. The paper names an *exploration-exploitation cascade failure* of
30+-turn sparse tasks: with no entropy term the policy collapses early (premature convergence);
a constant entropy bonus keeps it from collapsing but lets the entropy drift and oscillate late
in training. EPO adds three pieces to the policy loss L_PG of the multi-turn trainer:

1. multi-turn entropy regularisation, the entropy averaged over all turns of the batch's
   trajectories (every turn, not only the first):  - c_k * mean_t H_t;
2. an entropy-smoothing regulariser that keeps the turn entropies inside a band around their
   *historical* average H_bar (the mean batch entropy of the last ``window`` iterations):
       P = mean_t [ relu(kappa_lo * H_bar - H_t) + relu(H_t - kappa_hi * H_bar) ]   ('hinge')
       P = mean_t [ |H_t - H_bar| * 1{H_t outside [kappa_lo H_bar, kappa_hi H_bar]} ] ('outside_abs');
3. an adaptive phase weight c_k of the entropy term over iterations k: exploration early,
   exploitation late (``phase_weight``).

The EPO loss term added to L_PG is

    L_EPO(k) = - c_k * mean_t H_t  +  beta * P(H, H_bar_k)          c_k = entropy_coef * w(k)

Forms *inferred* (the paper gives the ingredients, not every constant; written before the
authors' code, https://github.com/WujiangXu/EPO, was found;
reproductions/fidelity/42_epo_entropy.md compares it): the band is multiplicative around H_bar
with kappa_lo = 0.5,
kappa_hi = 1.5 by default; H_bar is a moving average over a window of past batches (the current
batch is excluded, so it is "historical"); before any history exists the penalty is zero; w(k)
is 'constant' (1), 'linear' (1 -> w_late over ``num_iters``) or 'step' (1, then w_late from
``switch`` * num_iters on). H_bar is a constant (no gradient flows through it).

Use with the tabular trainer:  ``agent_pg.train(..., regulariser=EPORegulariser(cfg))``
(``regulariser(entropies (N,), it)``), and with the LM loop ``grpo.train(..., regulariser=
EPORegulariser(cfg).lm)`` (``lm(token entropies (B, T), loss_mask (B, T), it)``). Set the trainer's
own ``entropy_coef`` to 0 when EPO carries the entropy term. No arena entry: EPO is a
regulariser, not a credit estimator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PENALTIES = ("hinge", "outside_abs")
PHASES = ("constant", "linear", "step")


@dataclass
class EPOConfig:
    entropy_coef: float = 0.01
    """c: weight of the multi-turn entropy bonus before the phase weight (EPO's entropy term)"""
    beta: float = 0.1
    """weight of the entropy-smoothing penalty P"""
    kappa_lo: float = 0.5
    """lower edge of the band, as a multiple of the historical mean entropy H_bar (inferred)"""
    kappa_hi: float = 1.5
    """upper edge of the band, as a multiple of H_bar (inferred)"""
    window: int = 10
    """past iterations averaged into H_bar (inferred)"""
    penalty: str = "hinge"
    """'hinge' (distance to the band) | 'outside_abs' (|H - H_bar| outside the band)"""
    phase: str = "linear"
    """'constant' | 'linear' | 'step': the phase weight w(k) of the entropy term"""
    w_late: float = 0.0
    """w at the end ('linear') or after the switch ('step')"""
    switch: float = 0.5
    """'step': fraction of num_iters where the exploitation phase starts"""
    num_iters: int = 100
    """iterations of the training run (the phase schedule's length)"""

    def __post_init__(self):
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {self.penalty!r}")
        if self.phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {self.phase!r}")
        if not 0.0 <= self.kappa_lo <= 1.0 <= self.kappa_hi:
            raise ValueError(f"need 0 <= kappa_lo <= 1 <= kappa_hi, got {self.kappa_lo}, {self.kappa_hi}")
        if self.window < 1 or self.num_iters < 1:
            raise ValueError(f"window and num_iters must be >= 1, got {self.window}, {self.num_iters}")


def phase_weight(it: int, num_iters: int, phase: str = "linear", w_late: float = 0.0,
                 switch: float = 0.5) -> float:
    """w(k) of the entropy term at iteration ``it`` (0-based).

    'constant': 1.  'linear': 1 + (w_late - 1) * k / max(K - 1, 1).  'step': 1 for k < switch * K,
    else w_late.

    >>> phase_weight(0, 5, "linear"), phase_weight(4, 5, "linear"), phase_weight(2, 5, "linear")
    (1.0, 0.0, 0.5)
    >>> phase_weight(1, 4, "step", w_late=0.2), phase_weight(2, 4, "step", w_late=0.2)
    (1.0, 0.2)
    """
    if phase == "constant":
        return 1.0
    if phase == "linear":
        frac = min(max(it, 0), num_iters - 1) / max(num_iters - 1, 1)
        return float(1.0 + (w_late - 1.0) * frac)
    if phase == "step":
        return 1.0 if it < switch * num_iters else float(w_late)
    raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")


def smoothing_penalty(entropies: torch.Tensor, h_bar: float, kappa_lo: float = 0.5,
                      kappa_hi: float = 1.5, penalty: str = "hinge"):
    """P(H, H_bar): the mean over turns of how far each H_t lies outside [kappa_lo H_bar,
    kappa_hi H_bar] ('hinge': the distance to the band; 'outside_abs': |H_t - H_bar| where H_t is
    outside the band, else 0). Zero inside the band. Returns (P, metrics) with metrics
    ``below``/``above`` = the share of turns under/over the band.

    entropies: (N,) turn entropies (with gradient); h_bar: the historical mean (a float).
    """
    if entropies.ndim != 1 or entropies.numel() == 0:
        raise ValueError(f"entropies must be a non-empty (N,) tensor, got shape {tuple(entropies.shape)}")
    lo, hi = kappa_lo * h_bar, kappa_hi * h_bar
    below, above = entropies < lo, entropies > hi  # (N,)
    if penalty == "hinge":
        per_turn = torch.relu(lo - entropies) + torch.relu(entropies - hi)  # (N,)
    elif penalty == "outside_abs":
        per_turn = (entropies - h_bar).abs() * (below | above).to(entropies.dtype)  # (N,)
    else:
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}")
    return per_turn.mean(), {"below": below.double().mean().item(),
                             "above": above.double().mean().item()}


def epo_loss(entropies: torch.Tensor, h_bar: float | None, it: int, cfg: EPOConfig):
    """L_EPO(k) = -c_k mean_t H_t + beta P(H, H_bar) (module docstring); P = 0 when ``h_bar`` is
    None (no history yet). Returns (loss, metrics: coef, penalty, h_bar, below, above)."""
    c_k = cfg.entropy_coef * phase_weight(it, cfg.num_iters, cfg.phase, cfg.w_late, cfg.switch)
    loss = -c_k * entropies.mean()
    metrics = {"coef": c_k, "penalty": 0.0, "h_bar": float("nan"), "below": 0.0, "above": 0.0}
    if h_bar is not None:
        pen, m = smoothing_penalty(entropies, h_bar, cfg.kappa_lo, cfg.kappa_hi, cfg.penalty)
        loss = loss + cfg.beta * pen
        metrics.update(m, penalty=pen.item(), h_bar=float(h_bar))
    return loss, metrics


class EPORegulariser:
    """The stateful side of EPO: keeps the batch-mean entropy of each past iteration and gives
    the trainers' ``regulariser`` hook L_EPO with H_bar = the mean of the last ``window`` of them
    (the current iteration excluded). A batch's entropy enters the history at the first call of
    its iteration (later PPO epochs of the same batch reuse the same H_bar)."""

    def __init__(self, cfg: EPOConfig | None = None):
        self.cfg = cfg or EPOConfig()
        self.history: list[float] = []
        self._it: int | None = None
        self._h_bar: float | None = None

    def h_bar(self) -> float | None:
        """The historical mean entropy (None before the first iteration has ended)."""
        if not self.history:
            return None
        past = self.history[-self.cfg.window:]
        return float(sum(past) / len(past))

    def __call__(self, entropies: torch.Tensor, it: int):
        """agent_pg's hook: entropies (N,) with gradient, iteration -> (loss, metrics)."""
        if it != self._it:  # a new batch: H_bar from the past only, then remember this batch
            self._it, self._h_bar = it, self.h_bar()
            self.history.append(float(entropies.detach().mean()))
        return epo_loss(entropies, self._h_bar, it, self.cfg)

    def lm(self, entropies: torch.Tensor, loss_mask: torch.Tensor, it: int):
        """grpo's hook: token entropies (B, T) and the loss mask (B, T); the turns' tokens (mask 1)
        are the units of the mean and of the band."""
        if entropies.shape != loss_mask.shape:
            raise ValueError(f"entropies {tuple(entropies.shape)} and loss_mask "
                             f"{tuple(loss_mask.shape)} must have the same shape")
        return self(entropies[loss_mask.bool()], it)  # (sum of mask,)
