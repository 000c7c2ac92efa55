"""SALT: step-level advantages from a trajectory graph of each group's episodes.

Li, Wang, Yan, Tian, Xu, Song, Xu, Cheong (2025), "SALT: Step-level Advantage Assignment for
Long-horizon Agents via Trajectory Graph", arXiv:2510.20022 (Findings of EACL 2026).

The G episodes of one task (one ``group_id``) are merged into a graph: a step is an edge
(node --a--> next node), and steps that two episodes share become one edge. Each episode i
first gets its outcome advantage A_i (GRPO's: the return normalised in its group); each step
then gets the mean outcome advantage of all the traversals of its edge,

    A_t^i = mean_{(j, k) in E(e_t^i)} A_j ,        e_t^i = (node(s_t^i), a_t^i)      (form='edge_mean')

so a step shared by successes and failures alike (a "neutral" step) is pulled toward 0, and a
step only one kind of episode took (a "decisive" step) keeps its episode's sign. A step that no
other episode shares keeps A_i: on a group with no shared steps SALT is GRPO. With
``merge='history'`` two steps merge only when the whole history up to and including the action
is equal (the graph is the prefix tree of the group): a prefix shared by every episode of a group
gets exactly 0 (the mean of a normalised group). With ``merge='state'`` (the default here) the
node is the state alone, so steps from the same state merge wherever they occur (a graph with
joins and loops).

``form='edge_minus_node'`` is the catalogue's variant (ours, not the paper's): the edge mean minus
the mean over all traversals of the edge's source node, A_t = mean_E(e) A - mean_N(s) A, a
Q-minus-V reading of the same graph; a step alone at its node then gets 0.

Taken from the paper: the graph of one prompt's group, merging identical steps, step advantages
derived only from the outcome rewards, a drop-in for GRPO's advantage with no extra rollouts.
Inferred (the paper's code was not public to us): the node key (the environment's state here;
the history for 'history'), a step's action identity (``action_ids`` when recorded, else the
action text), the mean over traversals (an episode that takes the same edge twice counts twice),
and the outcome = the discounted return from the first turn with ``gamma`` (``gamma=1`` is the
paper's sparse R(tau)). Group normalisation follows ``credit.py``: ddof=1, eps=1e-4, 0 for a
group of one or of all-equal returns.

The arena (notebook 34) calls ``salt_advantages(episodes, gamma=0.95)`` on a GridAgentEnv batch
directly: everything it needs is in the record (``state_keys``, ``action_ids``, ``group_id``,
``rewards``).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from agentrl_lib.algorithms.credit import episode_advantages

MERGES = ("state", "history")
FORMS = ("edge_mean", "edge_minus_node")


def _action(ep, t):
    """The identity of action t: its index when the record has one, else its text."""
    return ep.action_ids[t] if ep.action_ids is not None else ep.actions[t]


def trajectory_graph(episodes, merge: str = "state", key=None) -> tuple[dict, dict]:
    """The group graphs of a batch: (edges, nodes), each {merge key: [(episode, turn), ...]}.

    An edge key is (group_id, node, action) and a node key (group_id, node); ``node`` is
    ``key(ep, t)`` (default ``ep.state_keys[t]``) for merge='state', and the tuple of
    (key, action) of turns 0..t-1 followed by key(ep, t) for merge='history' (the prefix tree).
    Episodes of different groups never share a node.

    >>> from agentrl_lib.rollout import Episode
    >>> eps = [Episode.of(["s", "x"], [0, 1]), Episode.of(["s", "y"], [0, 0])]
    >>> edges, nodes = trajectory_graph(eps)
    >>> edges[(0, "s", "a")], nodes[(0, "x")]
    ([(0, 0), (1, 0)], [(0, 1)])
    """
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    key = key or (lambda ep, t: ep.state_keys[t])
    edges, nodes = defaultdict(list), defaultdict(list)
    for i, ep in enumerate(episodes):
        if ep.action_ids is None and len(ep.actions) != len(ep.state_keys):
            raise ValueError(f"episode {i}: {len(ep.actions)} actions but "
                             f"{len(ep.state_keys)} state keys")
        prefix = ()
        for t in range(len(ep)):
            a = _action(ep, t)
            node = key(ep, t) if merge == "state" else prefix + (key(ep, t),)
            nodes[(ep.group_id, node)].append((i, t))
            edges[(ep.group_id, node, a)].append((i, t))
            if merge == "history":
                prefix = node + (a,)
    return dict(edges), dict(nodes)


def merged_share(episodes, merge: str = "state", key=None, min_size: int = 2) -> float:
    """The fraction of the batch's turns whose edge is traversed at least ``min_size`` times:
    where SALT can differ from GRPO. 0.0 for a batch without turns."""
    turns = sum(len(ep) for ep in episodes)
    if turns == 0:
        return 0.0
    edges, _ = trajectory_graph(episodes, merge, key)
    return sum(len(m) for m in edges.values() if len(m) >= min_size) / turns


def salt_advantages(episodes, gamma: float = 0.95, norm_adv: bool = True, ddof: int = 1,
                    eps: float = 1e-4, merge: str = "state", form: str = "edge_mean",
                    key=None) -> list[np.ndarray]:
    """SALT's step advantages, one float64 array (T_i,) per episode.

    A_i = the group-normalised discounted return of episode i (``credit.episode_advantages``);
    form='edge_mean':        A_t^i = mean over the traversals (j, k) of edge e_t^i of A_j
    form='edge_minus_node':  A_t^i = that mean - the mean of A_j over the traversals of node s_t^i
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    a_traj = episode_advantages(episodes, gamma, norm_adv, ddof, eps)  # (num_episodes,)
    edges, nodes = trajectory_graph(episodes, merge, key)
    adv = [np.zeros(len(ep)) for ep in episodes]
    for members in edges.values():
        value = np.mean([a_traj[i] for i, _ in members])
        for i, t in members:
            adv[i][t] = value
    if form == "edge_minus_node":
        for members in nodes.values():
            baseline = np.mean([a_traj[i] for i, _ in members])
            for i, t in members:
                adv[i][t] -= baseline
    return adv
