"""OpenEnv both ways: serve any agentrl environment as an OpenEnv environment, and play an OpenEnv
environment through this project's protocol (``envs.protocol``), so ``grpo.train`` and
``agent_pg.train`` train on it.

**Serving** (``make_app``, ``agentrl serve ENV``): OpenEnv's FastAPI server
(``openenv.core.env_server.http_server.create_fastapi_app``, openenv-core 0.3.0) with an
environment factory, so each WebSocket session (``/ws``) gets its own agentrl environment and a
multi-turn episode keeps its state between messages (OpenEnv's HTTP ``/step`` builds a fresh
environment per request: one-step episodes only). The action is ``AgentAction.text`` (free text,
or a name from ``env.actions``); the observation (``AgentObservation``) carries the text, the
reward and ``done`` as OpenEnv's base class has them, and what the protocol adds: ``info`` (with
``INFO_KEYS``), ``state_key`` (JSON; lists come back as tuples), ``actions`` and ``max_turns``.

**Playing** (``OpenEnvAgentEnv``): an environment of the protocol whose ``reset``/``step`` go
through OpenEnv's own client (``openenv.core.GenericEnvClient(...).sync()``), one WebSocket
session per environment object, closed when its episode ends (so a server's session limit bounds
the episodes running at once, not the episodes played). ``make_client_env(url)`` is the
``make_env`` a trainer takes.

openenv-core is the optional extra ``agentrl[openenv]``, imported only here.
"""

from __future__ import annotations

import json
from functools import lru_cache


def _json(x):
    """``x`` as plain JSON values (tuples become lists; anything else its repr)."""
    return json.loads(json.dumps(x, default=repr))


def _hashable(x):
    """JSON lists back to tuples, recursively, so a served state key is hashable again.

    >>> _hashable([1, [2, 3], "a"])
    (1, (2, 3), 'a')
    """
    if isinstance(x, list):
        return tuple(_hashable(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    return x


@lru_cache(maxsize=1)
def _types():
    """(AgentAction, AgentObservation, ServedEnv), built on first use (openenv is optional)."""
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field

    class AgentAction(Action):
        text: str = Field(..., description="the agent's action: free text or a name of actions")

    class AgentObservation(Observation):
        text: str = Field("", description="what the agent sees")
        info: dict = Field(default_factory=dict, description="the step's info (INFO_KEYS)")
        state_key: object = Field(None, description="the true state (JSON)")
        actions: list = Field(default_factory=list, description="the environment's action names")
        max_turns: int = Field(0, description="the environment's turn cap")

    class ServedEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True  # one agentrl environment per session, nothing shared

        def __init__(self, make_env):
            super().__init__()
            self.env = make_env()
            self._state = State(step_count=0)

        def _obs(self, text, reward=None, done=False, info=None):
            return AgentObservation(
                text=text, reward=reward, done=done, info=_json(info or {}),
                state_key=_json(self.env.state_key()) if hasattr(self.env, "state_key") else None,
                actions=list(getattr(self.env, "actions", None) or []),
                max_turns=int(self.env.max_turns))

        def reset(self, seed=None, episode_id=None, **kwargs):
            self._state = State(episode_id=episode_id, step_count=0)
            return self._obs(self.env.reset(seed=seed))

        def step(self, action, timeout_s=None, **kwargs):
            obs, reward, done, info = self.env.step(action.text)
            self._state.step_count += 1
            return self._obs(obs, float(reward), bool(done), info)

        @property
        def state(self):
            return self._state

    return AgentAction, AgentObservation, ServedEnv


def make_app(make_env, max_sessions: int = 64):
    """OpenEnv's FastAPI app serving ``make_env()`` environments, one per WebSocket session, at
    most ``max_sessions`` at once."""
    from openenv.core.env_server.http_server import create_fastapi_app

    action_cls, obs_cls, served = _types()
    return create_fastapi_app(lambda: served(make_env), action_cls, obs_cls,
                              max_concurrent_envs=max_sessions)


def serve(make_env, host: str = "127.0.0.1", port: int = 8000, max_sessions: int = 64) -> None:
    """Run the server (uvicorn) until interrupted."""
    import uvicorn

    uvicorn.run(make_app(make_env, max_sessions), host=host, port=port, log_level="warning")


class OpenEnvAgentEnv:
    """An OpenEnv environment at ``base_url`` played through the protocol (module docstring).

    ``reset(seed)`` opens a session (closing the previous one) and returns the text;
    ``step(action)`` sends ``{"text": action}`` and returns ``(text, reward, done, info)``, the
    info completed with ``INFO_KEYS`` when a foreign server lacks them (``valid`` True,
    ``truncated`` False, ``success`` reward > 0: an assumption, said here); ``state_key()``,
    ``actions`` and ``max_turns`` come from the last observation (a foreign server without them:
    the observation text, no menu, ``default_max_turns``)."""

    def __init__(self, base_url: str, default_max_turns: int = 10, timeout_s: float = 30.0):
        self.base_url, self.timeout_s = base_url, timeout_s
        self.max_turns, self.actions = default_max_turns, []
        self._client, self._obs = None, {}

    def _open(self):
        from openenv.core import GenericEnvClient

        self.close()
        self._client = GenericEnvClient(base_url=self.base_url,
                                        message_timeout_s=self.timeout_s).sync()
        self._client.connect()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _read(self, result) -> str:
        self._obs = result.observation or {}
        self.actions = list(self._obs.get("actions") or self.actions)
        self.max_turns = int(self._obs.get("max_turns") or self.max_turns)
        return str(self._obs.get("text", self._obs.get("observation", "")))

    def state_key(self):
        key = self._obs.get("state_key")
        return _hashable(key) if key is not None else self._obs.get("text")

    def reset(self, seed: int | None = None) -> str:
        self._open()
        return self._read(self._client.reset(**({} if seed is None else {"seed": int(seed)})))

    def step(self, action):
        result = self._client.step({"text": action if isinstance(action, str) else str(action)})
        text = self._read(result)
        reward, done = float(result.reward or 0.0), bool(result.done)
        info = dict(self._obs.get("info") or {})
        info["state_key"] = self.state_key()
        info.setdefault("valid", True)
        info.setdefault("error", None)
        info.setdefault("success", reward > 0)
        info.setdefault("truncated", False)
        if done:
            self.close()  # free the server's session slot
        return text, reward, done, info


def make_client_env(base_url: str, **kwargs):
    """The ``make_env`` of a trainer: a new ``OpenEnvAgentEnv`` at ``base_url`` per call."""
    return lambda: OpenEnvAgentEnv(base_url, **kwargs)
