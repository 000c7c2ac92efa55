"""CalcToolEnv: function-calling tasks with a calculator, lookup tables and a scripted user.

The shared environment of the tool-use reward papers (ToolRL, CM2). Each episode the scripted user
states a task; the agent answers every turn with **one call** in the strict syntax of
``rewards.tool_calls.parse_call`` (Python-style, keyword arguments only, string or integer values)::

    calc(expression="3*4+5")    lookup(key="apple")    confirm(value="17")    answer(value="17")

Tools (``TOOLS``: parameter names in order, a description with its keyword):

- ``calc(expression)``: arithmetic, parsed by ``safe_eval`` (an ``ast`` whitelist with size, depth,
  value and exponent bounds; never ``eval``; without its wall-clock bound, so that an episode
  does not depend on the machine's load);
- ``lookup(key)``: the price of an item (``PRICES``); ``capital(country)`` (``CAPITALS``);
  ``add(a, b)``: the sum of two integers;
- held out (``HELDOUT_TOOLS``, only in ``split="heldout"`` tasks): ``multiply(x, y)``,
  ``stock(item)`` (``STOCK``);
- the user-facing actions: ``confirm(value)`` asks the user to confirm a result (the scripted user
  answers "Yes, ..." when it is right, "No, ..." otherwise) and ``answer(value)`` gives the final
  answer and ends the episode.

A task (``Task``) holds the request, its template, the gold call sequence (``gold``: canonical call
texts, the last one ``answer``), whether confirmation is required and the answer. Templates
(``TEMPLATES``): "calc", "price", "capital", "sum", "order" (lookup, then calc, multi-step),
held out "product" (multiply) and "stock". With ``confirm_prob > 0`` a task may require the agent
to confirm the result with the user before answering (the request says so; a ``confirm`` call is
then inserted before ``answer`` in the gold sequence).

**The protocol** is ``envs/protocol.py``'s; ``CalcToolEnv``'s docstring has its actions,
rewards (outcome only), episode end and info.

``info["checks"]`` is the turn's **checklist**: binary criteria of the call against the gold call
expected at this point (``stage``): ``valid`` (parses), ``right_tool``, ``right_arg_names``,
``right_values`` and ``confirmation`` (on an ``answer`` turn of a task requiring confirmation:
confirmed before; None where a criterion does not apply). ``rewards.judges.checklist_reward``
turns these into per-turn rewards. The stage advances when the call equals the expected one
(canonical comparison), so the state key (task, stage, confirmed) is Markov for a tabular policy.

``ChecklistJudgedEnv`` wraps it as CM2 rolls a dialogue out (arXiv 2602.12268, §3.3): a judge
labels every turn's checklist during the rollout (``info["verdicts"]``), the rollout ends early
when a strictness item fails, and after the reference dialogue's last turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agentrl_lib.envs import protocol
from agentrl_lib.rewards.judges import NoisyJudge, judged_checks
from agentrl_lib.rewards.tool_calls import canonical_args, format_call, parse_call, safe_eval

PRICES = {"apple": 3, "bread": 4, "milk": 2, "cheese": 7, "eggs": 5, "rice": 6, "tea": 8, "jam": 9}
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima",
            "Norway": "Oslo", "Egypt": "Cairo", "Chile": "Santiago", "India": "Delhi"}
STOCK = {"apple": 12, "bread": 5, "milk": 9, "cheese": 3, "eggs": 30, "rice": 14, "tea": 7, "jam": 2}

TOOLS = {  # name: (parameter names in order, description; its first word is the request keyword)
    "calc": (("expression",), "compute: evaluate an arithmetic expression"),
    "lookup": (("key",), "price: the price of an item in the shop"),
    "capital": (("country",), "capital: the capital city of a country"),
    "add": (("a", "b"), "sum: the sum of two integers"),
    "multiply": (("x", "y"), "product: the product of two integers"),
    "stock": (("item",), "stock: how many units of an item are in stock"),
    "confirm": (("value",), "confirm: ask the user to confirm a result"),
    "answer": (("value",), "answer: give the final answer to the user"),
}
HELDOUT_TOOLS = ("multiply", "stock")
USER_TOOLS = ("confirm", "answer")
TEMPLATES = {"train": ("calc", "price", "capital", "sum", "order"),
             "heldout": ("product", "stock")}
CONFIRM_TEXT = " Please confirm the result with me before you answer."


def tool_keyword(name: str) -> str:
    """The request keyword of a tool: the word before ':' in its description."""
    return TOOLS[name][1].split(":")[0]


@dataclass
class Task:
    template: str
    request: str
    gold: list  # canonical call texts, in order; the last is answer(value=...)
    answer: str
    needs_confirm: bool = False
    entities: dict = field(default_factory=dict)

    def key(self) -> tuple:
        return (self.template, self.request, self.needs_confirm)


def make_task(template: str, rng: np.random.Generator, needs_confirm: bool = False) -> Task:
    """Draw one task of ``template`` (numbers and keys from ``rng``)."""
    items, countries = sorted(PRICES), sorted(CAPITALS)
    if template == "calc":
        a, b, c = (int(x) for x in rng.integers(2, 10, size=3))
        expr = f"{a}*{b}+{c}"
        req, calls, ans, ent = f"Compute {expr}.", [format_call("calc", {"expression": expr})], \
            str(a * b + c), {"expression": expr}
    elif template == "price":
        it = items[rng.integers(len(items))]
        req, calls, ans, ent = f"What is the price of {it}?", [format_call("lookup", {"key": it})], \
            str(PRICES[it]), {"item": it}
    elif template == "capital":
        co = countries[rng.integers(len(countries))]
        req, calls, ans, ent = f"What is the capital of {co}?", \
            [format_call("capital", {"country": co})], CAPITALS[co], {"country": co}
    elif template == "sum":
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
        req, calls, ans, ent = f"What is the sum of {a} and {b}?", \
            [format_call("add", {"a": a, "b": b})], str(a + b), {"a": a, "b": b}
    elif template == "order":
        it, n = items[rng.integers(len(items))], int(rng.integers(2, 10))
        expr = f"{n}*{PRICES[it]}"
        req = f"I want {n} {it}. What is the total price?"
        calls = [format_call("lookup", {"key": it}), format_call("calc", {"expression": expr})]
        ans, ent = str(n * PRICES[it]), {"item": it, "n": n}
    elif template == "product":
        a, b = (int(x) for x in rng.integers(2, 20, size=2))
        req, calls, ans, ent = f"What is the product of {a} and {b}?", \
            [format_call("multiply", {"x": a, "y": b})], str(a * b), {"a": a, "b": b}
    elif template == "stock":
        it = items[rng.integers(len(items))]
        req, calls, ans, ent = f"How many {it} are in stock?", \
            [format_call("stock", {"item": it})], str(STOCK[it]), {"item": it}
    else:
        raise ValueError(f"unknown template {template!r}; choose one of "
                         f"{TEMPLATES['train'] + TEMPLATES['heldout']}")
    if needs_confirm:
        req += CONFIRM_TEXT
        calls.append(format_call("confirm", {"value": ans}))
    calls.append(format_call("answer", {"value": ans}))
    return Task(template, req, calls, ans, needs_confirm, ent)


def run_tool(name: str, args: dict):
    """Execute a (non-user) tool on canonical string arguments: (result text, None) or (None,
    error message). Never raises."""
    try:
        if name == "calc":
            # safe_eval bounds its work, never the clock: a deadline once made an episode depend
            # on the machine's load (a descheduled process timed out "7*4" and a judged run of
            # notebook 26 diverged from its rerun)
            return str(safe_eval(args["expression"])), None
        if name == "lookup":
            if args["key"] not in PRICES:
                return None, f"lookup: unknown key {args['key'][:40]!r}"
            return str(PRICES[args["key"]]), None
        if name == "capital":
            if args["country"] not in CAPITALS:
                return None, f"capital: unknown country {args['country'][:40]!r}"
            return CAPITALS[args["country"]], None
        if name == "stock":
            if args["item"] not in STOCK:
                return None, f"stock: unknown item {args['item'][:40]!r}"
            return str(STOCK[args["item"]]), None
        if name in ("add", "multiply"):
            p, q = TOOLS[name][0]
            try:
                u, v = int(args[p]), int(args[q])
            except ValueError:
                return None, f"{name}: arguments must be integers"
            if max(abs(u), abs(v)) > 10**12:
                return None, f"{name}: arguments too large"
            return str(u + v if name == "add" else u * v), None
    except ValueError as e:
        return None, f"{name}: {e}"
    return None, f"unknown tool {name!r}"


MENU = ("call1", "call1_wrong_tool", "call1_wrong_arg", "call1_wrong_value", "call2",
        "call2_wrong_value", "confirm", "confirm_wrong", "answer", "answer_wrong", "malformed")
"""the kinds of action of ``CalcToolEnv.action_menu`` (a relative action set)"""
_OTHER_TOOL = {"calc": "lookup", "lookup": "capital", "capital": "lookup", "add": "multiply",
               "multiply": "add", "stock": "lookup"}


def _wrong_value(v: str) -> str:
    """A plausible wrong value: an integer + 1, the next key of its table, or a changed digit."""
    if v.lstrip("-").isdigit():
        return str(int(v) + 1)
    for table in (sorted(PRICES), sorted(CAPITALS), sorted(CAPITALS.values())):
        if v in table:
            return table[(table.index(v) + 1) % len(table)]
    return v[:-1] + ("1" if v[-1:] != "1" else "2")


def _perturb(call: str, what: str) -> str:
    """The call with a wrong tool name ("tool"), first argument name ("arg") or value ("value")."""
    name, args = parse_call(call)
    args = canonical_args(args)
    first = next(iter(args))
    if what == "tool":
        return format_call(_OTHER_TOOL.get(name, "calc"), args)
    if what == "arg":
        return format_call(name, {("input" if k == first else k): v for k, v in args.items()})
    return format_call(name, {k: (_wrong_value(v) if k == first else v) for k, v in args.items()})


class CalcToolEnv:
    """Function-calling episodes with a scripted user (see the module docstring).

    ## Description
    The scripted user states a task (``Task``, drawn from ``templates``); the agent calls tools and
    finally answers. With ``confirm_prob > 0`` a task may require confirming the result with the
    user first.

    ## Actions
    One call per turn in the strict syntax of ``rewards.tool_calls.parse_call`` (keyword arguments
    only, string or integer values, at most ``MAX_CALL_CHARS`` characters): the tools of ``tools``,
    ``confirm(value)`` and ``answer(value)``. A malformed call, an unknown tool, wrong argument
    names or a bad argument value is invalid (``info["error_kind"]`` says which); it uses the turn.
    ``actions`` is the current task's relative menu (``action_menu``).

    ## Observations
    At reset the tool list (``show_tools``) and "User: <request>"; then "<tool> returned <result>.",
    the user's reply to confirm / answer, or "Error: ...".

    ## Rewards
    Outcome only: ``success_reward`` when the final answer is right (and confirmed when required),
    else 0; ``invalid_penalty`` for an invalid turn.

    ## Episode end
    Terminated: an ``answer`` call, right (``success``) or wrong. Truncated: ``max_turns`` turns
    without one. A step after the end raises RuntimeError (call reset).

    ## Info
    ``protocol.INFO_KEYS`` (state_key: (task, stage, confirmed)) and ``checks`` (the turn's
    checklist against the expected gold call), ``error_kind``, ``answer``, ``template``, ``tool``,
    ``args``, ``stage_before``, ``stage``.

    ## Arguments
    split: "train" or "heldout" (the held-out tools' templates); templates: override the split's;
    confirm_prob: probability a task requires confirmation; max_turns: turn cap; success_reward: the
    outcome reward; invalid_penalty: reward of a turn whose call fails; show_tools: list the tools
    at reset.

    ## Exact form
    None; the state key is Markov for a tabular policy (the stage advances on the expected call).
    """

    system_prompt = ("Answer each turn with one tool call, name(arg=\"value\"). Finish with "
                     "answer(value=\"...\").")

    def __init__(self, split: str = "train", templates: tuple | None = None,
                 confirm_prob: float = 0.0, max_turns: int = 6, success_reward: float = 1.0,
                 invalid_penalty: float = 0.0, show_tools: bool = True):
        if split not in TEMPLATES:
            raise ValueError(f"unknown split {split!r}; choose one of {list(TEMPLATES)}")
        self.split = split
        self.templates = tuple(templates or TEMPLATES[split])
        for t in self.templates:
            make_task(t, np.random.default_rng(0))  # validates the name
        self.confirm_prob, self.max_turns = float(confirm_prob), int(max_turns)
        self.success_reward, self.invalid_penalty = success_reward, invalid_penalty
        self.show_tools = show_tools
        self.tools = [t for t in TOOLS if split == "heldout" or t not in HELDOUT_TOOLS]
        self._rng = np.random.default_rng()
        self.num_invalid = 0
        self.task: Task | None = None
        self.stage = 0
        self.turn = 0
        self.confirmed = False
        self.done = False

    def reset(self, seed: int | None = None, task: Task | None = None) -> str:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if task is None:
            tpl = self.templates[self._rng.integers(len(self.templates))]
            task = make_task(tpl, self._rng, bool(self._rng.random() < self.confirm_prob))
        self.task, self.stage, self.turn, self.confirmed, self.done = task, 0, 0, False, False
        head = ""
        if self.show_tools:
            head = "Tools: " + "; ".join(
                f"{n}({', '.join(TOOLS[n][0])}): {TOOLS[n][1].split(': ', 1)[1]}"
                for n in self.tools) + "\n"
        return head + "User: " + task.request

    def expected_call(self) -> str:
        """The gold call expected now (the scripted demonstrator's action)."""
        return self.task.gold[min(self.stage, len(self.task.gold) - 1)]

    def expert_actions(self) -> list[str]:
        return [self.expected_call()]

    def state_key(self) -> tuple:
        """(task, stage, confirmed): Markov for a tabular policy."""
        return (self.task.key(), self.stage, self.confirmed)

    def checks(self, name: str | None, args: dict | None) -> dict:
        """The turn's checklist against the expected call (None: the criterion does not apply)."""
        g_name, g_args = parse_call(self.expected_call())
        g_args = canonical_args(g_args)
        if name is None:
            return {"valid": False, "right_tool": False, "right_arg_names": False,
                    "right_values": False,
                    "confirmation": (False if (g_name == "answer" and self.task.needs_confirm)
                                     else None)}
        args = canonical_args(args)
        out = {"valid": True, "right_tool": name == g_name,
               "right_arg_names": set(args) == set(g_args),
               "right_values": name == g_name and args == g_args, "confirmation": None}
        if name == "answer" and self.task.needs_confirm:
            out["confirmation"] = bool(self.confirmed)
        return out

    def step(self, action_text: str):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            raise RuntimeError("the episode is over; call reset()")
        self.turn += 1
        info = {"valid": True, "error": None, "error_kind": None, "answer": self.task.answer,
                "template": self.task.template, "tool": None, "args": None, "success": False,
                "stage_before": self.stage, "truncated": False}
        try:
            name, args = parse_call(action_text)
        except ValueError as e:
            name, args, err, kind = None, None, str(e), "malformed"
        else:
            err, kind = None, None
            if name not in self.tools:
                err, kind = f"unknown tool {name!r}; tools: {', '.join(self.tools)}", "unknown_tool"
            elif set(args) != set(TOOLS[name][0]):
                err = (f"{name}() takes arguments ({', '.join(TOOLS[name][0])}), got "
                       f"({', '.join(args) or 'none'})")
                kind = "bad_arguments"
        info["checks"] = self.checks(name, args)
        info.update(tool=name, args=None if args is None else canonical_args(args))
        reward, obs = 0.0, None
        if err is None:
            cargs = canonical_args(args)
            matched = format_call(name, cargs) == self.expected_call()
            if name == "answer":
                ok = cargs["value"] == self.task.answer and (self.confirmed
                                                             or not self.task.needs_confirm)
                self.done = True
                info["success"] = bool(ok)
                reward = self.success_reward if ok else 0.0
                obs = "User: Thank you, that is right." if ok else "User: That is not right."
            elif name == "confirm":
                if cargs["value"] == self.task.answer:
                    self.confirmed = True
                    obs = "User: Yes, that is right. Please go ahead."
                else:
                    obs = "User: No, that does not look right."
            else:
                result, terr = run_tool(name, cargs)
                if terr is not None:
                    err, kind = terr, "tool_error"
                else:
                    obs = f"{name} returned {result}."
            if err is None and matched:
                self.stage += 1
        if err is not None:
            self.num_invalid += 1
            info.update(valid=False, error=err, error_kind=kind)
            reward = self.invalid_penalty
            obs = f"Error: {err}"
        if not self.done and self.turn >= self.max_turns:
            self.done = True
            info["truncated"] = True
        info["state_key"] = self.state_key()
        info["stage"] = self.stage
        return obs, reward, self.done, info

    # --- a relative action menu, for tabular policies ----------------------------------------
    @property
    def actions(self) -> list[str]:
        """The current task's ``action_menu()``: the symbolic action set of the multi-turn protocol
        (``rollout.play_episodes`` and ``sft.scripted_policy`` index into it; the gold calls are
        in it, so ``expert_actions()`` are too)."""
        return self.action_menu()

    def action_menu(self) -> list[str]:
        """The call texts of ``MENU`` for the current task, in that order: the same index means
        the same kind of action in every task (the first and second gold tool calls, each with a
        wrong tool, argument name or value; confirm and answer, right or wrong; a malformed call),
        so a table over (template, needs_confirm, stage, confirmed) x MENU is a policy for every
        task. A one-call task's "call2" repeats its call (a redundant call)."""
        tool_calls = [g for g in self.task.gold if parse_call(g)[0] not in USER_TOOLS]
        c1 = tool_calls[0]
        c2 = tool_calls[1] if len(tool_calls) > 1 else c1
        wrong = _wrong_value(self.task.answer)
        return [c1, _perturb(c1, "tool"), _perturb(c1, "arg"), _perturb(c1, "value"), c2,
                _perturb(c2, "value"), format_call("confirm", {"value": self.task.answer}),
                format_call("confirm", {"value": wrong}),
                format_call("answer", {"value": self.task.answer}),
                format_call("answer", {"value": wrong}), c1.replace("=", "=(", 1)]

    # --- fixed panels -----------------------------------------------------------------------------
    def eval_panel(self, n: int = 64) -> tuple[list[tuple[int, Task]], str]:
        """``n`` (seed, task) pairs from seeds 10**6 + i and a hash of them and the game."""
        def game(panel):
            return [self.split, self.templates, self.confirm_prob, self.max_turns, self.tools,
                    [(s, t.request, t.gold) for s, t in panel]]
        # drawn by this env's own reset (a fresh env would leave this one's rng where it was)
        return protocol.eval_panel(n, protocol.reset_task(self), blob=game)


class ChecklistJudgedEnv:
    """A ``CalcToolEnv`` rolled out as CM2 rolls out a dialogue (arXiv 2602.12268, §3.3).

    ## Description
    A wrapper: every attribute but ``reset`` and ``step`` is the wrapped environment's. After each
    turn a judge labels the turn's checklist (``rewards.judges.judged_checks``: each applicable
    criterion flipped with probability ``judge.flip``); CM2 then "enforce[s] the strictness
    constraints: if all strictness items are satisfied, we issue the next user query from the
    reference trajectory; otherwise, we terminate the rollout early" (§3.3; the released
    ``verl/interactions/checklist_interaction.py``, ``generate_response_for_single_checklist``:
    ``should_terminate_sequence = True`` when a ``required_for_next_turn`` item is unmet, and
    after the reference's last turn). Here a turn is one call, the reference dialogue is the gold
    call sequence, and the strictness items are ``strict`` (default ``right_values``: the call is
    the expected one, without which the scripted user's next turn does not follow).

    ## Actions
    The wrapped environment's.

    ## Observations
    The wrapped environment's.

    ## Rewards
    The wrapped environment's (the outcome); the checklist reward is computed from
    ``info["verdicts"]`` (``judges.checklist_reward``).

    ## Episode end
    The wrapped environment's, and terminated (``info["stopped"]``) when the judge fails a
    strictness item of a turn that did not end the episode; truncated after ``len(task.gold)``
    turns (the reference dialogue's length) or at the wrapped cap.

    ## Info
    The wrapped environment's, plus ``verdicts`` (the judge's labels of ``checks``, None where a
    criterion does not apply) and ``stopped``.

    ## Arguments
    env: a ``CalcToolEnv``; judge: a ``rewards.judges.NoisyJudge``; rng: the judge's generator
    (shared by the wrappers of one run, so a seeded run is reproducible); strict: the names of the
    strictness criteria.

    ## Exact form
    None (the judge's flips end episodes at random).
    """

    def __init__(self, env: CalcToolEnv, judge: NoisyJudge, rng: np.random.Generator,
                 strict: tuple = ("right_values",)):
        self.env, self.judge, self.rng, self.strict = env, judge, rng, tuple(strict)
        self.ended = False

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, seed: int | None = None, task: Task | None = None) -> str:
        self.ended = False
        return self.env.reset(seed=seed, task=task)

    def step(self, action_text: str):
        if self.ended:
            raise RuntimeError("the episode is over; call reset()")
        obs, reward, done, info = self.env.step(action_text)
        verdicts = judged_checks(info["checks"], self.judge, self.rng)
        info = {**info, "verdicts": verdicts, "stopped": False}
        if not done and any(verdicts.get(k) is False for k in self.strict):
            done, info["stopped"] = True, True
        elif not done and self.env.turn >= len(self.env.task.gold):
            done, info["truncated"] = True, True
        self.ended = done
        return obs, reward, done, info
