"""Tabular MDPs with known P and R, and the exact oracles that make every quantity checkable.

``TabularMDP`` holds dense tensors: P (S, A, S), R (S, A) expected reward, an initial
distribution and a mask of absorbing terminal states (value 0). It can also be stepped like a
gymnasium environment, so the same policies train on it by sampling.

Builders: ``gridworld`` (text layouts, slip), ``chain_mdp`` (the exploration chain),
``random_mdp`` (Dirichlet transitions), ``thresholded_random_mdp`` (the STARC authors' random
MDPs: a softmax of thresholded Gaussians), ``from_gymnasium`` (FrozenLake, CliffWalking, Taxi and
any toy-text env that exposes its transition table ``env.unwrapped.P``).

The exact solvers that use P and R (policy evaluation, value and policy iteration, exact
advantages) are in ``agentrl_lib.algorithms.dp``; ``TabularGymEnv`` (``envs/tabular_gym.py``) steps a
``TabularMDP`` through gymnasium's API.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

Tensor = torch.Tensor
DTYPE = torch.float64


@dataclass
class TabularMDP:
    """A finite MDP. P: (S, A, S); R: (S, A) expected reward; init: (S,); terminal: (S,) bool.

    ``R_next`` (S, A, S), when given, is the reward of each transition (used only when sampling,
    so sampled rewards match the source environment exactly); R is its expectation under P.
    Terminal states are absorbing with value 0: the oracles ignore their outgoing rows.
    """

    P: Tensor
    R: Tensor
    gamma: float
    init: Tensor
    terminal: Tensor
    name: str = "mdp"
    state_names: list[str] | None = None
    action_names: list[str] | None = None
    R_next: Tensor | None = None
    max_steps: int = 200
    _rng: np.random.Generator = field(default_factory=np.random.default_rng, repr=False)
    _state: int = field(default=-1, repr=False)
    _t: int = field(default=0, repr=False)

    def __post_init__(self):
        S, A, S2 = self.P.shape
        if S != S2 or self.R.shape != (S, A) or self.init.shape != (S,):
            raise ValueError(
                f"shapes disagree: P {tuple(self.P.shape)}, R {tuple(self.R.shape)}, "
                f"init {tuple(self.init.shape)}"
            )
        row_sums = self.P.sum(-1)
        if not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-8):
            raise ValueError("every row P[s, a, :] must sum to 1")

    def optimal_q(self, tol: float = 1e-10, max_iters: int = 10_000) -> Tensor:
        """Q*(s, a) by value iteration, 0 at terminal states (S, A): the oracle that environments'
        ``expert_actions`` read. ``algorithms.dp.value_iteration`` is the teaching version with its
        history; ``tests/test_tabular.py`` checks that they agree."""
        live = (~self.terminal).to(DTYPE)[:, None]
        v = torch.zeros(self.num_states, dtype=DTYPE, device=self.P.device)
        for _ in range(max_iters):
            q = (self.R + self.gamma * torch.einsum("sat,t->sa", self.P, v)) * live  # (S, A)
            v_new = q.max(-1).values
            if (v_new - v).abs().max().item() < tol:
                return q
            v = v_new
        return q

    @property
    def num_states(self) -> int:
        return self.P.shape[0]

    @property
    def num_actions(self) -> int:
        return self.P.shape[1]

    # --- gymnasium-style sampling interface -------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[int, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._state = int(self._rng.choice(self.num_states, p=self.init.numpy()))
        self._t = 0
        return self._state, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        """Returns (next_state, reward, terminated, truncated, info), as gymnasium does."""
        if self._state < 0:
            raise RuntimeError("call reset() before step()")
        if not 0 <= action < self.num_actions:
            raise ValueError(f"action {action} out of range [0, {self.num_actions})")
        s = self._state
        s_next = int(self._rng.choice(self.num_states, p=self.P[s, action].numpy()))
        r = float(self.R_next[s, action, s_next] if self.R_next is not None else self.R[s, action])
        self._state, self._t = s_next, self._t + 1
        terminated = bool(self.terminal[s_next])
        return s_next, r, terminated, (not terminated) and self._t >= self.max_steps, {}


def _finish(P, R, gamma, init, terminal, **kw) -> TabularMDP:
    host = dict(device="cpu")  # tabular numerics live on the host
    P, R = torch.as_tensor(P, dtype=DTYPE, **host), torch.as_tensor(R, dtype=DTYPE, **host)
    init = torch.as_tensor(init, dtype=DTYPE, **host)
    terminal = torch.as_tensor(terminal, dtype=torch.bool, **host)
    if kw.get("R_next") is not None:
        kw["R_next"] = torch.as_tensor(kw["R_next"], dtype=DTYPE, **host)
    return TabularMDP(P=P, R=R, gamma=gamma, init=init / init.sum(), terminal=terminal, **kw)


# --- builders ---------------------------------------------------------------------------------
GRID_ACTIONS = ["left", "down", "right", "up"]  # gymnasium FrozenLake's order
_MOVES = [(0, -1), (1, 0), (0, 1), (-1, 0)]


def gridworld(
    layout: list[str],
    slip: float = 0.0,
    step_reward: float = 0.0,
    goal_reward: float = 1.0,
    hole_reward: float = 0.0,
    gamma: float = 0.95,
    max_steps: int = 100,
) -> TabularMDP:
    """A grid from text: 'S' start, 'G' goal (terminal), 'H' hole (terminal), '#' wall, '.' free.

    With probability ``slip`` the agent moves in one of the two perpendicular directions
    (split evenly) instead of the chosen one. Bumping a wall or the border leaves it in place.
    Reward: ``step_reward`` every step plus ``goal_reward``/``hole_reward`` on entering G/H.
    """
    rows, cols = len(layout), len(layout[0])
    if any(len(r) != cols for r in layout):
        raise ValueError("every row of the layout must have the same length")
    S, A = rows * cols, 4
    P = np.zeros((S, A, S))
    Rn = np.zeros((S, A, S))
    init = np.zeros(S)
    terminal = np.zeros(S, dtype=bool)
    for i, row in enumerate(layout):
        for j, ch in enumerate(row):
            if ch not in "SGH#.":
                raise ValueError(f"unknown layout character {ch!r} at row {i}, col {j}")
            s = i * cols + j
            init[s] = ch == "S"
            terminal[s] = ch in "GH"
    if init.sum() == 0:
        raise ValueError("the layout needs a start cell 'S'")

    def move(i, j, a):
        di, dj = _MOVES[a]
        ni, nj = i + di, j + dj
        if 0 <= ni < rows and 0 <= nj < cols and layout[ni][nj] != "#":
            return ni, nj
        return i, j

    for i in range(rows):
        for j in range(cols):
            s = i * cols + j
            for a in range(A):
                if terminal[s] or layout[i][j] == "#":
                    P[s, a, s] = 1.0
                    continue
                outcomes = [(a, 1.0 - slip), ((a + 1) % 4, slip / 2), ((a + 3) % 4, slip / 2)]
                for b, p in outcomes:
                    if p == 0:
                        continue
                    ni, nj = move(i, j, b)
                    s2 = ni * cols + nj
                    P[s, a, s2] += p
                    ch = layout[ni][nj]
                    Rn[s, a, s2] = step_reward + (goal_reward if ch == "G" else 0.0) + (
                        hole_reward if ch == "H" else 0.0
                    )
    R = (P * Rn).sum(-1)
    names = [f"({i},{j})" for i in range(rows) for j in range(cols)]
    return _finish(P, R, gamma, init, terminal, name="gridworld", state_names=names,
                   action_names=list(GRID_ACTIONS), R_next=Rn, max_steps=max_steps)


def chain_mdp(n: int = 10, small: float = 0.01, big: float = 1.0, gamma: float = 0.95,
              max_steps: int = 50) -> TabularMDP:
    """The exploration chain: states 0..n-1, start at 0; 'left' returns to 0 and pays ``small``,
    'right' moves one step on and pays 0, except that 'right' at the last state pays ``big``
    and stays. Greedy learners settle on the small reward; the optimum walks the whole chain.
    """
    if n < 2:
        raise ValueError(f"a chain needs at least 2 states, got n={n}")
    P = np.zeros((n, 2, n))
    R = np.zeros((n, 2))
    for s in range(n):
        P[s, 0, 0] = 1.0
        R[s, 0] = small
        P[s, 1, min(s + 1, n - 1)] = 1.0
    R[n - 1, 1] = big
    init = np.eye(n)[0]
    return _finish(P, R, gamma, init, np.zeros(n, dtype=bool), name="chain",
                   action_names=["left", "right"], max_steps=max_steps)


def random_mdp(num_states: int = 10, num_actions: int = 3, gamma: float = 0.9, seed: int = 0,
               alpha: float = 1.0) -> TabularMDP:
    """Dirichlet(alpha) transitions, N(0, 1) rewards, uniform start; no terminal states."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(num_states, alpha), size=(num_states, num_actions))
    R = rng.normal(size=(num_states, num_actions))
    return _finish(P, R, gamma, np.ones(num_states), np.zeros(num_states, dtype=bool),
                   name=f"random_{num_states}x{num_actions}")


def random_env_threshold(num_states: int) -> float:
    """The logit threshold of ``thresholded_random_mdp``: 1 below 50 states, 1.5 below 100, else
    1.8 (the STARC authors' rule, tuned by them for 32, 64 and 128 states)."""
    return 1.0 if num_states < 50 else (1.5 if num_states < 100 else 1.8)


def thresholded_softmax(z, threshold: float, floor: float = -20.0) -> np.ndarray:
    """softmax over the last axis of where(z > threshold, z, floor): only the logits above the
    threshold keep a real weight (each of the others gets exp(floor) / sum, about 1e-9)."""
    z = np.where(np.asarray(z, dtype=np.float64) > threshold, z, floor)
    e = np.exp(z - z.max(-1, keepdims=True))  # the same softmax, without overflow
    return e / e.sum(-1, keepdims=True)


def thresholded_random_mdp(num_states: int = 32, num_actions: int = 4, gamma: float = 0.95,
                           seed: int = 0, threshold: float | None = None) -> TabularMDP:
    """The STARC authors' random environment (lucyfarnik/starc @ e13f8fa, ``src/env/env.py``,
    ``RandomEnv``, not episodic): P(.|s, a) = softmax of iid N(0, 1) logits of which those at or
    below ``threshold`` (default ``random_env_threshold``) are replaced by -20, so each row puts
    its mass on the few next states whose logit passed (about 16% of them at 32 states; a row
    where none passed is uniform); uniform start, no terminal states. R is 0: the rewards are drawn
    separately (``rewards.shaping.random_reward``)."""
    rng = np.random.default_rng(seed)
    thr = random_env_threshold(num_states) if threshold is None else threshold
    P = thresholded_softmax(rng.normal(size=(num_states, num_actions, num_states)), thr)
    return _finish(P, np.zeros((num_states, num_actions)), gamma, np.ones(num_states),
                   np.zeros(num_states, dtype=bool), name=f"random_env_{num_states}x{num_actions}")


def from_gymnasium(env_or_id, gamma: float = 0.99, **make_kwargs) -> TabularMDP:
    """Convert a gymnasium toy-text environment (FrozenLake, CliffWalking, Taxi) to a TabularMDP
    from its transition table ``env.unwrapped.P[s][a] = [(prob, s_next, reward, terminated)]``.

    In gymnasium, termination is a property of a *transition*; a TabularMDP marks *states*. A state
    is terminal when every transition into it terminates: the episode always ends there
    (FrozenLake's holes and goal, CliffWalking's goal). A terminating transition into a state that
    is also entered without terminating (Taxi's drop-off: the cell where the passenger is then at
    its destination can also be entered by a move) goes to one added absorbing state instead, index
    S, so the MDP then has S + 1 states; its values are those of the environment, whose episode
    ends at that transition. Start states come from ``initial_state_distrib`` when the environment
    has one (Taxi), else from a reset.
    """
    import gymnasium as gym

    env = gym.make(env_or_id, **make_kwargs) if isinstance(env_or_id, str) else env_or_id
    base = env.unwrapped
    if not hasattr(base, "P"):
        raise ValueError(f"{base} has no transition table P; only toy-text envs can be converted")
    S, A = base.observation_space.n, base.action_space.n
    outcomes = [(s, a, prob, int(s2), float(r), bool(term)) for s in range(S) for a in range(A)
                for prob, s2, r, term in base.P[s][a]]
    entered_ending, entered_going_on = np.zeros(S, dtype=bool), np.zeros(S, dtype=bool)
    for _, _, _, s2, _, term in outcomes:
        (entered_ending if term else entered_going_on)[s2] = True
    terminal_states = entered_ending & ~entered_going_on
    sink = S if (entered_ending & entered_going_on).any() else None
    S_tab = S + (sink is not None)
    P = np.zeros((S_tab, A, S_tab))
    Rn = np.zeros((S_tab, A, S_tab))
    rewards_to: dict[tuple, list] = {}  # (s, a, target) -> [(prob, reward)]
    for s, a, prob, s2, r, term in outcomes:
        target = sink if term and not terminal_states[s2] else s2
        P[s, a, target] += prob
        rewards_to.setdefault((s, a, target), []).append((prob, r))
    for (s, a, t), pr in rewards_to.items():  # outcomes merged into one target keep E[r]
        rs = {r for _, r in pr}
        Rn[s, a, t] = rs.pop() if len(rs) == 1 else sum(p * r for p, r in pr) / sum(p for p, _ in pr)
    terminal = np.zeros(S_tab, dtype=bool)
    terminal[:S] = terminal_states
    if sink is not None:
        terminal[sink] = True
    for s in np.flatnonzero(terminal):  # absorbing, value 0, as the oracles expect
        P[s], Rn[s] = 0.0, 0.0
        P[s, :, s] = 1.0
    R = (P * Rn).sum(-1)
    init = np.zeros(S_tab)
    if hasattr(base, "initial_state_distrib"):
        init[:S] = np.asarray(base.initial_state_distrib, dtype=float)
    else:
        init[int(env.reset(seed=0)[0])] = 1.0
    spec = getattr(env, "spec", None)
    max_steps = (spec.max_episode_steps if spec and spec.max_episode_steps else 200)
    name = spec.id if spec else type(base).__name__
    return _finish(P, R, gamma, init, terminal, name=name, R_next=Rn, max_steps=max_steps)
