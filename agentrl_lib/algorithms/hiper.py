"""HiPER's hierarchical advantage estimation (HAE) and Hi-Agent's subgoal-level GRPO.

HiPER (Peng et al. 2026, "HiPER: Hierarchical Reinforcement Learning with Explicit Credit
Assignment for Large Language Model Agents", arXiv:2602.16165) factorises the agent into a
planner that proposes a subgoal and an executor that acts for several turns until the subgoal is
reached. A *segment* is
one subgoal's execution: turns b_k .. e_k - 1 of an episode. HAE assigns credit at both levels:

- the executor's turn t in segment k gets GAE whose lambda-trace is cut at the segment's end,
  bootstrapping there with the value of the state where the next subgoal starts (released
  ``compute_hae_advantage`` §1):

      delta_t = r_t + gamma V(s_{t+1}) - V(s_t),        (V = 0 after a terminal step)
      A^L_t   = sum_{j=t}^{e_k - 1} (gamma lam)^{j - t} delta_j;

- the planner's decision at the segment's first turn b_k gets a GAE over *segments* (an SMDP
  across the boundaries, the released ``hiper_hae/core_hae.py``, ``compute_hae_advantage`` §2):
  each segment's TD error is its return aggregated over the subgoal's execution, and the trace
  runs on to the later segments with ``lam_seg`` (``algorithm.hae.lam_seg: 0.95``):

      delta^H_k = sum_{j=b_k}^{e_k - 1} gamma^{j - b_k} r_j + gamma^{d_k} V(s_{e_k}) - V(s_{b_k}),
      A^H_k     = delta^H_k + gamma^{d_k} lam_seg A^H_{k+1},        d_k = e_k - b_k.

  (``planner_lam`` = 1, the default and the released form: delta^H_k is the executor's sum over
  the segment with lam = 1; ``lam_seg`` = 0 is the one-segment planner of before issue 27,
  ``ONE_SEGMENT_PLANNER``.) A tabular agent has one action per turn, so at b_k A^H replaces A^L
  (the released code puts A^H on the ``<subgoal>`` tokens and A^L on the action tokens).
- ``norm_adv=True`` standardises as the released script (``algorithm.hae.norm_adv=True``):
  A^L over every turn of the batch and A^H over the segment starts, separately,
  (A - mean) / (std(ddof=0) + 1e-8), centred and batch-wide (not per group).

With the exact (time-indexed) V^pi each delta_j is a martingale difference: every A above is an
unbiased estimate of A^pi(s_t, a_t) (before the standardisation), and a sum cut at e_k (or
continued with weights lam_seg <= 1) has no more variance than the flat sum to the episode's end
(flat GAE with the same lam, the special case of one segment per episode, which equals
``credit.turn_gae``). That is the paper's "unbiased and provably lower variance than flat GAE"
(by "boundary bootstrapping", in its words). The released critic has three heads (executor,
planner, termination) and the planner decides KEEP or SWITCH each turn; here one V serves both
levels and segments are given (notebook 40 and ``reproductions/fidelity/40_hiper.md`` say which
details differ). The released runs use gamma = lam = 1: flat GAE is then a Monte-Carlo return
minus V, and HAE replaces everything after the subgoal by V at the subgoal in the executor's
advantage. ``standardise_turns`` is the flat baseline's whitening (verl's GAE path whitens the
batch's tokens).

Hi-Agent ("Hi-Agent: Hierarchical Vision-Language Agents for Mobile Device
Control"): critic-free GRPO at the subgoal level with a *foresight* term (inferred form):
segment k of episode i is scored R(tau_i) + foresight * 1[segment k reached its subgoal],
normalised among the segments of one group that start from the same state (for stage segments,
all episodes that reached stage k start it at the same waypoint), and broadcast to its turns.

Segments (one int per turn, non-decreasing, starting at 0):
- ``stage_segments(episodes)``: a new segment whenever the stage in the state key changes
  (``SubtaskGridEnv`` keys (cell, stage)): one segment per subgoal. Use this on subtask batches.
- ``fixed_segments(episodes, length)``: turns t // length, for a flat gridworld with no stages.

For the credit arena (``GridAgentEnv``, no stages), use::

    hiper_advantages(episodes, fixed_segments(episodes, 5), values=batch_values(episodes))

``batch_values`` is the critic-free value of the batch: the mean discounted return-to-go of the
group's turns from the same state key (GiGPO's anchor mean). With a critic, pass its V(s_t); with
the exact time-indexed V^pi_t(s_t) (``dp.finite_horizon_advantages``; ``last_values`` 0 at the
turn cap) HAE is unbiased, the setting of the paper's theorem (notebook 40, section 4). With a
learned critic the cut at each boundary passes the critic's error there to the whole segment:
notebook 40 measures that HAE then trains *worse* than flat GAE on 2-4 subtasks.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

import torch

from agentrl_lib import core
from agentrl_lib.algorithms import credit

ONE_SEGMENT_PLANNER = {"lam_seg": 0.0}
"""The planner's form before issue 27 (``hiper_advantages(..., **ONE_SEGMENT_PLANNER)``): A^H_k is
its own segment's TD error only (delta^H_k, a segment-level TD(0)); kept as a variant because it
is HAE's least-variance planner credit with the exact V (notebook 40, section 4)."""


def _check_segments(episodes, segments) -> list[np.ndarray]:
    if len(segments) != len(episodes):
        raise ValueError(f"segments has {len(segments)} entries for {len(episodes)} episodes")
    out = []
    for i, (ep, seg) in enumerate(zip(episodes, segments)):
        seg = np.asarray(seg, dtype=np.int64)
        if seg.shape != (len(ep),):
            raise ValueError(f"segments[{i}] has shape {seg.shape}, episode {i} has {len(ep)} turns")
        if len(seg) and (seg[0] != 0 or np.any(np.diff(seg) < 0)):
            raise ValueError(f"segments[{i}] must start at 0 and never decrease, got {seg.tolist()}")
        out.append(seg)
    return out


def fixed_segments(episodes, length: int) -> list[np.ndarray]:
    """Segment id t // length of every turn, (T_i,) int each: a flat batch cut into pieces of
    ``length`` turns (subgoals of a fixed duration).

    >>> from agentrl_lib.rollout import Episode
    >>> fixed_segments([Episode.of("abcde", [0] * 5)], 2)[0].tolist()
    [0, 0, 1, 1, 2]
    """
    if length < 1:
        raise ValueError(f"segment length must be >= 1, got {length}")
    return [np.arange(len(ep)) // length for ep in episodes]


def stage_segments(episodes, stage_of=None) -> list[np.ndarray]:
    """One segment per subgoal: the segment id counts the stage changes in the state keys before
    turn t (``stage_of(key)`` defaults to ``key[1]``, the stage of ``SubtaskGridEnv``'s (cell,
    stage)). The turn that reaches a waypoint closes its segment; the next turn opens a new one.
    On ``GridAgentEnv`` keys (cell, goal) the value read is the goal, constant in an episode, so
    every episode is one segment (flat GAE): use ``fixed_segments`` there.

    >>> from agentrl_lib.rollout import Episode
    >>> ep = Episode.of([((0, 0), 0), ((0, 1), 0), ((0, 2), 1), ((0, 3), 1), ((0, 4), 2)], [0] * 5)
    >>> stage_segments([ep])[0].tolist()
    [0, 0, 1, 1, 2]
    """
    stage_of = stage_of or (lambda k: k[1])
    out = []
    for i, ep in enumerate(episodes):
        try:
            stages = [stage_of(k) for k in ep.state_keys]
        except (TypeError, IndexError) as err:
            raise ValueError(f"episode {i}: cannot read a stage from its state keys "
                             f"({ep.state_keys[:1]!r}); stage_segments needs (cell, stage) keys "
                             "(SubtaskGridEnv) or a stage_of function; use fixed_segments for a "
                             "flat gridworld") from err
        change = np.r_[0, np.array([a != b for a, b in zip(stages[:-1], stages[1:])], dtype=np.int64)]
        out.append(np.cumsum(change)[:len(ep)])
    return out


def segment_starts(seg: np.ndarray) -> np.ndarray:
    """Boolean (T,): True on the first turn of each segment (the planner's turns)."""
    seg = np.asarray(seg)
    return np.r_[True, seg[1:] != seg[:-1]][:len(seg)]


def batch_values(episodes, gamma: float = 0.95, key=None) -> list[np.ndarray]:
    """V_hat(s_t): the mean discounted return-to-go of the turns of the same group acting from the
    same state key (``credit.anchor_groups``), (T_i,) each. A critic-free value from the batch; on
    a singleton anchor it is the turn's own return (then delta carries no signal there)."""
    rtg = credit.episode_returns_to_go(episodes, gamma)
    vals = [np.zeros(len(ep)) for ep in episodes]
    for members in credit.anchor_groups(episodes, key).values():
        v = float(np.mean([rtg[i][t] for i, t in members]))
        for i, t in members:
            vals[i][t] = v
    return vals


def _hae(episodes, segments, values, last_values, gamma, lam, planner_lam, lam_seg):
    """(A^L per turn (T_i,), A^H per segment (K_i,), segment starts (T_i,) bool) per episode."""
    segments = _check_segments(episodes, segments)
    if values is None:
        values = batch_values(episodes, gamma)
    low, high, starts = [], [], []
    for i, (ep, seg) in enumerate(zip(episodes, segments)):
        T = len(ep)
        v = np.asarray(values[i], dtype=np.float64)
        if v.shape != (T,):
            raise ValueError(f"values[{i}] has shape {v.shape}, episode {i} has {T} turns")
        r = np.asarray(ep.rewards, dtype=np.float64)  # (T,)
        v_end = 0.0 if (last_values is None or not ep.truncated) else float(last_values[i])
        v_next = np.r_[v[1:], v_end]  # (T,) V(s_{t+1})
        delta = r + gamma * v_next - v  # (T,)
        adv, acc = np.zeros(T), np.zeros(T)  # executor trace (lam), planner's in-segment (planner_lam)
        for t in range(T - 1, -1, -1):
            cut = t == T - 1 or seg[t + 1] != seg[t]  # the trace ends at the segment's end
            adv[t] = delta[t] + (0.0 if cut else gamma * lam * adv[t + 1])
            acc[t] = delta[t] + (0.0 if cut else gamma * planner_lam * acc[t + 1])
        st = segment_starts(seg)
        b = np.flatnonzero(st)  # (K,) b_k
        d = np.diff(np.r_[b, T])  # (K,) d_k, turns of each segment
        a_h = acc[b].copy()  # (K,) delta^H_k
        for k in range(len(b) - 2, -1, -1):  # segment-level GAE (compute_hae_advantage §2)
            a_h[k] += gamma ** d[k] * lam_seg * a_h[k + 1]
        low.append(adv)
        high.append(a_h)
        starts.append(st)
    return low, high, starts


def hiper_advantages(episodes, segments, values=None, last_values=None, gamma: float = 0.95,
                     lam: float = 1.0, planner_lam: float = 1.0, lam_seg: float = 0.95,
                     norm_adv: bool = False, eps: float = 1e-8) -> list[np.ndarray]:
    """HAE: one advantage per turn, (T_i,) float64 per episode (module docstring's equations):
    A^L_t on the executor's turns, A^H_k on each segment's first turn b_k.

    segments: per episode, a segment id per turn (``stage_segments``, ``fixed_segments``).
    values: per episode, V(s_t) per turn, (T_i,); None: ``batch_values(episodes, gamma)``.
    last_values: per episode, V of the state after the last turn when the episode was truncated
        (ignored when it terminated); default 0 (the finite-horizon value at the turn cap).
    lam: the executor's trace within a segment (1: the segment's return to its end).
    planner_lam: the trace within its segment of each segment's first turn (1, released: the
        return aggregated over the subgoal's execution, delta^H_k).
    lam_seg: the segment-level trace across boundaries (0.95, released ``algorithm.hae.lam_seg``;
        0: ``ONE_SEGMENT_PLANNER``).
    norm_adv: standardise as released: A^L over every turn of the batch and A^H over the segment
        starts, separately, (A - mean) / (std(ddof=0) + eps); a level with one entry becomes 0.

    One segment per episode and planner_lam == lam is flat turn GAE (``credit.turn_gae``; with
    ``norm_adv`` its first turns are then standardised apart: use ``standardise_turns`` for the
    flat baseline).
    """
    low, high, starts = _hae(episodes, segments, values, last_values, gamma, lam, planner_lam,
                             lam_seg)
    if norm_adv:
        low = standardise_turns(low, eps=eps)
        high = standardise_turns(high, eps=eps)
    out = []
    for a_l, a_h, st in zip(low, high, starts):
        a = a_l.copy()
        a[st] = a_h
        out.append(a)
    return out


def planner_advantages(episodes, segments, values=None, last_values=None, gamma: float = 0.95,
                       planner_lam: float = 1.0, lam_seg: float = 0.95) -> list[np.ndarray]:
    """A^H_k of every segment, (K_i,) per episode: the segment-level GAE of the module docstring
    (``hiper_advantages`` read at the segment starts, unnormalised)."""
    return _hae(episodes, segments, values, last_values, gamma, 1.0, planner_lam, lam_seg)[1]


def standardise_turns(adv, select=None, eps: float = 1e-8) -> list[np.ndarray]:
    """(A - mean) / (std(ddof=0) + eps) over the entries of the whole batch (where ``select``, a
    (T_i,) bool per episode, is True; the others are left as they are), ``core.whiten``: the
    released HAE's per-level standardisation, and the flat GAE baseline's batch whitening.

    >>> [a.tolist() for a in standardise_turns([np.array([1.0, 3.0]), np.array([2.0])], eps=0)]
    [[-1.224744871391589, 1.224744871391589], [0.0]]
    """
    adv = [np.asarray(a, dtype=np.float64) for a in adv]
    if select is None:
        select = [np.ones(len(a), dtype=bool) for a in adv]
    flat = np.concatenate([a for a in adv] or [np.zeros(0)])  # (N,) every turn of the batch
    mask = np.concatenate([np.asarray(s, dtype=bool) for s in select] or [np.zeros(0, bool)])
    if not mask.any():
        return [a.copy() for a in adv]
    x = torch.as_tensor(flat)
    m = torch.as_tensor(mask)
    z = core.whiten(x[m], ddof=0, eps=eps).numpy()  # the selected entries, standardised
    flat = flat.copy()
    flat[mask] = z
    return np.split(flat, np.cumsum([len(a) for a in adv])[:-1])


def segment_success(episodes, segments) -> list[np.ndarray]:
    """1.0 for each segment that reached its subgoal, (K_i,) per episode: every segment that is
    followed by another one, and the last one when the episode ended by success."""
    segs = _check_segments(episodes, segments)
    out = []
    for ep, seg in zip(episodes, segs):
        k = int(seg[-1]) + 1 if len(seg) else 0
        ok = np.ones(k)
        if k and not ep.success:
            ok[-1] = 0.0
        out.append(ok)
    return out


def hiagent_advantages(episodes, segments, foresight: float = 1.0, gamma: float = 1.0,
                       norm_adv: bool = True, ddof: int = 1, eps: float = 1e-4,
                       key=None) -> list[np.ndarray]:
    """Hi-Agent's subgoal-level GRPO with a foresight term (inferred form), (T_i,) per episode.

    Segment k of episode i is scored  y_{i,k} = R(tau_i) + foresight * c_{i,k},  R the episode's
    discounted return (``gamma``; 1: the outcome), c the segment's completion (``segment_success``).
    Scores are normalised (``credit.group_normalise``: ddof, eps, zero for a group of one or all-equal
    scores) among the segments of one group that start from the same state key (``key(ep, t)``,
    default ``ep.state_keys[t]``), and each segment's advantage is copied to its turns.
    With foresight = 0 and one segment per episode this is ``credit.grpo_broadcast``.
    """
    segs = _check_segments(episodes, segments)
    key = key or (lambda ep, t: ep.state_keys[t])
    rets = [g[0] if len(g) else 0.0 for g in credit.episode_returns_to_go(episodes, gamma)]
    done = segment_success(episodes, segs)
    groups = defaultdict(list)  # (group, start key) -> [(episode, segment)]
    for i, (ep, seg) in enumerate(zip(episodes, segs)):
        for t in np.flatnonzero(segment_starts(seg)):
            groups[(ep.group_id, key(ep, int(t)))].append((i, int(seg[t])))
    y = [rets[i] + foresight * d for i, d in enumerate(done)]  # (K_i,) segment scores
    seg_adv = credit.normalise_within(y, groups.values(), norm_adv, ddof, eps)
    return [sa[seg] if len(seg) else np.zeros(0) for sa, seg in zip(seg_adv, segs)]
