"""The memory gridworld of HGPO: an agent whose prompt holds the task and its last k steps, and
the exact A^pi of such an agent.

HGPO (He et al. 2026, "Hierarchy-of-Groups Policy Optimization for Long-Horizon Agentic Tasks",
arXiv:2602.22817) studies *stepwise* agents: the prompt of turn t is the task plus a memory of the
last few (observation, action) steps, not the whole conversation. Two turns in the same state can
then see different prompts, act differently, and have different values: GiGPO's state-anchored
groups compare them as if they were one situation ("context inconsistency").

Here that agent is exact. ``GridAgentEnv(memory=True)`` shows the goal in the first observation
only; the agent keeps the task (the goal, inside every state key) and a window of its last
``window`` steps. Its context at turn t is the k-step context operator of the paper,

    C_k(h_t) = ((s_{t-k}, a_{t-k}), ..., (s_{t-1}, a_{t-1}), s_t),   k = 0, 1, ..., or None (all),

over the state keys s (cell, goal) and action indices a (into ``env.actions``); a turn t < k has
the shorter tuple of its whole history, so it only matches turns with the same whole history.
``context_key`` is C_k; ``MemoryGridEnv`` is a ``GridAgentEnv`` that records its history so a
policy can read ``env.context(k)`` while playing.

``WindowOracle`` gives the exact finite-horizon values of a policy pi(a | C_W(h_t)). Under such a
policy the future depends on the history only through (t, C_W(h_t)) (the turn cap makes t count),
so with H = the turn cap

    Q(t, c, a) = R(s, a) + gamma sum_s' P(s' | s, a) [s' not terminal] V(t + 1, c')
                 (Q = R at t = H - 1),
    V(t, c) = sum_a pi(a | c) Q(t, c, a),   A^pi_t = Q(t, c_t, a_t) - V(t, c_t),

with s the last state of c and c' = C_W of the history extended by (s, a) and s'. The recursion
runs over the graph of contexts reachable from the task's start (``context_graph``).
With window 0 the policy is Markov
and the values equal ``dp.finite_horizon_advantages`` (tests/test_hgpo.py checks this). With
gamma = 1, goal_reward = 1 and no step reward or penalty, V(0, (s_0,)) is the exact probability
of success (``success``).

The environment module imports nothing from algorithms; the window policy lives in
``algorithms/hgpo.py`` (``WindowTablePolicy``).
"""

from __future__ import annotations

import numpy as np

from agentrl_lib.envs.multiturn import GridAgentEnv


def context_key(state_keys, action_ids, t: int, k: int | None) -> tuple:
    """C_k(h_t): the last k (state, action) pairs before turn t and the state of turn t, as a
    flat tuple (s_{t-k}, a_{t-k}, ..., s_{t-1}, a_{t-1}, s_t); the whole history when k is None
    or k > t.

    >>> context_key(["a", "b", "c"], [0, 1, 2], 2, 1)
    ('b', 1, 'c')
    >>> context_key(["a", "b", "c"], [0, 1, 2], 1, 5), context_key(["a", "b"], [0, 1], 1, 0)
    (('a', 0, 'b'), ('b',))
    """
    if k is not None and k < 0:
        raise ValueError(f"context depth k must be >= 0 or None, got {k}")
    if t < 0 or t >= len(state_keys):
        raise ValueError(f"turn {t} outside the {len(state_keys)} recorded states")
    start = 0 if k is None else max(0, t - k)
    out = []
    for j in range(start, t):
        out += [state_keys[j], action_ids[j]]
    return tuple(out) + (state_keys[t],)


class MemoryGridEnv(GridAgentEnv):
    """``GridAgentEnv`` with ``memory=True`` by default that records the episode's state keys and
    action indices, so a policy conditioned on C_k reads ``env.context(k)`` while playing.

    ## Description
    HGPO's stepwise agent (module docstring): the goal shows on the first turn only, and the history
    (``history_states``, ``history_actions``) gives the k-step context C_k.

    ## Actions
    As ``GridAgentEnv``; an action text that does not parse is recorded as -1.

    ## Observations
    As ``GridAgentEnv`` with memory=True.

    ## Rewards
    As ``GridAgentEnv``.

    ## Episode end
    As ``GridAgentEnv``: terminated at the goal, truncated at ``max_turns``.

    ## Info
    As ``GridAgentEnv``.

    ## Arguments
    Those of ``GridAgentEnv``; memory defaults to True.

    ## Exact form
    ``WindowOracle``: the exact V and A^pi of a policy pi(a | C_W(h_t)) over the contexts reachable
    from each task's start (``context_graph``).
    """

    def __init__(self, *args, memory: bool = True, **kwargs):
        super().__init__(*args, memory=memory, **kwargs)
        self.history_states: list = []
        self.history_actions: list = []

    def reset(self, seed: int | None = None, task: tuple | None = None) -> str:
        obs = super().reset(seed=seed, task=task)
        self.history_states, self.history_actions = [self.state_key()], []
        return obs

    def step(self, action_text: str):
        out = super().step(action_text)
        a = out[3]["action"]
        self.history_actions.append(self.actions.index(a) if a is not None else -1)
        self.history_states.append(self.state_key())
        return out

    def context(self, k: int | None) -> tuple:
        """C_k of the current turn."""
        return context_key(self.history_states, self.history_actions,
                           len(self.history_states) - 1, k)


_GRAPHS: dict = {}
"""the context graph of each (game, task, window, horizon), shared by every oracle (policy-free)"""


def context_graph(env: GridAgentEnv, task: tuple, window: int, horizon: int):
    """The contexts C_window reachable from the task's start within ``horizon`` turns and their
    transitions: (contexts (list, index = row), index {context: row}, src (E,) = row * A + action,
    dst (E,) = next row, prob (E,), reward (C * A,)). A transition into the goal (terminal) ends
    the episode and has no edge; its reward is in ``reward``. Cached per game."""
    start, goal = tuple(map(tuple, task))
    key = (tuple(env.layout), tuple(sorted(env.kw.items())), (start, goal), int(window),
           int(horizon))
    if key in _GRAPHS:
        return _GRAPHS[key]
    mdp = env.tabular_form(start, goal)
    P, R, live = mdp.P.numpy(), mdp.R.numpy(), ~mdp.terminal.numpy()
    tab = [env.action_index(a) for a in env.actions]  # text action j -> tabular index
    keep = 2 * int(window) + 1
    first = ((start, goal),)
    contexts, index = [first], {first: 0}
    src, dst, prob, reward = [], [], [], []
    frontier, depth = [first], 0
    while frontier:
        new = []
        for ctx in frontier:
            i = index[ctx]
            cell = ctx[-1][0]
            s = cell[0] * env.cols + cell[1]
            for j, a in enumerate(tab):
                reward.append((i * len(tab) + j, R[s, a]))
                if depth + 1 >= horizon:
                    continue
                for s2 in np.flatnonzero(P[s, a] > 0):
                    if not live[s2]:
                        continue
                    full = ctx + (j, (env.cell(int(s2)), goal))
                    nxt = full[-keep:]
                    if nxt not in index:
                        index[nxt] = len(contexts)
                        contexts.append(nxt)
                        new.append(nxt)
                    src.append(i * len(tab) + j)
                    dst.append(index[nxt])
                    prob.append(P[s, a, s2])
        frontier, depth = new, depth + 1
    r = np.zeros(len(contexts) * len(tab))
    for k, v in reward:
        r[k] = v
    out = (contexts, index, np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64),
           np.array(prob, dtype=np.float64), r)
    _GRAPHS[key] = out
    return out


class WindowOracle:
    """Exact V and A^pi of a policy pi(a | C_window(h_t)) on one ``GridAgentEnv`` game.

    probs_fn(context) -> (A,) probabilities over ``env.actions`` (text order) of the context
    C_window (``context_key``'s tuple). gamma: the discount (default the environment's); use 1.0
    for success probabilities. horizon: the turn cap (default ``env.max_turns``).

    Per task, the contexts reachable from the start form a finite graph (``context_graph``); the
    finite-horizon recursion runs as ``horizon`` backward sweeps over its edges (numpy), giving
    Q (H, C, A) and V (H, C) at every turn and context at once.
    """

    def __init__(self, env: GridAgentEnv, probs_fn, window: int, gamma: float | None = None,
                 horizon: int | None = None):
        if window is None or window < 0:
            raise ValueError(f"window must be an int >= 0, got {window!r}")
        self.env, self.probs_fn, self.window = env, probs_fn, int(window)
        self.gamma = float(env.kw["gamma"] if gamma is None else gamma)
        self.horizon = int(env.max_turns if horizon is None else horizon)
        self._solved: dict = {}

    def solve(self, task: tuple):
        """(index {context: row}, Q (H, C, A), V (H, C)) of one task (start, goal)."""
        task = tuple(map(tuple, task))
        if task not in self._solved:
            contexts, index, src, dst, prob, r = context_graph(self.env, task, self.window,
                                                               self.horizon)
            A, C, H = len(self.env.actions), len(contexts), self.horizon
            pi = np.array([self.probs_fn(c) for c in contexts], dtype=np.float64)  # (C, A)
            Q, V = np.zeros((H, C, A)), np.zeros((H, C))
            v = np.zeros(C)  # V at turn t + 1
            for t in range(H - 1, -1, -1):
                cont = np.bincount(src, weights=prob * v[dst], minlength=C * A)  # (C * A,)
                q = (r + self.gamma * cont).reshape(C, A)  # (C, A)
                Q[t], V[t] = q, (pi * q).sum(-1)
                v = V[t]
            self._solved[task] = (index, Q, V)
        return self._solved[task]

    def q(self, t: int, ctx: tuple, task: tuple) -> np.ndarray:
        """Q(t, c, .) over ``env.actions``, (A,)."""
        index, Q, _ = self.solve(task)
        return Q[t, index[ctx]]

    def value(self, t: int, ctx: tuple, task: tuple) -> float:
        """V(t, c) = sum_a pi(a | c) Q(t, c, a)."""
        index, _, V = self.solve(task)
        return float(V[t, index[ctx]])

    def turn_values(self, ep) -> np.ndarray:
        """V(t, C_W(h_t)) of every turn of an episode, (T,)."""
        index, _, V = self.solve(ep.task)
        return np.array([V[t, index[context_key(ep.state_keys, ep.action_ids, t, self.window)]]
                         for t in range(len(ep))])

    def advantages(self, episodes) -> list[np.ndarray]:
        """The exact A^pi_t = Q(t, c_t, a_t) - V(t, c_t) of every turn, (T_i,) per episode.
        Needs symbolic episodes (``action_ids`` of valid actions) with ``task``."""
        out = []
        for ep in episodes:
            if ep.action_ids is None or any(a is None or a < 0 for a in ep.action_ids):
                raise ValueError("WindowOracle.advantages needs action_ids of valid actions")
            index, Q, V = self.solve(ep.task)
            rows = [index[context_key(ep.state_keys, ep.action_ids, t, self.window)]
                    for t in range(len(ep))]
            out.append(np.array([Q[t, c, a] - V[t, c]
                                 for t, (c, a) in enumerate(zip(rows, ep.action_ids))]))
        return out

    def start_value(self, task: tuple) -> float:
        """V(0, (s_0,)) of a task (start, goal): with gamma = 1 and goal_reward 1, P(success)."""
        index, _, V = self.solve(task)
        return float(V[0, 0])

    def success(self, tasks=None) -> float:
        """Mean exact success probability over ``tasks`` (default the environment's), for an
        oracle built with gamma = 1 on a game whose only reward is goal_reward = 1."""
        tasks = self.env.tasks if tasks is None else tasks
        return float(np.mean([self.start_value(task) for task in tasks]))
