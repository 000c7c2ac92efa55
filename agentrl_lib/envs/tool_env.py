"""A multi-turn environment as a *tool*: the shape TRL's ``GRPOTrainer(environment_factory=...)``
(1.16) wants, without importing TRL.

TRL builds one instance per rollout (``factory()``), calls ``reset(**row)`` with the data set row
(the returned string is appended to the last user message), exposes every public method of the
instance as a tool (schema from type hints and the Google-style docstring) and calls
``get_reward()`` once per finished rollout. Here the tool is ``move(direction)``: one
``env.step(direction)`` of the wrapped environment, returning the next observation;
``get_reward()`` is the episode's return (sum_t r_t, what ``grpo.train`` trains on multi-turn).
A move after the episode ended, or an unknown direction, returns the environment's text (the
error path: ``GridAgentEnv`` never raises on a malformed action).

``KGToolEnv`` does the same for ``KGSearchEnv`` (the search papers' environment) with three tools,
``search(query)``, ``open(doc)`` and ``answer(name)``, each one ``env.step`` of the call's text, so
a malformed argument goes through the environment's error path and is counted there.

``tool_conversation`` renders a scripted episode as the messages of such a rollout (assistant tool
calls and ``tool`` results), for a warm-start that teaches the tool-call format.
``algorithms/trl_adapter.py`` holds the TRL side: the chat template, the data set, the trainer.
"""

from __future__ import annotations

INSTRUCTION = "Reach the goal in the grid. Call the move tool once per turn."
KG_INSTRUCTION = ("Answer the question. Call one tool per turn: search for documents, open one, "
                  "then answer with a name.")


class _EpisodeTools:
    """What every tool object shares: ``reset`` (TRL calls it with the data set row), one
    ``env.step`` per tool call (``_step``; after the end, "The episode is over."), and
    ``get_reward``, the episode's return sum_t r_t (what ``grpo.train`` trains on multi-turn).
    The subclasses' public methods are the tools."""

    def __init__(self, env):
        self._env = env
        self._done = False
        self._return = 0.0
        self.turns = 0
        self.num_calls = 0

    def reset(self, seed: int | None = None, **kwargs) -> str:
        """TRL calls this with the data set row; the observation is appended to the user message."""
        obs = self._env.reset(seed=None if seed is None else int(seed))
        self._done, self._return, self.turns = False, 0.0, 0
        return "\n" + obs

    def _step(self, text: str) -> str:
        self.num_calls += 1
        if self._done:
            return "The episode is over."
        obs, r, done, info = self._env.step(text)
        self.turns += 1
        self._return += float(r)
        self._done = bool(done)
        return obs

    def get_reward(self) -> float:
        """The episode's return sum_t r_t."""
        return self._return


class GridToolEnv(_EpisodeTools):
    """One rollout of the gridworld: the tool ``move``. Build through ``environment_factory(make_env)``."""

    def move(self, direction: str) -> str:
        """Move one cell in the grid.

        Args:
            direction: The move: up, down, left or right.

        Returns:
            What the agent sees after the move.
        """
        return self._step(str(direction))


class KGToolEnv(_EpisodeTools):
    """One rollout of ``KGSearchEnv``: the tools ``search``, ``open`` and ``answer``, each one step of
    the call's text (its reward: ``answer_reward`` for a correct answer, minus invalid-call
    penalties). Build through ``environment_factory(make_env, KGToolEnv)``."""

    def search(self, query: str) -> str:
        """Search the document collection.

        Args:
            query: The words to search for, e.g. a name.

        Returns:
            The ids and titles of the best matching documents.
        """
        return self._step(f"search({query})")

    def open(self, doc: str) -> str:
        """Read one document.

        Args:
            doc: A document id from the search results, e.g. d12.

        Returns:
            The document's text.
        """
        return self._step(f"open({doc})")

    def answer(self, name: str) -> str:
        """Give the final answer; this ends the episode.

        Args:
            name: The answer, a person's name.

        Returns:
            Whether the answer is correct.
        """
        return self._step(f"answer({name})")


def environment_factory(make_env, wrapper=GridToolEnv):
    """The zero-argument factory TRL calls once per rollout: ``wrapper(make_env())``
    (``GridToolEnv`` for the gridworld, ``KGToolEnv`` for the search environment)."""
    return lambda: wrapper(make_env())


def tool_conversation(env, seed: int, actions: list[str], instruction: str = INSTRUCTION):
    """The messages of one scripted episode in TRL's format (tool calls and tool results)."""
    msgs = [{"role": "user", "content": instruction + "\n" + env.reset(seed=seed)}]
    for a in actions:
        call = {"type": "function", "function": {"name": "move", "arguments": {"direction": a}}}
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        obs, _, done, _ = env.step(a)
        msgs.append({"role": "tool", "name": "move", "content": obs})
        if done:
            break
    return msgs
