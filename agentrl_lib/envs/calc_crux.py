"""CalcCruxEnv: ``CalcToolEnv``'s "order" task played through a finite menu whose crux decision
follows the tool output (notebook 55, ARPO's tabular rung).

The task is CalcToolEnv's "order" template ("I want 4 tea. What is the total price?"): look the
item's price up, multiply, answer. The menu (``ACTIONS``, the same meaning in every task):

- ``lookup``: ``lookup(key=<the item>)``, a tool call whose result is the price p;
- ``lookup_other``: ``lookup(key=<another item>)``, a tool call with a misleading price;
- ``calc_2`` .. ``calc_9``: ``calc(expression="<n>*<q>")`` for each candidate price q in
  ``PRICE_SET``: the crux, since the right one is the q the lookup returned;
- ``answer``: ``answer(value=<the last calc result>)`` (``answer(value="0")`` before any calc).

Every call goes to the inner ``CalcToolEnv`` (``self.env``), which executes it and pays the outcome
reward. The state the tabular policy sees (``state_key``) is what the conversation shows that
matters for the next call: ``("start",)`` before any tool call, ``("lookup", p)`` after a lookup
that returned p, ``("calc",)`` after a calc. A ``("lookup", p)`` state is the decision right after a
tool response: eight of them, one per price, so each is visited about an eighth as often as the
start, and a policy stays uncertain there for longer: the tabular analogue of ARPO's observation
that an LM's token entropy rises right after a tool response.

Deterministic given (seed, actions) (``reset(seed)`` then replaying the calls restores a state:
tree rollouts by prefix replay). ``tool_call`` names the calls that count against a tool-call budget
(lookup and calc; answer is the reply to the user).
"""

from __future__ import annotations

import numpy as np

from agentrl_lib.envs import protocol
from agentrl_lib.envs.calc_tool import PRICES, CalcToolEnv
from agentrl_lib.rewards.tool_calls import format_call

PRICE_SET = tuple(sorted(set(PRICES.values())))  # the candidate prices 2..9
ACTIONS = ["lookup", "lookup_other"] + [f"calc_{q}" for q in PRICE_SET] + ["answer"]
TOOL_CALLS = ("lookup", "calc")


class CalcCruxEnv:
    """The "order" task through ``ACTIONS`` (module docstring).

    ## Description
    ``CalcToolEnv``'s "order" template played through a finite menu whose crux decision (which price
    to multiply by) follows the tool output: ARPO's tabular rung. Deterministic given (seed,
    actions).

    ## Actions
    An index into ``ACTIONS`` (lookup, lookup_other, calc_2 .. calc_9, answer; ``actions`` holds
    their call texts now), or a call text itself; anything else goes to the inner ``CalcToolEnv``,
    which reads it as a malformed call (invalid, the turn used).

    ## Observations
    The inner environment's.

    ## Rewards
    The inner environment's: 1 for the right answer, else 0.

    ## Episode end
    The inner environment's: terminated by an answer, truncated at ``max_turns``.

    ## Info
    The inner environment's, with ``state_key`` (("start",), ("lookup", p) or ("calc",)) and
    ``tool_call`` (a call that counts against the tool-call budget: lookup and calc).

    ## Arguments
    max_turns: the turn cap (>= 3: lookup, calc, answer).

    ## Exact form
    ``success_probability(probs_fn)``: the exact success probability of a policy over the state
    keys, by recursion over (key, whether the last calc is right, turns used).
    """

    tool_calls = TOOL_CALLS

    def __init__(self, max_turns: int = 5):
        if max_turns < 3:
            raise ValueError(f"max_turns must be >= 3 (lookup, calc, answer), got {max_turns}")
        self.env = CalcToolEnv(templates=("order",), max_turns=max_turns, show_tools=False)
        self.max_turns = int(max_turns)
        self.task = None
        self.last = ("start",)
        self.result = None  # the last calc result, what answer replies

    @property
    def actions(self) -> list[str]:
        """The call texts of ``ACTIONS`` in the current state (index i means ACTIONS[i])."""
        item, n = self.task.entities["item"], self.task.entities["n"]
        items = sorted(PRICES)
        other = next(it for k in range(1, len(items))
                     if PRICES[it := items[(items.index(item) + k) % len(items)]] != PRICES[item])
        return ([format_call("lookup", {"key": item}), format_call("lookup", {"key": other})]
                + [format_call("calc", {"expression": f"{n}*{q}"}) for q in PRICE_SET]
                + [format_call("answer", {"value": self.result or "0"})])

    def reset(self, seed: int | None = None) -> str:
        obs = self.env.reset(seed=seed)
        self.task, self.last, self.result = self.env.task, ("start",), None
        return obs

    def state_key(self) -> tuple:
        return self.last

    def step(self, action):
        """``action``: an index into ``ACTIONS`` or the call text itself (anything else goes to
        the inner env as it is, which reads it as a malformed call)."""
        i = None if isinstance(action, str) else protocol.menu_index(action, ACTIONS)
        obs, reward, done, info = self.env.step(action if i is None else self.actions[i])
        if info["valid"] and info["tool"] == "lookup":
            self.last = ("lookup", obs.split(" returned ")[1].rstrip("."))
        elif info["valid"] and info["tool"] == "calc":
            self.last, self.result = ("calc",), obs.split(" returned ")[1].rstrip(".")
        info = {**info, "state_key": self.last, "tool_call": info["tool"] in TOOL_CALLS}
        return obs, reward, done, info

    def expert_actions(self) -> list[str]:
        """The scripted agent: lookup, the calc with the looked-up price, answer."""
        if self.last == ("start",):
            return ["lookup"]
        if self.last[0] == "lookup":
            return [f"calc_{self.last[1]}"]
        return ["answer"]

    def eval_panel(self, n: int = 64):
        return self.env.eval_panel(n)

    def success_probability(self, probs_fn) -> float:
        """The exact success probability of a policy over ``state_key``s, probs_fn(key) -> (A,)
        probabilities over ``ACTIONS``, averaged over the items (the task draws them uniformly; n
        does not matter: n*q = n*p iff q = p). A recursion over (key, whether the last calc result
        is right, turns used), cut at ``max_turns``."""
        items = sorted(PRICES)
        i_calc, i_answer = ACTIONS.index("calc_2"), ACTIONS.index("answer")
        total = 0.0
        for item in items:
            p_true = PRICES[item]
            other = next(it for k in range(1, len(items))
                         if PRICES[it := items[(items.index(item) + k) % len(items)]] != p_true)
            memo = {}

            def value(key, right, t):
                if t >= self.max_turns:
                    return 0.0
                if (key, right, t) not in memo:
                    pi = np.asarray(probs_fn(key), dtype=np.float64)
                    v = pi[0] * value(("lookup", str(p_true)), right, t + 1)
                    v += pi[1] * value(("lookup", str(PRICES[other])), right, t + 1)
                    for j, q in enumerate(PRICE_SET):
                        v += pi[i_calc + j] * value(("calc",), q == p_true, t + 1)
                    v += pi[i_answer] * float(right)
                    memo[(key, right, t)] = v
                return memo[(key, right, t)]
            total += value(("start",), False, 0)
        return total / len(items)
