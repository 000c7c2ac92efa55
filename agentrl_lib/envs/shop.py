"""ShopEnv: a WebShop-like shopping task with invalid actions and a known true progress.

The shared ShopEnv of ../shared/papers/README.md (SPA-RL, Step-Q, OPRL, EMPG). A small synthetic
catalog of items; each item has a category ("shirt"), a material ("cotton"), and the colours and
sizes it is offered in. An instruction names a target: "i need a cotton shirt, red, size large".
The agent answers each turn with one action, WebShop-style:

    search[query]          results: the items whose category or material is named in the query
    click[item]            open an item listed on the current results page
    choose[attr=value]     on an item page, pick an option the item offers (attr: color, size)
    buy                    on an item page: the episode ends with the attribute-match score
    back                   item page -> results page -> search page

Reward (only at ``buy``) is the attribute-match score, as WebShop's: the mean of four checks,
category, material, colour and size of what was bought, so 1 exactly for the target with both
options right (``success``). Anything the parser or the page cannot execute (no action found, an
unknown tool, an item not on the page, an option the item lacks, ``buy`` off an item page) is
*invalid*: an error observation, the state unchanged, ``invalid_penalty``, ``env.num_invalid`` += 1.

**True progress** (``progress(state_key)``, in [0, 1]): the fraction of five subgoals done,
found (the target is on the results page, or its page is open), on the target's page, right
colour chosen on it, right size chosen on it, bought; after ``buy`` it is the score. It rises by
0.2 per subgoal along the shortest path, so its increments sum to the outcome on an exact purchase.

**Tabular form.** ``env.actions`` is a finite symbolic action set (one search per category, one
click per item, one choose per option value, buy, back); ``tabular_form(task)`` enumerates every
state reachable from the search page under it and returns a ``TabularMDP`` (deterministic P, R,
one absorbing terminal state after buy) together with the state keys, so value iteration gives the
exact V*, Q*, A* of the text environment. Free-text queries ("search[red cotton shirt]") also
work; they may reach results pages outside the tabular form (keys still hashable).

**Expert and LM agent.** ``expert_actions()`` lists the optimal actions of the current state (ties
all listed) from the task's exact Q* on that form: what ``sft.scripted_policy`` imitates for an
agent SFT base. ``obs_format="short"`` gives terse observations (the target in the first one only, then the page
in under 40 characters) so that a 6-turn conversation fits the character-level tiny LM's 512
positions;
``relative_features`` is a fixed-length vector of the task-relative state and action (for an MLP
progress model that generalises across tasks).
"""

from __future__ import annotations

import json
import re

import numpy as np
import torch

from agentrl_lib.envs import protocol
from agentrl_lib.envs.tabular import DTYPE, TabularMDP

CATEGORIES = ["shirt", "mug", "lamp", "bag", "shoe", "clock"]
MATERIALS = ["cotton", "ceramic", "metal", "leather", "wool", "glass", "bamboo", "plastic"]
COLORS = ["red", "blue", "green", "black"]
SIZES = ["small", "large"]
TOOLS = ("search", "click", "choose", "buy", "back")
_ACTION = re.compile(r"\b(search|click|choose)\s*\[([^\]]*)\]|\b(buy|back)\b", re.IGNORECASE)
OPTION_STATES = ("none", "right", "wrong")
RELATIVE_ACTIONS = ("search[target]", "search[other]", "click[target]", "click[other]",
                    "choose[color=target]", "choose[color=other]", "choose[size=target]",
                    "choose[size=other]", "buy", "back", "invalid")
_Q_CACHE: dict = {}  # expert_actions: (catalog, gamma, invalid_penalty, task) -> (Q*, state index)
_TOOL_LIKE = re.compile(r"\b([a-z_]+)\s*\[", re.IGNORECASE)


def make_catalog(num_categories: int = 3, items_per_category: int = 2, num_colors: int = 3,
                 colors_per_item: int = 2, num_sizes: int = 2, seed: int = 0) -> list[dict]:
    """A fixed synthetic catalog: items named ``<material>-<category>`` (e.g. cotton-shirt), each
    offered in ``colors_per_item`` of the first ``num_colors`` colours (drawn with ``seed``) and
    in every one of the first ``num_sizes`` sizes."""
    if num_categories > len(CATEGORIES) or items_per_category > len(MATERIALS):
        raise ValueError("catalog too large for the word lists")
    rng = np.random.default_rng(seed)
    colors, sizes = COLORS[:num_colors], SIZES[:num_sizes]
    items = []
    for c in range(num_categories):
        mats = rng.choice(len(MATERIALS), items_per_category, replace=False)
        for m in sorted(mats):
            offered = sorted(rng.choice(num_colors, colors_per_item, replace=False))
            items.append({"name": f"{MATERIALS[m]}-{CATEGORIES[c]}", "category": CATEGORIES[c],
                          "material": MATERIALS[m], "color": [colors[i] for i in offered],
                          "size": list(sizes)})
    return items


class ShopEnv:
    """WebShop-like multi-turn shopping: buy the item an instruction names (module docstring).

    ## Description
    A task is (item name, colour, size) from ``tasks`` (default: every offered combination of the
    catalog); the instruction names its category, material, colour and size.

    ## Actions
    Free text; the last WebShop-style action in it is read (``parse``): search[query], click[item],
    choose[attr=value], buy, back. Anything the parser or the page cannot execute is invalid: an
    error observation, the state unchanged, the turn used.

    ## Observations
    ``obs_format="full"``: the instruction, the turn counter and the page (search page, results, or
    the item page with its options and the chosen ones). ``"short"``: the target in the first one
    only, then the page in under 40 characters. At the end: what was bought and its score.

    ## Rewards
    At ``buy`` only: the attribute-match score (the mean of four checks: category, material, colour,
    size); ``invalid_penalty`` for an invalid turn.

    ## Episode end
    Terminated: ``buy`` (``success`` when the score is 1). Truncated: ``max_turns`` turns without
    it.

    ## Info
    ``protocol.INFO_KEYS`` and ``action`` (canonical), ``target``, ``instruction``, ``progress``
    (the true progress of the state), ``score`` (after buy). State key: (task, page, results, item,
    color, size) with page in {"search", "results", "item", "done"}, results a tuple of item names
    (None on the search page), item the open item (or None), color/size the chosen options (or
    None). It holds the task, so it is Markov.

    ## Arguments
    catalog (default ``make_catalog()``), max_turns, invalid_penalty, gamma (the tabular form's),
    tasks, obs_format.

    ## Exact form
    ``tabular_form(task)``: every state reachable from the search page under ``actions``, a
    deterministic ``TabularMDP`` (``expert_actions`` is its Q*); ``progress`` is the true progress.
    """

    system_prompt = "Buy what is asked. One action."

    def __init__(self, catalog: list[dict] | None = None, max_turns: int = 10,
                 invalid_penalty: float = 0.0, gamma: float = 0.95, tasks: list[tuple] | None = None,
                 obs_format: str = "full"):
        if obs_format not in ("full", "short"):
            raise ValueError(f"obs_format must be 'full' or 'short', got {obs_format!r}")
        self.obs_format = obs_format
        self.catalog = catalog if catalog is not None else make_catalog()
        self.items = {it["name"]: it for it in self.catalog}
        self.categories = list(dict.fromkeys(it["category"] for it in self.catalog))
        self.colors = sorted({c for it in self.catalog for c in it["color"]}, key=COLORS.index)
        self.sizes = sorted({s for it in self.catalog for s in it["size"]}, key=SIZES.index)
        self.actions = ([f"search[{c}]" for c in self.categories]
                        + [f"click[{n}]" for n in self.items]
                        + [f"choose[color={c}]" for c in self.colors]
                        + [f"choose[size={s}]" for s in self.sizes] + ["buy", "back"])
        if tasks is None:  # every (item, offered colour, offered size)
            tasks = [(it["name"], c, s) for it in self.catalog for c in it["color"] for s in it["size"]]
        self.tasks = [tuple(t) for t in tasks]
        self.max_turns, self.invalid_penalty, self.gamma = max_turns, invalid_penalty, gamma
        self._rng = np.random.default_rng()
        self._forms: dict[tuple, tuple] = {}
        self.num_invalid = 0
        self.task = None
        self.state = None  # (page, results, item, color, size)
        self.turn = 0

    # --- the pure dynamics ---------------------------------------------------------------------
    def instruction(self, task: tuple) -> str:
        it = self.items[task[0]]
        return (f"i need a {it['material']} {it['category']}, color {task[1]}, size {task[2]}")

    def score(self, task: tuple, item: str, color, size) -> float:
        """WebShop-style attribute match of a purchase: mean of 4 checks (category, material,
        colour, size)."""
        want, got = self.items[task[0]], self.items[item]
        checks = [got["category"] == want["category"], got["material"] == want["material"],
                  color == task[1], size == task[2]]
        return sum(checks) / 4.0

    def search_results(self, query: str) -> tuple:
        words = set(re.findall(r"[a-z]+", query.lower()))
        return tuple(n for n, it in self.items.items()
                     if it["category"] in words or it["material"] in words)

    def parse(self, text: str):
        """(tool, argument) of the last action in ``text``, or (None, error message)."""
        unreadable = protocol.action_error(text)
        if unreadable:  # the regex below is quadratic in the worst case: no long text reaches it
            return None, unreadable
        matches = list(_ACTION.finditer(text))
        if not matches:
            unknown = [t for t in _TOOL_LIKE.findall(text) if t.lower() not in TOOLS]
            if unknown:
                return None, f"unknown tool {unknown[-1]!r}; tools are {', '.join(TOOLS)}"
            return None, f"could not read an action in {text[:40]!r}"
        m = matches[-1]
        if m.group(3):
            return m.group(3).lower(), None
        return m.group(1).lower(), m.group(2).strip()

    def transition(self, task: tuple, state: tuple, text: str):
        """Pure step: (next state, reward, terminated, error message or None, canonical action).
        An invalid action returns the same state and an error."""
        page, results, item, color, size = state
        tool, arg = self.parse(text)
        if tool is None:
            return state, 0.0, False, arg, None
        if page == "done":
            return state, 0.0, True, "the episode is over", None
        if tool == "search":
            if page != "search":
                return state, 0.0, False, "search is only on the search page (go back)", None
            if not arg:
                return state, 0.0, False, "search needs a query: search[query]", None
            return ("results", self.search_results(arg), None, None, None), 0.0, False, None, \
                f"search[{arg.lower()}]"
        if tool == "click":
            name = (arg or "").lower()
            if page != "results" or name not in results:
                return state, 0.0, False, f"no item {name!r} on this page", None
            return ("item", results, name, None, None), 0.0, False, None, f"click[{name}]"
        if tool == "choose":
            if page != "item":
                return state, 0.0, False, "options can be chosen on an item page only", None
            if "=" not in (arg or ""):
                return state, 0.0, False, "choose needs attr=value, e.g. choose[color=red]", None
            attr, value = (s.strip().lower() for s in arg.split("=", 1))
            if attr not in ("color", "size") or value not in self.items[item][attr]:
                return state, 0.0, False, f"{item} has no option {attr}={value}", None
            new = ("item", results, item, value if attr == "color" else color,
                   value if attr == "size" else size)
            return new, 0.0, False, None, f"choose[{attr}={value}]"
        if tool == "buy":
            if page != "item":
                return state, 0.0, False, "buy is only on an item page", None
            r = self.score(task, item, color, size)
            return ("done", results, item, color, size), r, True, None, "buy"
        # back
        if page == "item":
            return ("results", results, None, None, None), 0.0, False, None, "back"
        if page == "results":
            return ("search", None, None, None, None), 0.0, False, None, "back"
        return state, 0.0, False, "nothing to go back to", None

    def progress(self, state_key: tuple) -> float:
        """True progress of a state, in [0, 1]: 0.2 per subgoal (found, on the target's page,
        right colour, right size, bought); after buy, the score of the purchase."""
        task, (page, results, item, color, size) = state_key[0], state_key[1:]
        if page == "done":
            return self.score(task, item, color, size)
        on_target = page == "item" and item == task[0]
        found = on_target or (page == "results" and task[0] in results)
        return (found + on_target + (on_target and color == task[1])
                + (on_target and size == task[2])) / 5.0

    # --- the protocol --------------------------------------------------------------------------
    def reset(self, seed: int | None = None, task: tuple | None = None) -> str:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.task = tuple(task) if task is not None else self.tasks[self._rng.integers(len(self.tasks))]
        self.state, self.turn = ("search", None, None, None, None), 0
        return self._observe()

    def step(self, action_text: str):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        self.turn += 1
        new, r, terminated, error, action = self.transition(self.task, self.state, action_text)
        valid = error is None
        if not valid:
            self.num_invalid += 1
            r = self.invalid_penalty
        self.state = new
        done = terminated or self.turn >= self.max_turns
        key = self.state_key()
        info = {"valid": valid, "error": error, "action": action, "state_key": key,
                "target": self.task, "instruction": self.instruction(self.task),
                "progress": self.progress(key), "truncated": done and not terminated,
                "success": bool(terminated and r == 1.0)}
        if terminated:
            info["score"] = r
            obs = f"You bought {new[2]} (color {new[3]}, size {new[4]}). Score {r:.2f}."
        elif self.obs_format == "short":
            obs = ("invalid. " if not valid else "") + self._observe()
        else:
            obs = (f"Invalid action: {error}.\n" if not valid else "") + self._observe()
        return obs, r, done, info

    def state_key(self) -> tuple:
        return (self.task,) + self.state

    def _observe(self) -> str:
        page, results, item, color, size = self.state
        if self.obs_format == "short":  # the target only in the first observation
            it = self.items[self.task[0]]
            want = (f"want {it['material']} {it['category']} {self.task[1]} {self.task[2]}. "
                    if self.turn == 0 else "")
            if page == "search":
                return want + "search"
            if page == "results":
                return "results: " + (" ".join(results) if results else "none")
            return f"item {item} got {color or '-'} {size or '-'}"
        head = f"Instruction: {self.instruction(self.task)}. Turn {self.turn + 1}/{self.max_turns}."
        if page == "search":
            return head + " [search page] Actions: search[query]."
        if page == "results":
            listed = ", ".join(results) if results else "no results"
            return head + f" [results] {listed}. Actions: click[item], back."
        it = self.items[item]
        return (head + f" [item {item}] colors: {', '.join(it['color'])}; sizes: "
                f"{', '.join(it['size'])}; chosen color {color or '-'}, size {size or '-'}. "
                f"Actions: choose[attr=value], buy, back.")

    # --- the tabular form ----------------------------------------------------------------------
    def tabular_form(self, task: tuple) -> tuple[TabularMDP, list]:
        """(mdp, keys): every state reachable from the search page under ``env.actions`` for one
        task (keys[i] is state i's state key; state 0 is the start, the last is the terminal
        sink after buy). P is deterministic; an invalid action is a self-loop paying
        ``invalid_penalty``; buy pays the score. Actions in ``env.actions`` order."""
        task = tuple(task)
        if task in self._forms:
            return self._forms[task]
        start = ("search", None, None, None, None)
        index, order, frontier = {start: 0}, [start], [start]
        edges = {}
        while frontier:
            nxt = []
            for s in frontier:
                for a, text in enumerate(self.actions):
                    s2, r, term, err, _ = self.transition(task, s, text)
                    if term:
                        s2 = "DONE"
                    edges[(s, a)] = (s2, self.invalid_penalty if err else r)
                    if s2 != "DONE" and s2 not in index:
                        index[s2] = len(order)
                        order.append(s2)
                        nxt.append(s2)
            frontier = nxt
        S, A = len(order) + 1, len(self.actions)
        P = torch.zeros(S, A, S, dtype=DTYPE)
        R = torch.zeros(S, A, dtype=DTYPE)
        for (s, a), (s2, r) in edges.items():
            P[index[s], a, S - 1 if s2 == "DONE" else index[s2]] = 1.0
            R[index[s], a] = r
        P[S - 1, :, S - 1] = 1.0
        init = torch.zeros(S, dtype=DTYPE)
        init[0] = 1.0
        terminal = torch.zeros(S, dtype=torch.bool)
        terminal[-1] = True
        keys = [(task,) + s for s in order] + [(task, "done", None, None, None, None)]
        mdp = TabularMDP(P=P, R=R, gamma=self.gamma, init=init, terminal=terminal,
                         name=f"shop{task}", state_names=[str(k) for k in keys],
                         action_names=list(self.actions), max_steps=self.max_turns)
        self._forms[task] = (mdp, keys)
        return mdp, keys

    def state_index(self, task: tuple | None = None, state_key: tuple | None = None) -> int:
        """Index of a state key (default: the current state) in ``tabular_form(task)``."""
        key = state_key if state_key is not None else self.state_key()
        _, keys = self.tabular_form(key[0])
        if key[1] == "done":
            return len(keys) - 1
        return keys.index(key)

    def expert_actions(self) -> list[str]:
        """The optimal actions of the current state (ties all listed, in ``actions`` order), by the
        task's exact Q* (``TabularMDP.optimal_q`` of ``tabular_form``). A state outside the form (reached by
        a free-text search) raises ValueError."""
        # shared by every env with this catalog and these constants (play_episodes makes one env
        # per episode; value iteration per episode would dominate a demonstration set)
        key = (json.dumps(self.catalog, sort_keys=True), self.gamma, self.invalid_penalty, self.task)
        if key not in _Q_CACHE:
            mdp, keys = self.tabular_form(self.task)
            _Q_CACHE[key] = (mdp.optimal_q(tol=1e-12).numpy(), {k: i for i, k in enumerate(keys)})
        q_table, index = _Q_CACHE[key]
        state = self.state_key()
        if state[1] == "done":
            return []
        if state not in index:
            raise ValueError(f"state {state} is outside the tabular form (a free-text search?)")
        q = q_table[index[state]]  # (A,), env.actions order
        return [self.actions[i] for i in np.flatnonzero(q >= q.max() - 1e-9)]

    def task_index(self) -> int:
        return self.tasks.index(self.task)

    def eval_panel(self, n: int = 64, seed: int = 12345) -> tuple[list[tuple], str]:
        """A fixed evaluation panel of ``n`` tasks (drawn with replacement, by ``seed``) and its
        hash: numbers from different runs are comparable only when the hashes match."""
        drawn = np.random.default_rng(seed).integers(len(self.tasks), size=n)
        return protocol.eval_panel(n, lambda i: self.tasks[int(i)], seeds=drawn,
                                   blob=lambda tasks: [tasks, self.catalog])

    def relative_key(self, state_key: tuple) -> tuple:
        """The state seen relative to its task (which of the subgoals hold, what is open):
        (page, target found, on target item, colour right/wrong/none, size right/wrong/none).
        Many tasks share these keys, so a table over them generalises across tasks."""
        task, (page, results, item, color, size) = state_key[0], state_key[1:]
        on_target = item == task[0]

        def opt(v, want):
            return "none" if v is None else ("right" if v == want else "wrong")
        return (page, bool(results) and task[0] in results, on_target,
                opt(color, task[1]), opt(size, task[2]))

    def relative_action(self, state_key: tuple, action: str) -> str:
        """An action named relative to the task: 'search[target]', 'click[other]', ...."""
        task = state_key[0]
        tool, arg = self.parse(action)
        if tool == "search":
            return "search[target]" if task[0] in self.search_results(arg) else "search[other]"
        if tool == "click":
            return "click[target]" if arg == task[0] else "click[other]"
        if tool == "choose" and arg and "=" in arg:
            attr, value = (s.strip() for s in arg.split("=", 1))
            want_v = task[1] if attr == "color" else task[2]
            return f"choose[{attr}={'target' if value == want_v else 'other'}]"
        return tool or "invalid"

    def relative_features(self, state_key: tuple, action: str) -> np.ndarray:
        """One-hot blocks of ``relative_key`` (page, found, on target, colour, size) and of
        ``relative_action``: a fixed-length (25,) vector, the same for every catalog."""
        page, found, on_target, color, size = self.relative_key(state_key)
        act = self.relative_action(state_key, action)
        act = act if act in RELATIVE_ACTIONS else "invalid"  # e.g. 'choose' without attr=value
        blocks = [(page, ("search", "results", "item", "done")), (found, (False, True)),
                  (on_target, (False, True)), (color, OPTION_STATES), (size, OPTION_STATES),
                  (act, RELATIVE_ACTIONS)]
        out = []
        for value, values in blocks:
            out += [float(value == v) for v in values]
        return np.array(out)


def eval_panel(env: ShopEnv, n: int = 64, seed: int = 12345) -> tuple[list[tuple], str]:
    """``env.eval_panel(n, seed)``."""
    return env.eval_panel(n, seed)


def panel_hash(tasks: list[tuple], catalog: list[dict]) -> str:
    """The hash of a panel of tasks in a catalog (laid out [tasks, catalog])."""
    return protocol.panel_hash([tasks, catalog])

