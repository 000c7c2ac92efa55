"""Multi-turn text environments: one protocol from tables to language models.

The protocol (duck-typed; no base class needed)::

    observation = env.reset(seed)                        # str
    observation, reward, done, info = env.step(action_text)

``info`` always carries ``state_key`` (hashable: the true state, for anchor-state grouping and exact
oracles), ``valid`` (whether the action text parsed to a legal action), ``error`` (a message, or
None) and the task's ground truth. A malformed action never raises: it gets an error observation,
leaves the state unchanged, costs ``invalid_penalty`` and is counted in ``env.num_invalid``.

Optional: ``env.expert_actions()`` lists the optimal actions (texts of ``env.actions``, in that
order; ties all listed) in the current state, from the environment's exact tabular form: the
scripted demonstrator of ``sft.scripted_policy`` that agent SFT bases imitate.

Optional: ``env.seed_dynamics(seed)`` after ``reset`` reseeds the episode's transition noise (slips)
without changing the task: ``play_episodes`` gives the members of a group (same task seed) distinct
noise streams, as independent rollouts of one task would have.

The same environment runs with a tabular policy through ``env.actions`` (a symbolic action set:
``env.step(env.actions[i])``), an MLP, the tiny LM or a real model (free text).

``GridAgentEnv`` is the text gridworld of ../shared/papers/README.md (GiGPO, SALT, HGPO, ...):
repeated (hashable) states, invalid actions, and a memory-dependent variant where the goal is shown
only on the first turn. Its dynamics *are* a ``TabularMDP`` (one per goal), so the exact optimal
values and A* of ``tabular_form`` are those of the text environment, by construction.
"""

from __future__ import annotations

import re

import numpy as np

from agentrl_lib.envs.tabular import GRID_ACTIONS, TabularMDP, gridworld

_WORD = re.compile(r"[a-z]+")


def parse_action(text: str, actions: list[str]) -> str | None:
    """The action named in ``text``: the last word that is one of ``actions`` (so "I will go
    left" and "left" both parse), case-insensitive; None when no word is an action.

    >>> parse_action("  Left ", ["up", "left"]), parse_action("go up, then left", ["up", "left"])
    ('left', 'left')
    >>> parse_action("north", ["up", "left"]) is None
    True
    """
    words = [w for w in _WORD.findall(text.lower()) if w in actions]
    return words[-1] if words else None


DEFAULT_LAYOUT = ["....", ".#..", "...#", "#..."]


class GridAgentEnv:
    """A text gridworld. Each episode draws a task (start cell, goal cell); the agent answers each
    turn with a move (up, down, left, right). Reaching the goal pays ``goal_reward`` and ends the
    episode; ``max_turns`` truncates it.

    memory=True: the goal's position is in the first observation only, so a policy that sees only
    the current observation cannot act optimally (the state key still holds the goal).
    """

    actions = ["up", "down", "left", "right"]
    system_prompt = "Reach the goal. Answer with one move."
    """the system message an LM agent sees (``rollout.lm_rollout`` uses it unless given another)"""

    def __init__(self, layout: list[str] | None = None, tasks: list[tuple] | None = None,
                 max_turns: int = 12, slip: float = 0.0, step_reward: float = 0.0,
                 goal_reward: float = 1.0, invalid_penalty: float = 0.0, gamma: float = 0.95,
                 memory: bool = False):
        self.layout = list(layout or DEFAULT_LAYOUT)
        self.rows, self.cols = len(self.layout), len(self.layout[0])
        free = [(r, c) for r in range(self.rows) for c in range(self.cols)
                if self.layout[r][c] != "#"]
        if tasks is None:  # every (start, goal) pair of distinct free cells
            tasks = [(s, g) for s in free for g in free if s != g]
        for s, g in tasks:
            if s not in free or g not in free or s == g:
                raise ValueError(f"bad task {(s, g)}: start and goal must be distinct free cells")
        self.tasks = [tuple(map(tuple, t)) for t in tasks]
        self.max_turns, self.memory, self.invalid_penalty = max_turns, memory, invalid_penalty
        self.kw = dict(slip=slip, step_reward=step_reward, goal_reward=goal_reward, gamma=gamma,
                       max_steps=max_turns)
        self._mdps: dict[tuple, TabularMDP] = {}
        self._q: dict[tuple, np.ndarray] = {}
        self._rng = np.random.default_rng()
        self.num_invalid = 0
        self.task = None
        self.pos = None
        self.turn = 0

    # --- the tabular form ----------------------------------------------------------------------
    def tabular_form(self, start: tuple, goal: tuple) -> TabularMDP:
        """The MDP of one task: states are cells (index r * cols + c), actions in ``GRID_ACTIONS``
        order (left, down, right, up) -- use ``action_index`` to map text actions."""
        key = (tuple(start), tuple(goal))
        if key not in self._mdps:
            grid = [list(row.replace("S", ".").replace("G", ".")) for row in self.layout]
            grid[start[0]][start[1]] = "S"
            grid[goal[0]][goal[1]] = "G"
            self._mdps[key] = gridworld(["".join(r) for r in grid], **self.kw)
        return self._mdps[key]

    def expert_actions(self) -> list[str]:
        """The optimal moves from the current cell (ties all listed, in ``actions`` order), by the
        task's exact Q* (``TabularMDP.optimal_q`` of ``tabular_form``)."""
        if self.task not in self._q:
            self._q[self.task] = self.tabular_form(*self.task).optimal_q().numpy()
        q = self._q[self.task][self.state_index()]  # (A,) in tabular order
        qt = np.array([q[self.action_index(a)] for a in self.actions])  # text order
        return [self.actions[i] for i in np.flatnonzero(qt >= qt.max() - 1e-9)]

    @staticmethod
    def action_index(action: str) -> int:
        """Index of a text action in the tabular form's action order."""
        return GRID_ACTIONS.index(action)

    def cell(self, state: int) -> tuple[int, int]:
        return divmod(state, self.cols)

    # --- the protocol --------------------------------------------------------------------------
    def reset(self, seed: int | None = None, task: tuple | None = None) -> str:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.task = tuple(task) if task is not None else self.tasks[self._rng.integers(len(self.tasks))]
        start, goal = self.task
        mdp = self.tabular_form(start, goal)
        s, _ = mdp.reset(seed=int(self._rng.integers(1 << 31)))
        self.pos, self.turn = self.cell(s), 0
        return self._observe(first=True)

    def seed_dynamics(self, seed: int) -> None:
        """Reseed the slip noise of this episode (the task and position stay)."""
        self.tabular_form(*self.task)._rng = np.random.default_rng(seed)

    def step(self, action_text: str):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        self.turn += 1
        action = parse_action(action_text, self.actions)
        start, goal = self.task
        info = {"valid": action is not None, "error": None, "goal": goal, "task": self.task,
                "action": action}
        if action is None:
            self.num_invalid += 1
            info["error"] = (f"could not read a move in {action_text[:40]!r}; answer with one of "
                             f"{', '.join(self.actions)}")
            done = self.turn >= self.max_turns
            info.update(state_key=self.state_key(), truncated=done)
            return f"Invalid action: {info['error']}.\n" + self._observe(), \
                self.invalid_penalty, done, info
        mdp = self.tabular_form(start, goal)
        s2, r, terminated, truncated, _ = mdp.step(self.action_index(action))
        self.pos = self.cell(s2)
        done = terminated or self.turn >= self.max_turns
        info.update(state_key=self.state_key(), truncated=done and not terminated,
                    success=bool(terminated))
        obs = "You reached the goal." if terminated else self._observe()
        return obs, r, done, info

    def state_key(self) -> tuple:
        """(cell, goal): the true Markov state, hashable. Equal keys are the same situation."""
        return (self.pos, self.task[1])

    def _observe(self, first: bool = False) -> str:
        r, c = self.pos
        text = f"Turn {self.turn + 1}/{self.max_turns}. You are at row {r}, column {c}."
        if first or not self.memory:
            gr, gc = self.task[1]
            text += f" The goal is at row {gr}, column {gc}."
        walls = [f"({i},{j})" for i in range(self.rows) for j in range(self.cols)
                 if self.layout[i][j] == "#"]
        if walls:
            text += f" Walls: {' '.join(walls)}."
        return text + f" Move: {', '.join(self.actions)}?"

    # --- the mirror for tabular and MLP policies -----------------------------------------------
    def task_index(self) -> int:
        return self.tasks.index(self.task)

    def state_index(self) -> int:
        """Cell index of the current position, for tables indexed by (task, cell)."""
        return self.pos[0] * self.cols + self.pos[1]
