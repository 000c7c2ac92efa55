"""Multi-turn text environments: one protocol from tables to language models.

The protocol (``envs/protocol.py``: ``AgentEnv``, checked by ``check_env``)::

    observation = env.reset(seed)                        # str
    observation, reward, done, info = env.step(action_text)

with ``info["state_key"]`` (the true state, hashable: anchor-state grouping, exact oracles),
``valid``, ``error``, ``success``, ``truncated`` and the task's ground truth; a malformed action
never raises (an invalid turn).

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
values and A* of ``tabular_form`` are those of the text environment, by construction. Larger named
layouts are in ``LAYOUTS`` ("5x5", "7x7"; ``show_walls=False`` keeps their observations short).

``SubtaskGridEnv`` is the gridworld of the long-horizon and hierarchical papers (HiPER, EPO, ...):
waypoints to visit in order, the stage (how many are done) in the state, (cell, stage), so its
tabular form is exact too. Named variants (``SUBTASK_VARIANTS``): "keydoor" (a key, then a goal
behind a door that opens only with the key; 30 optimal steps) and "abc" (visit A, then B, then C).

Both give a fixed evaluation panel with a hash (``eval_panel``): numbers from two runs are
comparable only when their panel hashes match.
"""

from __future__ import annotations

import re

import numpy as np

from agentrl_lib.envs import protocol
from agentrl_lib.envs.tabular import _MOVES, GRID_ACTIONS, TabularMDP, _finish, gridworld

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
# Larger named layouts for GridAgentEnv: pillars make detours, and many (cell, goal) states repeat
# within a group's episodes (GiGPO's anchor groups).
LAYOUTS = {
    "4x4": DEFAULT_LAYOUT,
    "5x5": [".....", ".#.#.", ".....", ".#.#.", "....."],
    "7x7": ["...#...", ".#...#.", ".#.#.#.", "...#...", ".#.#.#.", ".#...#.", "...#..."],
}


_Q_STAR: dict[tuple, np.ndarray] = {}
"""Q* of each (layout, dynamics, task) of ``GridAgentEnv``, shared by every instance"""


class GridAgentEnv:
    """A text gridworld: reach the goal cell, one move per turn.

    ## Description
    Each episode draws a task (start cell, goal cell) from ``tasks``; the agent answers each turn
    with a move. Moves into a wall or the border leave the agent in place; with probability ``slip``
    a move goes sideways (``tabular.gridworld``). memory=True: the goal's position is in the first
    observation only, so a policy that sees only the current observation cannot act optimally (the
    state key still holds the goal).

    ## Actions
    Free text: the last word that is one of ``actions`` (up, down, left, right) is the move
    (``parse_action``). A text with none is invalid (the state stays, the turn is used).

    ## Observations
    ``Turn t/T. You are at row r, column c. The goal is at row gr, column gc. Walls: (i,j) ... Move:
    up, down, left, right?`` (the goal on the first turn only under memory=True, the walls only with
    ``show_walls``); after an invalid turn the error first; "You reached the goal." at the end.

    ## Rewards
    ``step_reward`` every move plus ``goal_reward`` on entering the goal (``tabular.gridworld``);
    ``invalid_penalty`` for an invalid turn.

    ## Episode end
    Terminated: the goal is reached (``success``). Truncated: ``max_turns`` turns without it.

    ## Info
    ``protocol.INFO_KEYS`` (state_key: (cell, goal)) and ``goal``, ``task``, ``action`` (the move
    read, or None).

    ## Arguments
    layout: rows of '.' and '#', or a name of ``LAYOUTS``. tasks: (start, goal) pairs (default every
    pair of distinct free cells). max_turns, slip, step_reward, goal_reward, invalid_penalty; gamma:
    the tabular form's discount. memory: see above. show_walls=False leaves the wall list out of the
    observations (the layout is fixed, so an agent can learn it; shorter prompts).

    ## Exact form
    ``tabular_form(start, goal)``: one ``TabularMDP`` per task, whose dynamics *are* the
    environment's, so its Q* (``expert_actions``) and values are exact for the text environment.
    """

    actions = ["up", "down", "left", "right"]
    system_prompt = "Reach the goal. Answer with one move."
    """the system message an LM agent sees (``rollout.lm_rollout`` uses it unless given another)"""

    def __init__(self, layout: list[str] | None = None, tasks: list[tuple] | None = None,
                 max_turns: int = 12, slip: float = 0.0, step_reward: float = 0.0,
                 goal_reward: float = 1.0, invalid_penalty: float = 0.0, gamma: float = 0.95,
                 memory: bool = False, show_walls: bool = True):
        if isinstance(layout, str):
            layout = LAYOUTS[layout]
        self.layout = list(layout or DEFAULT_LAYOUT)
        self.show_walls = show_walls
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
        key = (tuple(self.layout), tuple(sorted(self.kw.items())), self.task)
        if key not in _Q_STAR:  # shared: play_episodes makes a new env for every episode
            _Q_STAR[key] = self.tabular_form(*self.task).optimal_q().numpy()
        q = _Q_STAR[key][self.state_index()]  # (A,) in tabular order
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
        unreadable = protocol.action_error(action_text)
        action = None if unreadable else parse_action(action_text, self.actions)
        start, goal = self.task
        info = {"valid": action is not None, "error": None, "goal": goal, "task": self.task,
                "action": action}
        if action is None:
            self.num_invalid += 1
            info["error"] = unreadable or (f"could not read a move in {action_text[:40]!r}; "
                                           f"answer with one of {', '.join(self.actions)}")
            done = self.turn >= self.max_turns
            info.update(state_key=self.state_key(), truncated=done, success=False)
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
        if walls and self.show_walls:
            text += f" Walls: {' '.join(walls)}."
        return text + f" Move: {', '.join(self.actions)}?"

    def observation_at(self, cell: tuple, task: tuple, turn: int) -> str:
        """The observation an agent sees in ``cell`` of ``task`` before its turn ``turn`` (0-based),
        as ``reset``/``step`` render it (the memory variant shows the goal at turn 0 only). The
        environment's own episode is left as it was. For reading a policy in every state."""
        saved = self.pos, self.task, self.turn
        self.pos, self.task, self.turn = tuple(cell), tuple(map(tuple, task)), turn
        try:
            return self._observe(first=turn == 0)
        finally:
            self.pos, self.task, self.turn = saved

    # --- the evaluation panel ------------------------------------------------------------------
    def eval_panel(self, n: int = 64) -> tuple[list[tuple[int, tuple]], str]:
        """A fixed panel of ``n`` (seed, task) episodes, seeds 10**6 + i and the task that
        ``reset(seed)`` draws from each, and a hash of the panel *and* the game (layout, tasks,
        turn cap, dynamics, rewards, memory, walls shown), so numbers are comparable only when the
        hashes match. Play it with the seeds (``grpo.evaluate_agent``)."""
        return protocol.eval_panel(n, protocol.reset_task(GridAgentEnv(self.layout, self.tasks)),
                                   self._game())

    def panel_hash(self, panel) -> str:
        return protocol.panel_hash([self._game(), panel])

    def _game(self) -> list:
        return [self.layout, self.tasks, self.max_turns, self.kw, self.invalid_penalty,
                self.memory, self.show_walls]

    # --- the mirror for tabular and MLP policies -----------------------------------------------
    def task_index(self) -> int:
        return self.tasks.index(self.task)

    def state_index(self) -> int:
        """Cell index of the current position, for tables indexed by (task, cell)."""
        return self.pos[0] * self.cols + self.pos[1]


# --- waypoints in order: key-door and subtasks ------------------------------------------------------
# Layout characters: '.' free, '#' wall, 'S' a start cell (each one is a task), 'D' a door (a wall
# until the key 'K' is held), and the waypoints named by ``order`` ('K' key, 'G' goal, 'A', 'B', 'C').
SUBTASK_VARIANTS = {
    # One corridor through the whole grid: the key at the end of the second row, the door at the
    # end of the fourth; the goal is behind it. Optimal: 14 steps to the key, 16 more to the goal.
    "keydoor": dict(layout=["S......",
                            "######.",
                            "K......",
                            ".######",
                            "......D",
                            "######.",
                            "G......"], order="KG", max_turns=40),
    # Three subtasks in a row from one of three starts: visit A, then B, then C.
    "abc": dict(layout=["A...B",
                        ".#.#.",
                        "..S..",
                        ".#.#.",
                        "C..SS"], order="ABC", max_turns=24),
    # 1..4 dependent subtasks on one open 5x5 grid (HiPER's "multiple dependent subtasks"): from
    # the two starts in the middle, visit the corners in order, 4 optimal steps from the centre
    # to the first and 4 between corners, so the optimal path grows by 4 per subtask; the turn
    # cap is 5 per subtask plus 4.
    "chain1": dict(layout=["G....",
                           ".....",
                           "..S..",
                           "..S..",
                           "....."], order="G", max_turns=9),
    "chain2": dict(layout=["A...G",
                           ".....",
                           "..S..",
                           "..S..",
                           "....."], order="AG", max_turns=14),
    "chain3": dict(layout=["A...B",
                           ".....",
                           "..S..",
                           "..S..",
                           "....G"], order="ABG", max_turns=19),
    "chain4": dict(layout=["A...B",
                           ".....",
                           "..S..",
                           "..S..",
                           "G...C"], order="ABCG", max_turns=24),
}
WAYPOINT_NAMES = {"K": "key", "G": "goal"}


class SubtaskGridEnv:
    """A text gridworld with waypoints to visit in ``order`` (the key 'K' opens the doors 'D').

    ## Description
    The gridworld of the long-horizon and hierarchical papers (HiPER, EPO, ...). Tasks are the start
    cells 'S' of the layout. Entering the next waypoint advances the stage (waypoints done so far).
    Moves into a wall, the border or a closed door leave the agent in place (valid moves); with
    probability ``slip`` a move goes sideways (as ``tabular.gridworld``).

    ## Actions
    Free text read by ``parse_action`` (up, down, left, right); unreadable answers are invalid (the
    state stays, the turn is used).

    ## Observations
    Short (each character is a token of the tiny LM): ``Turn 3/40. At (2,5). Next: key at (2,0).``
    ("Invalid move. " before it after an invalid turn; "Done." at the end); ``parse_observation``
    reads one back.

    ## Rewards
    ``step_reward`` every move, ``subtask_reward`` on each waypoint but the last, ``goal_reward`` on
    the last; ``invalid_penalty`` for an invalid turn.

    ## Episode end
    Terminated: the last waypoint is entered (``success``). Truncated: ``max_turns`` turns without
    it.

    ## Info
    ``protocol.INFO_KEYS`` (state_key: (cell, stage)) and ``task``, ``action``.

    ## Arguments
    variant: a name of ``SUBTASK_VARIANTS`` ("keydoor", "abc", "chain1".."chain4"); ``layout``,
    ``order`` and ``max_turns`` override it. slip, step_reward, subtask_reward, goal_reward,
    invalid_penalty; gamma: the tabular form's discount.

    ## Exact form
    ``tabular_form(start)``: one state per (stage, cell), index ``stage * rows * cols + r * cols +
    c``, so the state key (cell, stage) is Markov and the form's Q* (``expert_actions``) is exact.
    """

    actions = ["up", "down", "left", "right"]
    system_prompt = "Visit the targets in order. Answer with one move: up, down, left or right."

    def __init__(self, variant: str = "keydoor", layout: list[str] | None = None,
                 order: str | None = None, max_turns: int | None = None, slip: float = 0.0,
                 step_reward: float = 0.0, subtask_reward: float = 0.0, goal_reward: float = 1.0,
                 invalid_penalty: float = 0.0, gamma: float = 0.95):
        if variant not in SUBTASK_VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose one of {list(SUBTASK_VARIANTS)}")
        spec = SUBTASK_VARIANTS[variant]
        self.variant = variant
        self.layout = list(layout or spec["layout"])
        self.order = order or spec["order"]
        self.max_turns = max_turns or spec["max_turns"]
        self.rows, self.cols = len(self.layout), len(self.layout[0])
        if any(len(r) != self.cols for r in self.layout):
            raise ValueError("every row of the layout must have the same length")
        where = {}
        for i, row in enumerate(self.layout):
            for j, ch in enumerate(row):
                if ch not in ".#SDKGABC":
                    raise ValueError(f"unknown layout character {ch!r} at row {i}, col {j}")
                where.setdefault(ch, []).append((i, j))
        for ch in self.order:
            if len(where.get(ch, [])) != 1:
                raise ValueError(f"waypoint {ch!r} must appear exactly once in the layout")
        if "D" in where and "K" not in self.order:
            raise ValueError("a layout with doors 'D' needs the key 'K' in order")
        self.waypoints = [where[ch][0] for ch in self.order]
        self.tasks = list(where.get("S", []))
        if not self.tasks:
            raise ValueError("the layout needs at least one start cell 'S'")
        self.slip, self.step_reward, self.gamma = slip, step_reward, gamma
        self.subtask_reward, self.goal_reward = subtask_reward, goal_reward
        self.invalid_penalty = invalid_penalty
        self._mdps: dict[tuple, TabularMDP] = {}
        self._q: np.ndarray | None = None
        self._rng = np.random.default_rng()
        self.num_invalid = 0
        self.task = None
        self.pos, self.stage, self.turn = None, 0, 0

    # --- the tabular form ----------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.order)

    def index(self, cell: tuple, stage: int) -> int:
        """Index of the state (cell, stage) in the tabular form."""
        return stage * self.rows * self.cols + cell[0] * self.cols + cell[1]

    def state_of(self, index: int) -> tuple[tuple[int, int], int]:
        """(cell, stage) of a tabular state index."""
        stage, c = divmod(index, self.rows * self.cols)
        return divmod(c, self.cols), stage

    def _open(self, cell: tuple, stage: int) -> bool:
        i, j = cell
        if not (0 <= i < self.rows and 0 <= j < self.cols):
            return False
        ch = self.layout[i][j]
        return ch != "#" and (ch != "D" or stage > self.order.index("K"))

    def _move(self, cell: tuple, stage: int, a: int) -> tuple[tuple[int, int], int]:
        """(cell, stage) after tabular action a (``GRID_ACTIONS`` order), no slip."""
        di, dj = _MOVES[a]
        nxt = (cell[0] + di, cell[1] + dj)
        if not self._open(nxt, stage):
            nxt = cell
        return nxt, stage + (nxt == self.waypoints[stage])

    def tabular_form(self, start: tuple | None = None) -> TabularMDP:
        """The MDP of one task (start cell; default the first): S = (num_stages + 1) * rows * cols
        states (stage num_stages is terminal), actions in ``GRID_ACTIONS`` order (use
        ``action_index``), ``max_steps`` = ``max_turns``. Walls and never-reached states are
        absorbing with value 0."""
        start = tuple(start) if start is not None else self.tasks[0]
        if start not in self._mdps:
            n, A = (self.num_stages + 1) * self.rows * self.cols, len(GRID_ACTIONS)
            P, Rn = np.zeros((n, A, n)), np.zeros((n, A, n))
            terminal = np.zeros(n, dtype=bool)
            for s in range(n):
                cell, stage = self.state_of(s)
                if stage == self.num_stages or not self._open(cell, stage):
                    terminal[s] = stage == self.num_stages
                    P[s, :, s] = 1.0
                    continue
                for a in range(A):
                    for b, p in [(a, 1.0 - self.slip), ((a + 1) % 4, self.slip / 2),
                                 ((a + 3) % 4, self.slip / 2)]:
                        if p == 0:
                            continue
                        c2, st2 = self._move(cell, stage, b)
                        s2 = self.index(c2, st2)
                        P[s, a, s2] += p
                        Rn[s, a, s2] = self.step_reward + (
                            0.0 if st2 == stage else
                            self.goal_reward if st2 == self.num_stages else self.subtask_reward)
            init = np.zeros(n)
            init[self.index(start, 0)] = 1.0
            names = [f"{self.state_of(s)}" for s in range(n)]
            self._mdps[start] = _finish(P, (P * Rn).sum(-1), self.gamma, init, terminal,
                                        name=f"subtask-{self.variant}", state_names=names,
                                        action_names=list(GRID_ACTIONS), R_next=Rn,
                                        max_steps=self.max_turns)
        return self._mdps[start]

    def expert_actions(self) -> list[str]:
        """The optimal moves in the current (cell, stage) (ties all listed, in ``actions`` order),
        by the exact Q* of ``tabular_form`` (the same for every start)."""
        if self._q is None:
            self._q = self.tabular_form().optimal_q().numpy()
        q = self._q[self.state_index()]
        qt = np.array([q[self.action_index(a)] for a in self.actions])
        return [self.actions[i] for i in np.flatnonzero(qt >= qt.max() - 1e-9)]

    @staticmethod
    def action_index(action: str) -> int:
        """Index of a text action in the tabular form's action order."""
        return GRID_ACTIONS.index(action)

    # --- the protocol --------------------------------------------------------------------------
    def reset(self, seed: int | None = None, task: tuple | None = None) -> str:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.task = tuple(task) if task is not None else self.tasks[self._rng.integers(len(self.tasks))]
        mdp = self.tabular_form(self.task)
        s, _ = mdp.reset(seed=int(self._rng.integers(1 << 31)))
        (self.pos, self.stage), self.turn = self.state_of(s), 0
        return self._observe()

    def seed_dynamics(self, seed: int) -> None:
        """Reseed the slip noise of this episode (the task and position stay)."""
        self.tabular_form(self.task)._rng = np.random.default_rng(seed)

    def step(self, action_text: str):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        self.turn += 1
        unreadable = protocol.action_error(action_text)
        action = None if unreadable else parse_action(action_text, self.actions)
        info = {"valid": action is not None, "error": None, "task": self.task, "action": action}
        if action is None:
            self.num_invalid += 1
            info["error"] = unreadable or f"answer with one of {', '.join(self.actions)}"
            done = self.turn >= self.max_turns
            info.update(state_key=self.state_key(), truncated=done, success=False)
            return f"Invalid move. {self._observe()}", self.invalid_penalty, done, info
        mdp = self.tabular_form(self.task)
        s2, r, terminated, _, _ = mdp.step(self.action_index(action))
        self.pos, self.stage = self.state_of(s2)
        done = terminated or self.turn >= self.max_turns
        info.update(state_key=self.state_key(), truncated=done and not terminated,
                    success=bool(terminated))
        return ("Done." if terminated else self._observe()), r, done, info

    def state_key(self) -> tuple:
        """(cell, stage): the true Markov state, hashable."""
        return (self.pos, self.stage)

    def _observe(self) -> str:
        return self.observation_at(self.pos, self.stage, self.turn)

    def observation_at(self, cell: tuple, stage: int, turn: int) -> str:
        """The observation in (cell, stage) before turn ``turn`` (0-based); ``parse_observation``
        reads it back."""
        ch = self.order[stage]
        (r, c), (wr, wc) = cell, self.waypoints[stage]
        return (f"Turn {turn + 1}/{self.max_turns}. At ({r},{c}). "
                f"Next: {WAYPOINT_NAMES.get(ch, ch)} at ({wr},{wc}).")

    def parse_observation(self, text: str) -> tuple[tuple[int, int], int, int]:
        """(cell, stage, turn) of an observation of this environment (``observation_at``).

        >>> env = SubtaskGridEnv("keydoor")
        >>> env.parse_observation(env.observation_at((4, 2), 1, 17))
        ((4, 2), 1, 17)
        """
        m = re.search(r"Turn (\d+)/\d+\. At \((\d+),(\d+)\)\. Next: (\w+) at", text)
        if m is None:
            raise ValueError(f"not an observation of this environment: {text[:60]!r}")
        name = m.group(4)
        names = [WAYPOINT_NAMES.get(ch, ch) for ch in self.order]
        return (int(m.group(2)), int(m.group(3))), names.index(name), int(m.group(1)) - 1

    # --- the evaluation panel and the mirror for tabular policies --------------------------------
    def eval_panel(self, n: int = 64) -> tuple[list[tuple[int, tuple]], str]:
        """A fixed panel of ``n`` (seed, start) episodes, seeds 10**6 + i and the start that
        ``reset(seed)`` draws, and a hash of the panel and the game (layout, order, turn cap,
        dynamics, rewards)."""
        fresh = SubtaskGridEnv(self.variant, self.layout, self.order, self.max_turns)
        return protocol.eval_panel(n, protocol.reset_task(fresh), self._game())

    def panel_hash(self, panel) -> str:
        return protocol.panel_hash([self._game(), panel])

    def _game(self) -> list:
        return [self.layout, self.order, self.max_turns, self.slip, self.step_reward,
                self.subtask_reward, self.goal_reward, self.invalid_penalty, self.gamma]

    def task_index(self) -> int:
        return self.tasks.index(self.task)

    def state_index(self) -> int:
        """Index of the current (cell, stage) in the tabular form."""
        return self.index(self.pos, self.stage)
