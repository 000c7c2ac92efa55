"""Tabular MDPs with known P and R, and the exact oracles that make every quantity checkable.

``TabularMDP`` holds dense tensors: P (S, A, S), R (S, A) expected reward, an initial
distribution and a mask of absorbing terminal states (value 0). It can also be stepped like a
gymnasium environment, so the same policies train on it by sampling.

Builders: ``gridworld`` (text layouts, slip), ``chain_mdp`` (the exploration chain),
``random_mdp`` (Dirichlet transitions), ``from_gymnasium`` (FrozenLake, CliffWalking, Taxi and any
toy-text env that exposes its transition table ``env.unwrapped.P``).

Oracles: ``policy_evaluation`` (a linear solve), ``q_from_v``, ``q_values``, ``advantages``,
``value_iteration``, ``policy_iteration``, ``uniform_policy``. All are differentiable in the policy,
so ``expected_return(mdp, pi)`` gives the exact policy gradient through autograd.

Sutton & Barto (2018), ch. 3-4, for the Bellman equations used here.
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
    P, R = torch.as_tensor(P, dtype=DTYPE), torch.as_tensor(R, dtype=DTYPE)
    init = torch.as_tensor(init, dtype=DTYPE)
    terminal = torch.as_tensor(terminal, dtype=torch.bool)
    if kw.get("R_next") is not None:
        kw["R_next"] = torch.as_tensor(kw["R_next"], dtype=DTYPE)
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


def from_gymnasium(env_or_id, gamma: float = 0.99, **make_kwargs) -> TabularMDP:
    """Convert a gymnasium toy-text environment (FrozenLake, CliffWalking, Taxi) to a TabularMDP
    from its transition table ``env.unwrapped.P[s][a] = [(prob, s_next, reward, terminated)]``.

    Start states come from resetting the environment (FrozenLake and CliffWalking have one);
    pass ``initial_state_distrib`` semantics through ``env.unwrapped.initial_state_distrib``
    when the environment has it (Taxi does).
    """
    import gymnasium as gym

    env = gym.make(env_or_id, **make_kwargs) if isinstance(env_or_id, str) else env_or_id
    base = env.unwrapped
    if not hasattr(base, "P"):
        raise ValueError(f"{base} has no transition table P; only toy-text envs can be converted")
    S, A = base.observation_space.n, base.action_space.n
    P = np.zeros((S, A, S))
    Rn = np.zeros((S, A, S))
    terminal = np.zeros(S, dtype=bool)
    for s in range(S):
        for a in range(A):
            for prob, s2, r, term in base.P[s][a]:
                P[s, a, s2] += prob
                Rn[s, a, s2] = r
                if term:
                    terminal[s2] = True
    for s in np.flatnonzero(terminal):  # absorbing, value 0, as the oracles expect
        P[s], Rn[s] = 0.0, 0.0
        P[s, :, s] = 1.0
    R = (P * Rn).sum(-1)
    if hasattr(base, "initial_state_distrib"):
        init = np.asarray(base.initial_state_distrib, dtype=float)
    else:
        init = np.zeros(S)
        init[int(env.reset(seed=0)[0])] = 1.0
    spec = getattr(env, "spec", None)
    max_steps = (spec.max_episode_steps if spec and spec.max_episode_steps else 200)
    name = spec.id if spec else type(base).__name__
    return _finish(P, R, gamma, init, terminal, name=name, R_next=Rn, max_steps=max_steps)


# --- exact oracles ------------------------------------------------------------------------------
def uniform_policy(mdp: TabularMDP) -> Tensor:
    """pi(a|s) = 1/A for every state. (S, A)"""
    return torch.full((mdp.num_states, mdp.num_actions), 1.0 / mdp.num_actions, dtype=DTYPE)


def _continuing(mdp: TabularMDP) -> Tensor:
    """P with the outgoing rows of terminal states zeroed: V(terminal) = 0. (S, A, S)"""
    return mdp.P * (~mdp.terminal).to(DTYPE)[:, None, None]


def policy_evaluation(mdp: TabularMDP, pi: Tensor) -> Tensor:
    """V^pi by solving (I - gamma P_pi) V = r_pi; differentiable in pi. pi: (S, A) -> V: (S,).

    With gamma = 1 the policy must reach a terminal state with probability 1 (else singular).
    """
    pi = pi.to(DTYPE)
    live = (~mdp.terminal).to(DTYPE)
    P_pi = torch.einsum("sa,sat->st", pi, _continuing(mdp))  # (S, S)
    r_pi = (pi * mdp.R).sum(-1) * live  # (S,)
    eye = torch.eye(mdp.num_states, dtype=DTYPE)
    return torch.linalg.solve(eye - mdp.gamma * P_pi, r_pi)


def q_from_v(mdp: TabularMDP, v: Tensor) -> Tensor:
    """Q(s, a) = R(s, a) + gamma * sum_s' P(s'|s, a) V(s'); 0 at terminal states. (S, A)"""
    live = (~mdp.terminal).to(DTYPE)[:, None]
    return (mdp.R + mdp.gamma * torch.einsum("sat,t->sa", mdp.P, v)) * live


def q_values(mdp: TabularMDP, pi: Tensor) -> Tensor:
    """Q^pi (S, A)."""
    return q_from_v(mdp, policy_evaluation(mdp, pi))


def advantages(mdp: TabularMDP, pi: Tensor) -> Tensor:
    """A^pi(s, a) = Q^pi(s, a) - V^pi(s). (S, A)"""
    v = policy_evaluation(mdp, pi)
    return q_from_v(mdp, v) - v[:, None]


def expected_return(mdp: TabularMDP, pi: Tensor) -> Tensor:
    """J(pi) = sum_s init(s) V^pi(s): the exact objective, a differentiable scalar."""
    return mdp.init @ policy_evaluation(mdp, pi)


def greedy(q: Tensor) -> Tensor:
    """Deterministic policy taking the first argmax of Q in each state, as one-hot (S, A)."""
    return torch.nn.functional.one_hot(q.argmax(-1), q.shape[-1]).to(DTYPE)


def value_iteration(mdp: TabularMDP, tol: float = 1e-10, max_iters: int = 10_000):
    """V_{k+1}(s) = max_a [R(s, a) + gamma sum_s' P(s'|s, a) V_k(s')] until the sup-norm change
    is below ``tol``. Returns (V*, greedy pi*, number of sweeps, list of sup-norm changes).
    """
    v = torch.zeros(mdp.num_states, dtype=DTYPE)
    deltas = []
    for k in range(1, max_iters + 1):
        v_new = q_from_v(mdp, v).max(-1).values
        deltas.append((v_new - v).abs().max().item())
        v = v_new
        if deltas[-1] < tol:
            break
    return v, greedy(q_from_v(mdp, v)), k, deltas


def policy_iteration(mdp: TabularMDP, pi: Tensor | None = None, max_iters: int = 1000):
    """Evaluate exactly, improve greedily, until the policy is stable.

    Ties keep the current action when it is among the maximisers (so the loop terminates).
    Returns (V*, pi*, number of improvement steps). The start policy must be proper when gamma=1.
    """
    pi = uniform_policy(mdp) if pi is None else pi.to(DTYPE)
    for k in range(1, max_iters + 1):
        v = policy_evaluation(mdp, pi)
        q = q_from_v(mdp, v)
        best = q.max(-1, keepdim=True).values
        current_is_best = ((pi > 0) & (q >= best - 1e-12)).any(-1, keepdim=True)
        new_pi = torch.where(current_is_best & (pi.max(-1, keepdim=True).values == 1.0), pi, greedy(q))
        if torch.equal(new_pi, pi):
            return v, pi, k
        pi = new_pi
    return policy_evaluation(mdp, pi), pi, max_iters
