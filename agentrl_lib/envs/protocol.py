"""The checked protocol of the agent environments (Gymnasium's habits, in text).

Every multi-turn environment an agent plays (``envs/__init__.py``'s ``AGENT_ENVS``, the menu
environments, the team environment) follows ``AgentEnv``::

    observation = env.reset(seed)                                   # str
    observation, reward, done, info = env.step(action)             # info has INFO_KEYS
    env.max_turns                                                   # the turn cap
    panel, panel_hash = env.eval_panel(n)                           # through ``eval_panel`` below

``info`` always carries ``INFO_KEYS``: ``state_key`` (hashable: the true state, for anchor-state
grouping and exact oracles), ``valid`` (the action was read and executed), ``error`` (a message or
None), ``success`` (the task was solved) and ``truncated``. Gymnasium keeps the two ends apart:
*terminated* is the task's own end (solved, or failed for good: a wrong answer, a purchase), after
which nothing more can be earned; *truncated* is the turn cap cutting a live episode, after which a
critic should bootstrap (Pardo et al. 2018, "Time limits in RL", arXiv:1712.00378). ``done`` is
terminated or truncated, and ``info["truncated"]`` is True exactly when the cap ended an episode
that the task had not ended.

**One rule for bad actions.** ``step`` never raises on what an agent can send: malformed, empty,
very long or non-ASCII text, or a non-string (None, a number) where text is expected, or an index
or name outside a menu. Such an action is *invalid*: an error observation, ``info["valid"]`` False
with a message in ``info["error"]``, the environment's invalid-action cost, counted in
``env.num_invalid``. A text longer than ``MAX_ACTION_CHARS`` is invalid before any parser reads
it (the shop's parser and the search index's query cost grow faster than linearly in the text).

``eval_panel`` is the one implementation of every environment's evaluation panel and its hash:
numbers from two runs are comparable only when their hashes match, and committed results record
the hash (``eval_panel_hash``), so each environment's panel and hash are kept as they were.

``check_env`` is the environment checker (Gymnasium's ``utils.env_checker``): it plays the bad
actions, a turn-capped episode and the expert's episode, and checks the rules above;
tests/test_env_protocol.py runs it over every agent environment. ``DOC_HEADINGS`` are the headings
every environment's class docstring has.
"""

from __future__ import annotations

import hashlib
import json
import numbers
from typing import Protocol, runtime_checkable

PANEL_SEED = 10**6
"""the first seed of an evaluation panel (seeds PANEL_SEED + i; training seeds stay below)"""
MAX_ACTION_CHARS = 4096
"""the longest action text an environment reads (a longer one is invalid, before any parsing);
far above what an agent here writes (``max_new_tokens`` <= 100)"""
INFO_KEYS = ("state_key", "valid", "error", "success", "truncated")
"""the keys every ``step``'s info has"""
DOC_HEADINGS = ("Description", "Actions", "Observations", "Rewards", "Episode end", "Info",
                "Arguments", "Exact form")
"""the ``## heading`` lines of every environment's class docstring, in this order (Gymnasium's);
"Episode end" says what terminates an episode and what truncates it"""


@runtime_checkable
class AgentEnv(Protocol):
    """The multi-turn text environment of the module docstring (structural: no base class)."""

    max_turns: int

    def reset(self, seed: int | None = None) -> str: ...

    def step(self, action) -> tuple[str, float, bool, dict]: ...

    def eval_panel(self, n: int = 64) -> tuple[list, str]: ...


def action_error(action) -> str | None:
    """Why a text environment cannot read ``action`` (not a string, or longer than
    ``MAX_ACTION_CHARS``), or None when it can.

    >>> action_error("left") is None, action_error(None), action_error("x" * 5000)[:24]
    (True, 'the action must be text, got NoneType', 'the action is 5000 chara')
    """
    if not isinstance(action, str):
        return f"the action must be text, got {type(action).__name__}"
    if len(action) > MAX_ACTION_CHARS:
        return f"the action is {len(action)} characters long; at most {MAX_ACTION_CHARS} are read"
    return None


def menu_index(action, actions) -> int | None:
    """The index of a menu action given as an index into ``actions`` (an integer, not a bool) or
    as one of its names; None for anything else (out of range, unknown, another type).

    >>> menu_index(1, ["a", "b"]), menu_index("b", ["a", "b"]), menu_index(-1, ["a", "b"])
    (1, 1, None)
    """
    if isinstance(action, numbers.Integral) and not isinstance(action, bool):
        return int(action) if 0 <= action < len(actions) else None
    if isinstance(action, str) and action in actions:
        return list(actions).index(action)
    return None


def panel_hash(blob) -> str:
    """The first 16 hex digits of the sha256 of ``json.dumps(blob)`` (tuples as lists)."""
    return hashlib.sha256(json.dumps(blob, default=list).encode()).hexdigest()[:16]


def eval_panel(n: int, entry=None, game=None, *, seeds=None, blob=None) -> tuple[list, str]:
    """The evaluation panel of an environment and its hash, the one implementation.

    panel = [entry(s) for s in seeds], seeds PANEL_SEED .. PANEL_SEED + n - 1 unless given (``n``
    of them), entry the identity unless given; hash = ``panel_hash([game, panel])``, or
    ``panel_hash(blob(panel))`` for an environment whose recorded hash is laid out otherwise.
    """
    seeds = list(range(PANEL_SEED, PANEL_SEED + n)) if seeds is None else list(seeds)
    if len(seeds) != n:
        raise ValueError(f"a panel of {n} needs {n} seeds, got {len(seeds)}")
    panel = [s if entry is None else entry(s) for s in seeds]
    return panel, panel_hash([game, panel] if blob is None else blob(panel))


def reset_task(env):
    """The panel entry ``seed -> (seed, env.task)`` after ``env.reset(seed=seed)``."""
    def entry(seed):
        env.reset(seed=seed)
        return (seed, env.task)
    return entry


BAD_ACTIONS = ("", "   \n\t", "x" * 100_000, "search[" * 20_000, "(" * 5000,
               "open(d99999999999999999999)", "open(d" + "9" * 5000 + ")", "answer()",
               "héllo wörld ☃ 日本語 🙂", "\x00\x01\x1b[31m", None, 3.5, b"left", ["up"], -1)
"""actions no environment may raise on; each is invalid in every environment"""


def check_env(make_env, seeds=(0, 1), stall=None, expert: bool = True,
              panel_size: int = 8) -> None:
    """Check an environment against the protocol; AssertionError names the first violation.

    make_env: () -> a fresh environment. stall: an action that uses a turn and ends nothing
    (None: ``"?"``, invalid everywhere); played ``max_turns`` times it must end the episode
    exactly at the cap with ``truncated`` True, and False before; ``stall=False`` skips this, for
    an environment whose invalid actions use no turn. expert: also play ``expert_actions()[0]`` to
    the end (an episode ended before the cap is not truncated). Checks: ``AgentEnv``; reset gives
    a string, the same for the same seed; every action of ``BAD_ACTIONS`` steps without raising,
    invalid, with ``INFO_KEYS``; the panel is the same
    twice, with a 16-digit hex hash.
    """
    env = make_env()
    name = type(env).__name__
    assert isinstance(env, AgentEnv), f"{name} lacks reset, step, max_turns or eval_panel"
    for seed in seeds:
        obs = env.reset(seed=seed)
        assert isinstance(obs, str), f"{name}.reset returned {type(obs).__name__}, not str"
        assert make_env().reset(seed=seed) == obs, f"{name}.reset({seed}) is not deterministic"
        for bad in BAD_ACTIONS:
            env = make_env()
            env.reset(seed=seed)
            try:
                out = env.step(bad)
            except Exception as err:  # noqa: BLE001 (the point: nothing may escape)
                raise AssertionError(f"{name}.step({_short(bad)}) raised {err!r}") from err
            _check_step(name, out, bad)
            assert not out[3]["valid"], f"{name}.step({_short(bad)}) counted as valid"
        if stall is not False:
            _check_cap(make_env, seed, "?" if stall is None else stall)
        if expert and hasattr(env, "expert_actions"):
            _check_expert(make_env, seed)
    first, again = make_env().eval_panel(panel_size), make_env().eval_panel(panel_size)
    assert first == again, f"{name}.eval_panel is not deterministic"
    panel, h = first
    assert len(panel) == panel_size and isinstance(h, str) and len(h) == 16, \
        f"{name}.eval_panel gave {len(panel)} entries and hash {h!r}"
    int(h, 16)


def _short(action) -> str:
    return repr(action)[:30] + ("..." if len(repr(action)) > 30 else "")


def _check_step(name, out, action) -> None:
    assert isinstance(out, tuple) and len(out) == 4, f"{name}.step must return (obs, r, done, info)"
    obs, r, done, info = out
    assert isinstance(obs, str), f"{name}.step({_short(action)}): observation not a str"
    float(r)
    missing = [k for k in INFO_KEYS if k not in info]
    assert not missing, f"{name}.step({_short(action)}): info lacks {missing}"
    assert isinstance(info["truncated"], bool) and isinstance(info["success"], bool), \
        f"{name}.step({_short(action)}): truncated and success must be bools"
    assert info["valid"] or info["error"], f"{name}: an invalid step without an error message"
    assert not info["truncated"] or done, f"{name}: truncated without done"
    assert not (info["truncated"] and info["success"]), f"{name}: a solved episode truncated"


def _check_cap(make_env, seed, stall) -> None:
    env = make_env()
    env.reset(seed=seed)
    name = type(env).__name__
    for turn in range(1, env.max_turns + 1):
        out = env.step(stall)
        _check_step(name, out, stall)
        done, truncated = out[2], out[3]["truncated"]
        assert done == (turn == env.max_turns), \
            f"{name}: stalling, done={done} at turn {turn} of the cap {env.max_turns}"
        assert truncated == done, f"{name}: the cap ended turn {turn} with truncated={truncated}"


def _check_expert(make_env, seed) -> None:
    env = make_env()
    env.reset(seed=seed)
    name = type(env).__name__
    for turn in range(1, env.max_turns + 1):
        action = env.expert_actions()[0]
        out = env.step(action)
        _check_step(name, out, action)
        if out[2]:
            assert turn == env.max_turns or not out[3]["truncated"], \
                f"{name}: the expert's episode ended at turn {turn} < the cap, truncated"
            return
