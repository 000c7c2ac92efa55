"""HiPER's hierarchical advantage estimation (HAE) and Hi-Agent's subgoal-level GRPO.

HiPER (Peng et al. 2026, "HiPER: Hierarchical Reinforcement Learning with Explicit Credit
Assignment for Large Language Model Agents", arXiv:2602.16165) factorises the agent into a
planner that proposes a subgoal and an executor that acts for several turns until the subgoal is
reached. A *segment* is
one subgoal's execution: turns b_k .. e_k - 1 of an episode. HAE assigns credit at both levels:

- the executor's turn t in segment k gets GAE whose lambda-trace is cut at the segment's end,
  bootstrapping there with the value of the state where the next subgoal starts:

      delta_t = r_t + gamma V(s_{t+1}) - V(s_t),        (V = 0 after a terminal step)
      A^L_t   = sum_{j=t}^{e_k - 1} (gamma lam)^{j - t} delta_j;

- the planner's decision at the segment's first turn b_k gets the return aggregated over the
  whole execution of its subgoal (``planner_lam`` = 1, the default):

      A^H_k = sum_{j=b_k}^{e_k - 1} gamma^{j - b_k} r_j + gamma^{e_k - b_k} V(s_{e_k}) - V(s_{b_k}).

With the exact (time-indexed) V^pi each delta_j is a martingale difference: every A above is an
unbiased estimate of A^pi(s_t, a_t), and a sum cut at e_k has no more variance than the flat sum
to the episode's end (flat GAE with the same lam, the special case of one segment per episode,
which equals ``credit.turn_gae``). That is the paper's "unbiased and provably lower variance than
flat GAE" (by "boundary bootstrapping", in its words), in the form we infer: the paper trains a
PPO critic with two heads (planner and executor values) and lets the planner KEEP or SWITCH the
subgoal each turn; here one V serves both levels and segments are given (notebook 40 says which
details are inferred). LLM PPO usually runs gamma = lam = 1: flat GAE is then a Monte-Carlo return minus V,
and HAE replaces everything after the subgoal by V at the subgoal.

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

from agentrl_lib.algorithms import credit


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


def hiper_advantages(episodes, segments, values=None, last_values=None, gamma: float = 0.95,
                     lam: float = 1.0, planner_lam: float = 1.0, norm_adv: bool = False,
                     ddof: int = 1, eps: float = 1e-4) -> list[np.ndarray]:
    """HAE: one advantage per turn, (T_i,) float64 per episode (module docstring's equations).

    segments: per episode, a segment id per turn (``stage_segments``, ``fixed_segments``).
    values: per episode, V(s_t) per turn, (T_i,); None: ``batch_values(episodes, gamma)``.
    last_values: per episode, V of the state after the last turn when the episode was truncated
        (ignored when it terminated); default 0 (the finite-horizon value at the turn cap).
    lam: the executor's trace within a segment (1: the segment's return to its end).
    planner_lam: the trace of each segment's first turn (1: the return aggregated over the
        subgoal's execution, A^H_k).
    norm_adv: divide by the std (``ddof``) of the turn advantages of the episode's group, plus
        ``eps`` (scale only: centring would bias a critic-based advantage); a group with fewer
        than two turns or zero spread is left unscaled.

    One segment per episode and planner_lam == lam is flat turn GAE (``credit.turn_gae``).
    """
    segments = _check_segments(episodes, segments)
    if values is None:
        values = batch_values(episodes, gamma)
    out = []
    for i, (ep, seg) in enumerate(zip(episodes, segments)):
        T = len(ep)
        v = np.asarray(values[i], dtype=np.float64)
        if v.shape != (T,):
            raise ValueError(f"values[{i}] has shape {v.shape}, episode {i} has {T} turns")
        r = np.asarray(ep.rewards, dtype=np.float64)  # (T,)
        v_end = 0.0 if (last_values is None or not ep.truncated) else float(last_values[i])
        v_next = np.r_[v[1:], v_end]  # (T,) V(s_{t+1})
        delta = r + gamma * v_next - v  # (T,)
        adv = np.zeros(T)
        starts = segment_starts(seg)
        for t in range(T - 1, -1, -1):
            cut = t == T - 1 or seg[t + 1] != seg[t]  # the trace ends at the segment's end
            adv[t] = delta[t] + (0.0 if cut else gamma * lam * adv[t + 1])
        if planner_lam != lam:
            acc = np.zeros(T)  # the same recursion with planner_lam, read at segment starts
            for t in range(T - 1, -1, -1):
                cut = t == T - 1 or seg[t + 1] != seg[t]
                acc[t] = delta[t] + (0.0 if cut else gamma * planner_lam * acc[t + 1])
            adv[starts] = acc[starts]
        out.append(adv)
    if norm_adv:
        out = _scale_by_group(episodes, out, ddof, eps)
    return out


def planner_advantages(episodes, segments, values=None, last_values=None,
                       gamma: float = 0.95) -> list[np.ndarray]:
    """A^H_k of every segment, (K_i,) per episode: the segment's discounted return plus
    gamma^{L_k} V at the next subgoal, minus V at its own start (``hiper_advantages`` at the
    segment starts with planner_lam = 1)."""
    adv = hiper_advantages(episodes, segments, values, last_values, gamma, lam=1.0, planner_lam=1.0)
    segs = _check_segments(episodes, segments)
    return [a[segment_starts(s)] for a, s in zip(adv, segs)]


def _scale_by_group(episodes, adv, ddof, eps):
    out = [a.copy() for a in adv]
    for idx in credit.groups_of(episodes).values():
        flat = np.concatenate([adv[i] for i in idx]) if idx else np.zeros(0)
        if len(flat) < 2 or np.all(flat == flat[0]):
            continue
        s = flat.std(ddof=ddof)
        for i in idx:
            out[i] = adv[i] / (s + eps)
    return out


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
