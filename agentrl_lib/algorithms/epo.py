"""EPO: entropy-regularised policy optimisation for long-horizon, sparse-reward agents.

Xu et al. (2025), *EPO: Entropy-regularized Policy Optimization for LLM Agents Reinforcement
Learning*, arXiv:2509.22576; the authors' code https://github.com/WujiangXu/EPO (read at commit
5b6fa98; ``reproductions/fidelity/42_epo_entropy.md``). The paper names an
*exploration-exploitation cascade failure* of 30+-turn sparse tasks: with no entropy term the
policy collapses early; a constant entropy bonus keeps it from collapsing but lets the entropy
drift and oscillate late in training. EPO adds three pieces to the policy loss L_PG:

1. multi-turn entropy regularisation, the entropy averaged over all turns (tokens) of the batch:
   - c * mean_t H_t;
2. an entropy-smoothing term that compares each turn's entropy with its *historical* average
   H_bar, with the band [kappa_lo H_bar, kappa_hi H_bar];
3. a phase weight w(k) over training iterations k.

**The released form (the default, ``penalty='released'``, ``phase='released'``).** In the code
(``verl/workers/actor/dp_actor.py``, ``update_policy`` l.659-835 and ``generate_entropy_penalty``
l.300-381) the loss is

    L = L_PG - c * ( mean_t H_t - beta * w(k) * rho * share_out )
    share_out = mean_t 1{H_t not in (kappa_lo H_bar, kappa_hi H_bar)}

(``policy_loss = pg_loss - entropy_loss * entropy_coeff``, l.825; ``entropy_loss = entropy_loss -
entropy_penalty_loss * entropy_smooth_coeff``, l.823; the mask ``torch.where(within_range, 0,
out_range_penalty)``, l.344; ``entropy_mask * epoch_weight``, l.796), with c = 0.001
(``entropy_coeff``, ``verl/trainer/config/ppo_trainer.yaml`` l.57), beta = 1
(``entropy_smooth_coeff``, l.58), the README's runs' band (0, 2) (``--entropy_smooth_min_ratio 0
--entropy_smooth_max_ratio 2.0``) and rho = 0.1 (ALFWorld; 0.05 on ScienceWorld); H_bar the mean
entropy of every batch so far, the current one included (``ray_trainer.py`` l.1109 appends before
the update, l.1269 averages them all); w(k) from ``_calculate_epoch_based_entropy_weight``
(l.79-121: 1 -> 0.8 over the first half, then 0.8 exp(-3 p) over the second;
``released_phase_weight``)
on the smoothing term, not on the bonus. The indicator is built from comparisons, so **the
smoothing term carries no gradient**: it changes the loss's value, not the update, and the
released EPO trains exactly as a constant bonus c (notebook 42, 3.4). Not reproduced, because
they too change only that value: the code's H_bar is kept per turn index (``entropy_history
[rollout_step]``; here one mean over all turns) and the term is only on for micro-batches holding
a turn index >= max_steps // 2 (l.778); its w(k) runs over a hard-coded 150 epochs (l.793; here
over ``num_iters``).

**Our earlier inferred form (a named variant, ``penalty='hinge'``, ``history='window'``,
``phase='linear'``, ``phase_on='bonus'``),** written before the code was found, keeps the
paper's intent with a restoring force:

    L_EPO(k) = - c w(k) mean_t H_t
               + beta * mean_t [ relu(kappa_lo H_bar - H_t) + relu(H_t - kappa_hi H_bar) ]

with H_bar the mean batch entropy of the last ``window`` past iterations (current excluded; no
gradient flows through it), kappa = (0.5, 1.5), w(k) linear 1 -> ``w_late`` on the bonus, and
'outside_abs' (|H_t - H_bar| outside the band) as a second penalty form.

Use with the tabular trainer:  ``agent_pg.train(..., regulariser=EPORegulariser(cfg))``
(``regulariser(entropies (N,), it)``), and with the LM loop ``grpo.train(..., regulariser=
EPORegulariser(cfg).lm)`` (``lm(token entropies (B, T), loss_mask (B, T), it)``). Set the trainer's
own ``entropy_coef`` to 0 when EPO carries the entropy term. No arena entry: EPO is a
regulariser, not a credit estimator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PENALTIES = ("released", "hinge", "outside_abs")
PHASES = ("released", "constant", "linear", "step")
HISTORIES = ("all", "window")
PHASE_ON = ("smoothing", "bonus")


@dataclass
class EPOConfig:
    entropy_coef: float = 0.001
    """c: weight of the multi-turn entropy bonus (the code's ``entropy_coeff``, 0.001)"""
    beta: float = 1.0
    """weight of the smoothing term (the code's ``entropy_smooth_coeff``, 1.0)"""
    kappa_lo: float = 0.0
    """lower edge of the band, a multiple of H_bar (README runs: ``entropy_smooth_min_ratio 0``)"""
    kappa_hi: float = 2.0
    """upper edge of the band, a multiple of H_bar (README runs: ``entropy_smooth_max_ratio 2``)"""
    out_range_penalty: float = 0.1
    """'released': rho, the value of an out-of-band turn (README ALFWorld 0.1, ScienceWorld 0.05)"""
    penalty: str = "released"
    """'released' (the code: rho on out-of-band turns, no gradient) | 'hinge' (distance to the
    band) | 'outside_abs' (|H - H_bar| outside the band)"""
    history: str = "all"
    """'all': H_bar = the mean of every batch so far, the current one included (the code) |
    'window': the last ``window`` past batches, the current one excluded (ours)"""
    window: int = 10
    """history='window': past iterations averaged into H_bar (inferred)"""
    phase: str = "released"
    """'released' (the code's two-piece exponential) | 'constant' | 'linear' | 'step': w(k)"""
    phase_on: str = "smoothing"
    """which term w(k) multiplies: 'smoothing' (the code) | 'bonus' (ours)"""
    w_late: float = 0.0
    """w at the end ('linear') or after the switch ('step')"""
    switch: float = 0.5
    """'step': fraction of num_iters where the exploitation phase starts"""
    num_iters: int = 100
    """iterations of the training run (the phase schedule's length)"""

    def __post_init__(self):
        for name, allowed in (("penalty", PENALTIES), ("phase", PHASES), ("history", HISTORIES),
                              ("phase_on", PHASE_ON)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0.0 <= self.kappa_lo <= 1.0 <= self.kappa_hi:
            raise ValueError(f"need 0 <= kappa_lo <= 1 <= kappa_hi, got {self.kappa_lo}, {self.kappa_hi}")
        if self.window < 1 or self.num_iters < 1:
            raise ValueError(f"window and num_iters must be >= 1, got {self.window}, {self.num_iters}")


def released_phase_weight(it: int, num_iters: int) -> float:
    """The code's w(k) (``dp_actor.py``, ``_calculate_epoch_based_entropy_weight``, l.79-121, with
    max_epochs = ``num_iters``): with half = K // 2, 1 - 0.2 (1 - exp(-2 k / half)) for k <= half,
    then 0.8 exp(-3 (k - half) / (K - half)); k clamped to [0, K].

    >>> [round(released_phase_weight(k, 4), 4) for k in (0, 1, 2, 3, 4)]
    [1.0, 0.8736, 0.8271, 0.1785, 0.0398]
    """
    k = max(0, min(it, num_iters))
    half = num_iters // 2
    if k <= half:
        return 1.0 if half == 0 else 1.0 - 0.2 * (1.0 - math.exp(-2.0 * k / half))
    return 0.8 * math.exp(-3.0 * (k - half) / (num_iters - half))


def phase_weight(it: int, num_iters: int, phase: str = "linear", w_late: float = 0.0,
                 switch: float = 0.5) -> float:
    """w(k) of the entropy term at iteration ``it`` (0-based).

    'released': ``released_phase_weight``.  'constant': 1.  'linear': 1 + (w_late - 1) * k /
    max(K - 1, 1).  'step': 1 for k < switch * K, else w_late.

    >>> phase_weight(0, 5, "linear"), phase_weight(4, 5, "linear"), phase_weight(2, 5, "linear")
    (1.0, 0.0, 0.5)
    >>> phase_weight(1, 4, "step", w_late=0.2), phase_weight(2, 4, "step", w_late=0.2)
    (1.0, 0.2)
    """
    if phase == "released":
        return released_phase_weight(it, num_iters)
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


def released_penalty(entropies: torch.Tensor, h_bar: float, kappa_lo: float = 0.0,
                     kappa_hi: float = 2.0, out_range_penalty: float = 0.1):
    """The code's smoothing value (``dp_actor.py``, ``generate_entropy_penalty``, mask_mode
    'token', l.332-352, then the token mean ``agg_loss``): rho times the share of turns whose
    entropy is not strictly inside (kappa_lo H_bar, kappa_hi H_bar). Built from comparisons, it has
    no gradient. Returns (P, metrics ``below``/``above``: the share at or under / at or over the
    band's edges).

    >>> p, m = released_penalty(torch.tensor([0.5, 1.0, 2.5]), 1.0, 0.0, 2.0, 0.1)
    >>> round(p.item(), 4), p.requires_grad, m["above"]
    (0.0333, False, 0.3333333333333333)
    """
    if entropies.ndim != 1 or entropies.numel() == 0:
        raise ValueError(f"entropies must be a non-empty (N,) tensor, got shape {tuple(entropies.shape)}")
    h = entropies.detach()
    lo, hi = kappa_lo * h_bar, kappa_hi * h_bar
    within = (h > lo) & (h < hi)  # (N,) strict, as the code
    mask = torch.where(within, torch.zeros_like(h), torch.full_like(h, out_range_penalty))
    return mask.mean(), {"below": (h <= lo).double().mean().item(),
                         "above": (h >= hi).double().mean().item()}


def epo_loss(entropies: torch.Tensor, h_bar: float | None, it: int, cfg: EPOConfig):
    """EPO's term at iteration ``it`` (module docstring), with w = w(k) on the term ``phase_on``
    names. 'released': -c w_b mean_t H_t + c beta w_s P (the code multiplies its smoothing value
    by ``entropy_coeff`` too; P has no gradient); 'hinge' / 'outside_abs': -c w_b mean_t H_t +
    beta w_s P. P = 0 when ``h_bar`` is None (no history yet). Returns (loss, metrics: coef = c w_b,
    smooth_weight = w_s, penalty, h_bar, below, above)."""
    w = phase_weight(it, cfg.num_iters, cfg.phase, cfg.w_late, cfg.switch)
    w_b, w_s = (w, 1.0) if cfg.phase_on == "bonus" else (1.0, w)
    c_k = cfg.entropy_coef * w_b
    loss = -c_k * entropies.mean()
    metrics = {"coef": c_k, "smooth_weight": w_s, "penalty": 0.0, "h_bar": float("nan"),
               "below": 0.0, "above": 0.0}
    if h_bar is not None:
        if cfg.penalty == "released":
            pen, m = released_penalty(entropies, h_bar, cfg.kappa_lo, cfg.kappa_hi,
                                      cfg.out_range_penalty)
            loss = loss + cfg.entropy_coef * cfg.beta * w_s * pen
        else:
            pen, m = smoothing_penalty(entropies, h_bar, cfg.kappa_lo, cfg.kappa_hi, cfg.penalty)
            loss = loss + cfg.beta * w_s * pen
        metrics.update(m, penalty=pen.item(), h_bar=float(h_bar))
    return loss, metrics


class EPORegulariser:
    """The stateful side of EPO: keeps the batch-mean entropy of each iteration and gives the
    trainers' ``regulariser`` hook EPO's term with H_bar from that history: history='all' (the
    code), the mean of every batch so far including the current one; 'window', the mean of the last
    ``window`` past batches. A batch's entropy enters the history at the first call of its
    iteration (later PPO epochs of the same batch reuse the same H_bar)."""

    def __init__(self, cfg: EPOConfig | None = None):
        self.cfg = cfg or EPOConfig()
        self.history: list[float] = []
        self._it: int | None = None
        self._h_bar: float | None = None

    def h_bar(self) -> float | None:
        """The historical mean entropy of the history as it stands (None while it is empty)."""
        if not self.history:
            return None
        past = self.history if self.cfg.history == "all" else self.history[-self.cfg.window:]
        return float(sum(past) / len(past))

    def __call__(self, entropies: torch.Tensor, it: int):
        """agent_pg's hook: entropies (N,) with gradient, iteration -> (loss, metrics)."""
        if it != self._it:  # a new batch: remember it, H_bar with it ('all') or before it
            self._it = it
            if self.cfg.history == "window":
                self._h_bar = self.h_bar()
            self.history.append(float(entropies.detach().mean()))
            if self.cfg.history == "all":
                self._h_bar = self.h_bar()
        return epo_loss(entropies, self._h_bar, it, self.cfg)

    def lm(self, entropies: torch.Tensor, loss_mask: torch.Tensor, it: int):
        """grpo's hook: token entropies (B, T) and the loss mask (B, T); the turns' tokens (mask 1)
        are the units of the mean and of the band."""
        if entropies.shape != loss_mask.shape:
            raise ValueError(f"entropies {tuple(entropies.shape)} and loss_mask "
                             f"{tuple(loss_mask.shape)} must have the same shape")
        return self(entropies[loss_mask.bool()], it)  # (sum of mask,)
