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

**The released form (the default, ``penalty='released'``, ``history='turn'``,
``phase='released'``).** In the code (``verl/workers/actor/dp_actor.py``, ``update_policy``
l.659-864 and ``generate_entropy_penalty`` l.300-381) each micro-batch m of turn rows gets

    L_m = L_PG,m - c * ( mean_{t in m} H_t - beta * w(k) * g_m * rho * share_out_m )
    share_out_m = mean_{t in m} 1{H_t not in (kappa_lo H_bar[tau_t], kappa_hi H_bar[tau_t])}

(``policy_loss = pg_loss - entropy_loss * entropy_coeff``, l.825; ``entropy_loss = entropy_loss -
entropy_penalty_loss * entropy_smooth_coeff``, l.823; the mask ``torch.where(within_range, 0,
out_range_penalty)``, l.344; ``entropy_mask * epoch_weight``, l.796), with c = 0.001
(``entropy_coeff``, ``verl/trainer/config/ppo_trainer.yaml`` l.57), beta = 1
(``entropy_smooth_coeff``, l.58), the README's band (0, 2) and rho = 0.1 (ALFWorld; 0.05 on
ScienceWorld). H_bar[tau] is the mean, over every iteration so far (the current one included), of
the batch's mean entropy at turn index tau: ``rollout_loop.py`` l.366-406 keeps one token-mean per
step, ``ray_trainer.py`` l.1100-1109 left-pads that list with zeros to ``env.max_steps`` (so a
batch shorter than the cap shifts its entries to the right) and appends it before the update,
l.1269 averages the lists; ``dp_actor.py`` l.328 reads ``entropy_history[rollout_step]``. g_m = 1
only for a micro-batch holding a turn index >= 50 // 2 (l.772-778: the code reads the config key
``max_step``, which no config sets, so its default 50), else the mask is zero. w(k) is
``_calculate_epoch_based_entropy_weight`` (l.79-121: 1 -> 0.8 over the first half, then
0.8 exp(-3 p)) at the trainer epoch k of a hard-coded ``max_epochs = 150`` (l.793), on the
smoothing term, not on the bonus.

Every piece of the smoothing term is built from comparisons, so **it carries no gradient**: it
changes the loss's value, not the update. The released EPO's gradient is exactly the constant
bonus's, -c grad mean_t H_t (notebook 42, 3.4). This module ports it as it is (``epo_loss``,
``released_smoothing``): the per-turn-index history with its padding, the micro-batch gate and
the 150-epoch schedule, all of which change only the logged value. Ours, not the code's: the
bonus is one mean over the batch's turns (the trainers' aggregation; the code's is a token mean
per micro-batch), the micro-batches are consecutive chunks of ``micro_batch`` turns in episode
order, and a step's history entry averages the turns still playing (the code's also the finished
environments' generations).

**Our earlier inferred form (a named variant, ``penalty='hinge'``, ``history='window'``,
``phase='linear'``, ``phase_on='bonus'``),** written before the code was found, keeps the
paper's intent with a restoring force:

    L_EPO(k) = - c w(k) mean_t H_t
               + beta * mean_t [ relu(kappa_lo H_bar - H_t) + relu(H_t - kappa_hi H_bar) ]

with H_bar the mean batch entropy of the last ``window`` past iterations (current excluded; no
gradient flows through it), kappa = (0.5, 1.5), w(k) linear 1 -> ``w_late`` on the bonus, and
'outside_abs' (|H_t - H_bar| outside the band) as a second penalty form.

Use with the tabular trainer:  ``agent_pg.train(..., regulariser=reg)`` with ``reg =
EPORegulariser(cfg)`` (``reg(entropies (N,), it)``; the code's per-turn history and gate need each
turn's index: call ``reg.observe(episodes)`` on each batch first, e.g. from a ``credit_fn``), and
with the LM loop ``grpo.train(..., regulariser=reg.lm)`` (``lm(token entropies (B, T), loss_mask
(B, T), it)``; a turn is a run of ones of the loss mask). Set the trainer's own ``entropy_coef`` to
0 when EPO carries the entropy term. No arena entry: EPO is a regulariser, not a credit estimator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

PENALTIES = ("released", "hinge", "outside_abs")
PHASES = ("released", "constant", "linear", "step")
HISTORIES = ("turn", "all", "window")
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
    history: str = "turn"
    """'turn': one H_bar per turn index, the mean over every batch so far (the current one
    included) of its left-zero-padded per-step means (the code) | 'all': one H_bar, the mean batch
    entropy of every batch so far | 'window': the last ``window`` past batches, the current one
    excluded (ours)"""
    max_steps: int = 50
    """history='turn': the per-step lists' length, the environment's turn cap (the code's
    ``env.max_steps``: ALFWorld 50, ScienceWorld 30)"""
    gate_steps: int = 50
    """'released': the term is on only in a micro-batch holding a turn index >= gate_steps // 2
    (the code reads ``max_step``, a key no config sets: its default 50); 0: always on"""
    micro_batch: int = 32
    """'released': turns per micro-batch for the gate and the value (the code's
    ``ppo_micro_batch_size_per_gpu``: 32 in its script, 8 in the README's ScienceWorld run);
    0: the whole batch is one"""
    window: int = 10
    """history='window': past iterations averaged into H_bar (inferred)"""
    phase: str = "released"
    """'released' (the code's two-piece exponential) | 'constant' | 'linear' | 'step': w(k)"""
    phase_epochs: int | None = 150
    """phase='released': the schedule's length (the code hard-codes ``max_epochs = 150``);
    None: ``num_iters``"""
    phase_on: str = "smoothing"
    """which term w(k) multiplies: 'smoothing' (the code) | 'bonus' (ours)"""
    w_late: float = 0.0
    """w at the end ('linear') or after the switch ('step')"""
    switch: float = 0.5
    """'step': fraction of num_iters where the exploitation phase starts"""
    num_iters: int = 100
    """iterations of the training run (the length of the 'linear' and 'step' schedules)"""

    def __post_init__(self):
        for name, allowed in (("penalty", PENALTIES), ("phase", PHASES), ("history", HISTORIES),
                              ("phase_on", PHASE_ON)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0.0 <= self.kappa_lo <= 1.0 <= self.kappa_hi:
            raise ValueError(f"need 0 <= kappa_lo <= 1 <= kappa_hi, got {self.kappa_lo}, {self.kappa_hi}")
        if self.window < 1 or self.num_iters < 1 or self.max_steps < 1:
            raise ValueError("window, num_iters and max_steps must be >= 1, got "
                             f"{self.window}, {self.num_iters}, {self.max_steps}")
        if self.gate_steps < 0 or self.micro_batch < 0:
            raise ValueError(f"gate_steps and micro_batch must be >= 0, got {self.gate_steps}, "
                             f"{self.micro_batch}")

    @property
    def phase_length(self) -> int:
        """K of w(k): ``phase_epochs`` for the code's schedule, else ``num_iters``."""
        if self.phase == "released" and self.phase_epochs is not None:
            return self.phase_epochs
        return self.num_iters


def released_phase_weight(it: int, num_iters: int) -> float:
    """The code's w(k) (``dp_actor.py``, ``_calculate_epoch_based_entropy_weight``, l.79-121, whose
    ``max_epochs`` the code sets to 150): with half = K // 2, 1 - 0.2 (1 - exp(-2 k / half)) for
    k <= half, then 0.8 exp(-3 (k - half) / (K - half)); k clamped to [0, K].

    >>> [round(released_phase_weight(k, 4), 4) for k in (0, 1, 2, 3, 4)]
    [1.0, 0.8736, 0.8271, 0.1785, 0.0398]
    """
    k = max(0, min(it, num_iters))
    half = num_iters // 2
    if k <= half:  # the code's order of operations, to the last bit
        return 1.0 if half == 0 else 1.0 - 0.2 * (1.0 - math.exp(-2.0 * (k / half)))
    return 0.8 * math.exp(-3.0 * ((k - half) / (num_iters - half)))


def phase_weight(it: int, num_iters: int, phase: str = "linear", w_late: float = 0.0,
                 switch: float = 0.5) -> float:
    """w(k) of the entropy term at iteration ``it`` (0-based) of K = ``num_iters``.

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


def released_penalty(entropies: torch.Tensor, h_bar, kappa_lo: float = 0.0,
                     kappa_hi: float = 2.0, out_range_penalty: float = 0.1):
    """The code's smoothing value on one micro-batch (``dp_actor.py``, ``generate_entropy_penalty``,
    mask_mode 'token', l.332-352, then the token mean ``agg_loss``): rho times the share of units
    (turns; tokens on an LM) whose entropy is not strictly inside (kappa_lo H_bar, kappa_hi H_bar).
    ``h_bar``: a float, or (N,) per unit (its turn index's historical mean). Built from
    comparisons, it has no gradient. Returns (P, metrics ``below``/``above``: the share at or under
    / at or over the band's edges).

    >>> p, m = released_penalty(torch.tensor([0.5, 1.0, 2.5]), 1.0, 0.0, 2.0, 0.1)
    >>> round(p.item(), 4), p.requires_grad, m["above"]
    (0.0333, False, 0.3333333333333333)
    """
    if entropies.ndim != 1 or entropies.numel() == 0:
        raise ValueError(f"entropies must be a non-empty (N,) tensor, got shape {tuple(entropies.shape)}")
    h = entropies.detach()
    hb = torch.as_tensor(h_bar, dtype=h.dtype, device=h.device)
    lo, hi = kappa_lo * hb, kappa_hi * hb
    within = (h > lo) & (h < hi)  # (N,) strict, as the code
    mask = torch.where(within, torch.zeros_like(h), torch.full_like(h, out_range_penalty))
    return mask.mean(), {"below": (h <= lo).double().mean().item(),
                         "above": (h >= hi).double().mean().item()}


def released_smoothing(entropies: torch.Tensor, h_bar, turns, rows=None, kappa_lo: float = 0.0,
                       kappa_hi: float = 2.0, out_range_penalty: float = 0.1,
                       micro_batch: int = 32, gate_steps: int = 50):
    """The code's smoothing value over a batch (``update_policy``): the units (turns, or an LM's
    tokens) in order, their turn rows ``rows`` (N,) (default: each unit its own row) cut into
    micro-batches of ``micro_batch`` rows (0: one; the code's ``mini_batch.split``, l.712); a
    micro-batch holding a turn index (``turns`` (N,)) >= gate_steps // 2 gets ``released_penalty``
    over its units, the others 0 (l.778, l.802); the value is the mean over micro-batches (each
    micro-batch's loss is divided by ``gradient_accumulation``, l.843, and their gradients add
    up). No gradient. Returns (P, metrics: below, above over all units, gated = the share of
    micro-batches the term is on in).
    """
    if entropies.ndim != 1 or entropies.numel() == 0:
        raise ValueError(f"entropies must be a non-empty (N,) tensor, got shape {tuple(entropies.shape)}")
    n = entropies.numel()
    turns = np.asarray(turns, dtype=np.int64).reshape(-1)
    rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
    hb = torch.as_tensor(h_bar, dtype=entropies.dtype, device=entropies.device).expand(n)
    if len(turns) != n or len(rows) != n:
        raise ValueError(f"turns ({len(turns)}) and rows ({len(rows)}) must match the {n} entropies")
    _, all_m = released_penalty(entropies, hb, kappa_lo, kappa_hi, out_range_penalty)
    chunk = rows // micro_batch if micro_batch else np.zeros(n, dtype=np.int64)
    values, gated = [], []
    for m in np.unique(chunk):
        sel = np.flatnonzero(chunk == m)
        on = gate_steps == 0 or bool(np.any(turns[sel] >= gate_steps // 2))
        gated.append(on)
        if on:
            values.append(released_penalty(entropies[sel], hb[sel], kappa_lo, kappa_hi,
                                           out_range_penalty)[0])
        else:
            values.append(torch.zeros((), dtype=entropies.dtype, device=entropies.device))
    return torch.stack(values).mean(), {**all_m, "gated": float(np.mean(gated))}


def epo_loss(entropies: torch.Tensor, h_bar, it: int, cfg: EPOConfig, turns=None, rows=None):
    """EPO's term at iteration ``it`` (module docstring), with w = w(k) on the term ``phase_on``
    names. 'released': -c w_b mean_t H_t + c beta w_s P, P from ``released_smoothing`` (the code
    multiplies its smoothing value by ``entropy_coeff`` too; P has no gradient; ``turns`` (N,) the
    units' turn indices, needed by the gate unless ``cfg.gate_steps`` = 0, ``rows`` their turn
    rows); 'hinge' / 'outside_abs': -c w_b mean_t H_t + beta w_s P. ``h_bar``: a float, (N,) per
    unit ('released' only), or None (no history yet: P = 0). Returns (loss, metrics: coef = c w_b,
    smooth_weight = w_s, penalty, h_bar (its mean over the units), below, above, gated)."""
    w = phase_weight(it, cfg.phase_length, cfg.phase, cfg.w_late, cfg.switch)
    w_b, w_s = (w, 1.0) if cfg.phase_on == "bonus" else (1.0, w)
    c_k = cfg.entropy_coef * w_b
    loss = -c_k * entropies.mean()
    metrics = {"coef": c_k, "smooth_weight": w_s, "penalty": 0.0, "h_bar": float("nan"),
               "below": 0.0, "above": 0.0, "gated": 0.0}
    if h_bar is not None:
        if cfg.penalty == "released":
            if turns is None:
                if cfg.gate_steps:
                    raise ValueError("the code's gate needs each unit's turn index (turns), or "
                                     "gate_steps = 0")
                turns = np.zeros(entropies.numel(), dtype=np.int64)
            pen, m = released_smoothing(entropies, h_bar, turns, rows, cfg.kappa_lo, cfg.kappa_hi,
                                        cfg.out_range_penalty, cfg.micro_batch, cfg.gate_steps)
            loss = loss + cfg.entropy_coef * cfg.beta * w_s * pen
        else:
            pen, m = smoothing_penalty(entropies, float(h_bar), cfg.kappa_lo, cfg.kappa_hi,
                                       cfg.penalty)
            loss = loss + cfg.beta * w_s * pen
        metrics.update(m, penalty=pen.item(), h_bar=float(np.mean(np.asarray(h_bar, dtype=float))))
    return loss, metrics


def step_means(entropies: torch.Tensor, turns, max_steps: int) -> np.ndarray:
    """One batch's entry of the code's history (``rollout_loop.py`` l.403-406, ``ray_trainer.py``
    l.1100-1108): the mean entropy of the units at each turn index 0 .. L-1 (L the batch's longest
    episode, at most ``max_steps``), left-padded with zeros to ``max_steps``: (max_steps,).

    >>> step_means(torch.tensor([1.0, 3.0, 2.0]), [0, 1, 0], 4).tolist()
    [0.0, 0.0, 1.5, 3.0]
    """
    h = entropies.detach().double().cpu().numpy()
    turns = np.asarray(turns, dtype=np.int64).reshape(-1)
    if len(turns) != len(h):
        raise ValueError(f"{len(turns)} turn indices for {len(h)} entropies")
    if turns.min() < 0 or turns.max() >= max_steps:
        raise ValueError(f"turn indices must lie in [0, {max_steps}), got {turns.min()}..{turns.max()}")
    steps = [float(h[turns == t].mean()) for t in range(turns.max() + 1)]
    return np.array([0.0] * (max_steps - len(steps)) + steps)


def mask_turns(loss_mask: torch.Tensor):
    """The units of an LM batch as the code's turn rows: for each token under the loss mask (B, T),
    in row-major order, its turn index within its conversation (a turn is a run of ones) and a
    running turn-row number over the batch. Returns (turns (n,), rows (n,)) numpy arrays.

    >>> mask_turns(torch.tensor([[1, 1, 0, 1], [0, 1, 0, 0]]))
    (array([0, 0, 1, 0]), array([0, 0, 1, 2]))
    """
    m = loss_mask.detach().bool().cpu()
    starts = m & ~torch.nn.functional.pad(m[:, :-1], (1, 0), value=False)  # (B, T) a run begins
    turn = starts.long().cumsum(-1) - 1  # (B, T) turn index within the row
    row_base = torch.cumsum(starts.sum(-1), 0) - starts.sum(-1)  # (B,) turn rows before each row
    rows = turn + row_base[:, None]
    return turn[m].numpy(), rows[m].numpy()


class EPORegulariser:
    """The stateful side of EPO: keeps each iteration's entropies and gives the trainers'
    ``regulariser`` hook EPO's term with H_bar from that history: history='turn' (the code), one
    H_bar per turn index from the per-step means (``step_means``) of every batch so far including
    the current one; 'all', the mean batch entropy of every batch so far including the current
    one; 'window', the mean of the last ``window`` past batches. A batch enters the history at the
    first call of its iteration (later PPO epochs of the same batch reuse the same H_bar).
    ``history`` keeps each batch's mean entropy (every form)."""

    def __init__(self, cfg: EPOConfig | None = None):
        self.cfg = cfg or EPOConfig()
        self.history: list[float] = []
        self.turn_history: list[np.ndarray] = []
        self._it: int | None = None
        self._h_bar = None
        self._turns = self._rows = None

    def h_bar(self):
        """The historical mean entropy of the history as it stands (None while it is empty):
        (max_steps,) per turn index for history='turn', else a float."""
        if not self.history:
            return None
        if self.cfg.history == "turn":
            return np.mean(np.array(self.turn_history), axis=0)  # ray_trainer.py l.1269
        past = self.history if self.cfg.history == "all" else self.history[-self.cfg.window:]
        return float(sum(past) / len(past))

    def observe(self, episodes):
        """Remember the turn index of each turn of ``episodes`` (in the order the trainer
        concatenates their entropies) for the next calls: the code's history and gate need it."""
        self._turns = np.concatenate([np.arange(len(ep)) for ep in episodes])
        self._rows = None

    def __call__(self, entropies: torch.Tensor, it: int, turns=None, rows=None):
        """agent_pg's hook: entropies (N,) with gradient, iteration -> (loss, metrics). ``turns``
        (N,): each unit's turn index (default: those of the last ``observe``); ``rows``: its turn
        row (default: each unit its own)."""
        if turns is None and self._turns is not None:
            turns, rows = self._turns, self._rows
        needs_turns = self.cfg.history == "turn" or (self.cfg.penalty == "released"
                                                     and self.cfg.gate_steps > 0)
        if needs_turns and (turns is None or len(turns) != entropies.numel()):
            raise ValueError("the code's history and gate need each entropy's turn index: call "
                             "observe(episodes) on the batch first, or pass turns")
        if it != self._it:  # a new batch: remember it, H_bar with it ('turn', 'all') or before it
            self._it = it
            if self.cfg.history == "window":
                self._h_bar = self.h_bar()
            self.history.append(float(entropies.detach().mean()))
            if self.cfg.history == "turn":
                self.turn_history.append(step_means(entropies, turns, self.cfg.max_steps))
            if self.cfg.history != "window":
                self._h_bar = self.h_bar()
        h_bar = self._h_bar
        if self.cfg.history == "turn":  # each unit's H_bar at its turn index (dp_actor.py l.328)
            h_bar = self._h_bar[np.asarray(turns, dtype=np.int64)]
        return epo_loss(entropies, h_bar, it, self.cfg, turns, rows)

    def lm(self, entropies: torch.Tensor, loss_mask: torch.Tensor, it: int):
        """grpo's hook: token entropies (B, T) and the loss mask (B, T); the turns' tokens (mask 1)
        are the units of the mean and of the band, each turn (a run of ones) one of the code's
        turn rows (``mask_turns``)."""
        if entropies.shape != loss_mask.shape:
            raise ValueError(f"entropies {tuple(entropies.shape)} and loss_mask "
                             f"{tuple(loss_mask.shape)} must have the same shape")
        turns, rows = mask_turns(loss_mask)
        return self(entropies[loss_mask.bool()], it, turns, rows)  # (sum of mask,)
