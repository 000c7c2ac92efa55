"""TextWorld's generated text games as an agent environment of the checked protocol.

TextWorld (Côté et al. 2018, "TextWorld: A Learning Environment for Text-based Games",
arXiv:1806.11532; code ``microsoft/TextWorld``, pinned 1.7.0, the optional extra
``agentrl[envs]``, imported only inside functions) generates a game from a seed with its Python
API (``textworld.challenges.CHALLENGES[name][1](settings, options)``, what ``tw-make`` runs) and
compiles it with the bundled Inform 7 (the wheel ships it: nothing is downloaded). The challenges
used here: ``tw-coin_collector`` (``{"level": 1..300}``: walk to a coin), ``tw-treasure_hunter``
(``{"level": 1..30}``: find and take an object, with distractors) and ``tw-simple``
(``{"rewards": "dense"|"balanced"|"sparse", "goal": "detailed"|"brief"|"none", "test": False}``).

``game_file`` caches each compiled game (``.z8`` and its ``.json``) under
``$AGENTRL_CACHE/textworld/`` (default ``~/.cache/agentrl``), keyed by challenge, settings and
seed: a game costs about 1-3 CPU seconds to generate and compile, and 0.1 s to start.
``TextWorldEnv`` is the environment, ``TextWorldToolEnv`` the same game as a tool object for
TRL's ``environment_factory`` (``envs/tool_env.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from agentrl_lib.envs import protocol
from agentrl_lib.envs.tool_env import _EpisodeTools

CHALLENGES = ("tw-coin_collector", "tw-treasure_hunter", "tw-simple")
META_VERBS = ("quit", "q", "restart", "restore", "save", "undo", "script", "unscript", "transcript",
              "verbose", "brief", "superbrief", "notify", "version", "score", "xyzzy")
"""Inform's out-of-world verbs: never sent to the game (they would end or rewind it)"""
MAX_COMMAND_CHARS = 200
"""the longest command sent to the game (a longer one is invalid before the parser)"""
_PRINTABLE = re.compile(r"^[ -~]*$")
STATE_KEYS = ("observed", "plan")
"""what ``TextWorldEnv.state_key`` holds (its docstring, Info)"""
INSTRUCTION = "Play the text game. Call the act tool with one command per turn."


def cache_dir() -> Path:
    """``$AGENTRL_CACHE/textworld`` (``models.loading.cache_root``'s rule: empty means unset)."""
    root = os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl"
    return Path(root) / "textworld"


def game_key(challenge: str, settings: dict, seed: int) -> str:
    """The cache name of a game: challenge, a hash of the settings and TextWorld's version, seed."""
    import textworld

    blob = json.dumps([challenge, settings, textworld.__version__], sort_keys=True)
    return f"{challenge}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}-{seed}"


def game_file(challenge: str, settings: dict, seed: int, cache: Path | None = None) -> Path:
    """The compiled game (``.z8``, its ``.json`` beside it) of ``challenge`` with ``settings`` at
    ``seed``, generated and compiled on the first call and cached (written to a temporary folder,
    then moved, so a concurrent reader never sees half a game)."""
    import textworld
    from textworld.challenges import CHALLENGES as TW

    if challenge not in TW:
        raise ValueError(f"unknown TextWorld challenge {challenge!r}; choose one of {list(TW)}")
    folder = Path(cache or cache_dir())
    path = folder / (game_key(challenge, settings, seed) + ".z8")
    if path.is_file() and path.with_suffix(".json").is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder))
    try:
        options = textworld.GameOptions()
        options.seeds = int(seed)
        options.path = str(tmp / path.name)
        game = TW[challenge][1](dict(settings), options)
        textworld.generator.compile_game(game, options)
        os.replace(tmp / path.with_suffix(".json").name, path.with_suffix(".json"))
        os.replace(tmp / path.name, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def clean(text: str) -> str:
    """A game's output without the title banner, the prompt and the status line.

    >>> clean("\\n  $$$ $$\\n\\nWelcome!\\n\\n-= Hall =-\\nA hall.\\n\\n>  -= Hall =-0/1")
    'Welcome!\\n\\n-= Hall =-\\nA hall.'
    """
    text = text.split("\n>")[0]
    lines = text.split("\n")
    last_banner = max((i for i, line in enumerate(lines) if "$$" in line), default=-1)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines[last_banner + 1:])).strip()


class TextWorldEnv:
    """A generated TextWorld game, one command per turn (module docstring).

    ## Description
    Task seed s is the game ``game_file(challenge, settings, s)``: a small house of rooms to walk
    through, containers to open, objects to take; the goal is stated in the first observation.
    Seeds from ``protocol.PANEL_SEED`` on are the held-out panel's games; training uses seeds
    below it (a small challenge can repeat a layout across seeds).

    ## Actions
    One text command ("go north", "take coin", "open chest drawer"). ``admissible_commands()``
    lists the commands the game accepts in the current state. A command not among them is invalid:
    if it is printable ASCII of at most ``MAX_COMMAND_CHARS`` characters and not an out-of-world
    verb (``META_VERBS``), the game reads it and answers as it does ("That's not a verb I
    recognise.", state unchanged); otherwise (not text, too long, non-ASCII, a meta verb) the
    game never sees it. Either way the turn is used.

    ## Observations
    Text: the game's answer without its banner, prompt and status line (``clean``); the first
    one holds the goal and the first room.

    ## Rewards
    The game's score increase at each turn (coin collector and treasure hunter: 1 on winning;
    tw-simple with dense rewards: a point per subgoal), plus ``invalid_penalty`` for an invalid
    command.

    ## Episode end
    Terminated: the game is won or lost. Truncated: ``max_turns`` turns without either.

    ## Info
    ``protocol.INFO_KEYS`` and ``score``, ``max_score``, ``won``, ``lost``, ``admissible`` (the
    commands of the new state). State key (``state_key``): 'observed' (seed, the room's
    description, the inventory, the score): the game's state as the player can know it; 'plan'
    (seed, the walkthrough from here, the score): what is left to do, about 2.5x cheaper a turn
    (measured: TextWorld's Inform 7 wrapper tracks the description and the inventory through
    the game's ``tw-extra-infos`` output every turn), exact where the walkthrough determines the state (coin collector: the room
    relative to the coin) and coarser where it does not (an object taken off the walkthrough's
    path leaves the key as it was).

    ## Arguments
    challenge (``CHALLENGES``), settings (the challenge's, default level 1 or dense/detailed),
    max_turns, invalid_penalty, cache (the game folder, default ``cache_dir()``), state_key
    ('observed' or 'plan', above).

    ## Exact form
    None: the game's world model lives in the Z-machine; ``expert_actions`` gives TextWorld's
    walkthrough from the current state (its ``policy_commands``, recomputed after every turn).
    """

    def __init__(self, challenge: str = "tw-coin_collector", settings: dict | None = None,
                 max_turns: int = 10, invalid_penalty: float = 0.0, cache: Path | None = None,
                 state_key: str = "observed"):
        if challenge not in CHALLENGES:
            raise ValueError(f"challenge must be one of {CHALLENGES}, got {challenge!r}")
        if state_key not in STATE_KEYS:
            raise ValueError(f"state_key must be one of {STATE_KEYS}, got {state_key!r}")
        self.key = state_key
        default = ({"rewards": "dense", "goal": "detailed", "test": False}
                   if challenge == "tw-simple" else {"level": 1})
        self.challenge, self.settings = challenge, dict(settings or default)
        self.max_turns, self.invalid_penalty, self.cache = max_turns, invalid_penalty, cache
        self.num_invalid, self.turn, self.seed = 0, 0, None
        self._game, self._path, self._state = None, None, None

    # --- the game ---------------------------------------------------------------------------
    def _start(self, seed: int):
        import textworld

        path = game_file(self.challenge, self.settings, seed, self.cache)
        if path != self._path:
            if self._game is not None:
                self._game.close()
            observed = self.key == "observed"  # two more game commands a turn
            infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True,
                                       lost=True, score=True, max_score=True, description=observed,
                                       inventory=observed, objective=True)
            self._game, self._path = textworld.start(str(path), request_infos=infos), path
        return self._game.reset()

    def reset(self, seed: int | None = None) -> str:
        self.seed = 0 if seed is None else int(seed)
        self._state = self._start(self.seed)
        self.turn, self.done = 0, False
        return clean(self._state.feedback)

    def admissible_commands(self) -> list[str]:
        return list(self._state.admissible_commands)

    def expert_actions(self) -> list[str]:
        """TextWorld's walkthrough from the current state: its next command."""
        policy = list(self._state.policy_commands or [])
        return policy[:1] or ["look"]

    def walkthrough(self) -> list[str]:
        """The whole walkthrough from the current state."""
        return list(self._state.policy_commands or [])

    def state_key(self):
        s = self._state
        if self.key == "plan":
            return (self.seed, tuple(s.policy_commands or ()), s.score)
        return (self.seed, s.description, s.inventory, s.score)

    def step(self, action) -> tuple[str, float, bool, dict]:
        if self._state is None:
            raise RuntimeError("call reset() first")
        error = protocol.action_error(action)
        command = action.strip().lower() if error is None else ""
        if error is None and command not in self._state.admissible_commands:
            error = self._unreadable(command)
            if error is None:  # the game reads it and answers; nothing in the world changes
                error = clean(self._game.step(command)[0].feedback) or "not a command here"
        self.turn += 1
        score = self._state.score
        if error is not None:
            self.num_invalid += 1
            obs, reward = error if command else f"Invalid command: {error}", self.invalid_penalty
        else:
            self._state = self._game.step(command)[0]
            obs, reward = clean(self._state.feedback), float(self._state.score - score)
        won, lost = bool(self._state.won), bool(self._state.lost)
        truncated = self.turn >= self.max_turns and not (won or lost)
        self.done = won or lost or truncated
        info = {"state_key": self.state_key(), "valid": error is None, "error": error,
                "success": won, "truncated": truncated, "score": self._state.score,
                "max_score": self._state.max_score, "won": won, "lost": lost,
                "admissible": self.admissible_commands()}
        return obs, float(reward), self.done, info

    @staticmethod
    def _unreadable(command: str) -> str | None:
        """Why a command must not reach the game, or None."""
        if not command:
            return "an empty command"
        if len(command) > MAX_COMMAND_CHARS or not _PRINTABLE.match(command):
            return f"a command is printable ASCII of at most {MAX_COMMAND_CHARS} characters"
        if "\\" in command:  # dumb-frotz reads a backslash as its own escape and loops forever
            return "a backslash is the interpreter's escape character, not a command"
        if command.split()[0] in META_VERBS:
            return f"'{command.split()[0]}' is not a command of this game"
        return None

    def eval_panel(self, n: int = 64) -> tuple[list, str]:
        """Seeds ``PANEL_SEED`` .. + n - 1 (games generated when played); the hash covers the
        challenge, its settings and TextWorld's version (what makes the games)."""
        import textworld

        game = [self.challenge, self.settings, textworld.__version__]
        return protocol.eval_panel(n, game=game)

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
            self._game, self._path = None, None


class TextWorldToolEnv(_EpisodeTools):
    """One rollout of a TextWorld game for TRL's ``environment_factory``: the tool ``act``, one
    ``env.step`` of the command. Build with ``tool_env.environment_factory(make_env,
    TextWorldToolEnv)``."""

    def act(self, command: str) -> str:
        """Send one command to the text game.

        Args:
            command: The command, e.g. go north, take coin, open door.

        Returns:
            What the game answers.
        """
        return self._step(str(command))
