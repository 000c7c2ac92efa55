"""TwentyQuestions: find a hidden item among K by asking yes/no attribute questions.

The shared environment of ../shared/papers/README.md (ArCHer, IGPO): a hidden item drawn uniformly
from ``items``, each item described by binary attributes, a scripted (always truthful) answerer and
at most ``max_turns`` turns. Each turn the agent either asks ``"Is it <attribute>?"`` (answered
"Yes." or "No.") or guesses ``"Is it a <item>?"``. A correct guess pays ``correct_reward`` and ends
the game; a wrong guess is answered "No." and the game goes on. Every turn costs ``step_cost``.
The turn cap ends the game (a loss: ``info["truncated"]`` is True, but the turn is part of the
state key, so the capped state is terminal in the tabular form).

It follows the protocol of ``envs/protocol.py``; ``TwentyQuestionsEnv``'s docstring has its
actions, observations, rewards, episode end and info.

**The tabular form.** Under the uniform prior over items, the belief after any history is uniform
over the *consistent* items (those agreeing with every answer so far), so the pair
(consistent items, turns used) is a Markov state of the agent's decision problem. It is the
``state_key``. From it ``optimal_values`` computes V* and Q* exactly by recursion, and
``policy_values`` computes Q^pi, V^pi (hence A^pi) of any tabular policy ``pi(key) -> probs``.
Transitions from belief b (a sorted tuple of item indices):

- question j: answer "yes" with probability |b ∩ has_j| / |b| -> b ∩ has_j, else b \\ has_j;
- guess i: success with probability 1[i in b] / |b| (terminal), else b \\ {i}.

``expert_actions()`` lists the optimal actions (Q* ties) in the current belief state, the scripted
demonstrator of ``sft.scripted_policy`` (agent SFT bases). ``brief=True`` shortens the observations
after the first to the answer and the turn counter: an LM agent keeps the conversation in its
context, so the restated history and menu only lengthen it (the state key is the same).
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from agentrl_lib.envs import protocol

# A small hand-written world: 16 items x 8 attributes, every item with a distinct attribute row
# (so every item can be identified by questions alone).
ATTRIBUTES = ["alive", "a mammal", "able to fly", "found in water", "bigger than a person",
              "made of metal", "edible", "dangerous"]
CATALOG = {  # item: its attribute values, in ATTRIBUTES order
    "dog":       (1, 1, 0, 0, 0, 0, 0, 0),
    "horse":     (1, 1, 0, 0, 1, 0, 0, 0),
    "whale":     (1, 1, 0, 1, 1, 0, 0, 0),
    "shark":     (1, 0, 0, 1, 1, 0, 0, 1),
    "eagle":     (1, 0, 1, 0, 0, 0, 0, 0),
    "bat":       (1, 1, 1, 0, 0, 0, 0, 0),
    "frog":      (1, 0, 0, 1, 0, 0, 0, 0),
    "snake":     (1, 0, 0, 0, 0, 0, 0, 1),
    "car":       (0, 0, 0, 0, 1, 1, 0, 1),
    "airplane":  (0, 0, 1, 0, 1, 1, 0, 0),
    "submarine": (0, 0, 0, 1, 1, 1, 0, 0),
    "bicycle":   (0, 0, 0, 0, 0, 1, 0, 0),
    "apple":     (0, 0, 0, 0, 0, 0, 1, 0),
    "salmon":    (1, 0, 0, 1, 0, 0, 1, 0),
    "knife":     (0, 0, 0, 0, 0, 1, 0, 1),
    "tree":      (1, 0, 0, 0, 1, 0, 0, 0),
}
DEFAULT_ITEMS = ["dog", "horse", "whale", "shark", "eagle", "bat", "car", "apple"]

_SPACES = re.compile(r"\s+")
_OPTIMAL_Q: dict = {}  # game -> the cached Q* function of ``optimal_values`` (expert_actions)


def _normalise(text: str) -> str:
    """Lower case, single spaces, no surrounding punctuation or quotes."""
    return _SPACES.sub(" ", text.lower()).strip(" \t\n\"'.?!")


class TwentyQuestionsEnv:
    """Twenty questions over ``items``: find the hidden item by yes/no questions.

    ## Description
    The hidden item is drawn uniformly from ``items`` (names from ``CATALOG`` or with ``table``
    given); a scripted, always truthful answerer replies (module docstring).

    ## Actions
    Free text, case and punctuation free (``parse``): ``"Is it <attribute>?"`` (answered "Yes." or
    "No.") or a guess ``"Is it a <item>?"``; ``actions`` lists every question, then every guess.
    Malformed or unknown questions are invalid: they use up the turn.

    ## Observations
    The turn counter, the items, the questions asked so far with their answers and the menu of
    attributes; with ``brief``, after the first only the answer and "Turn t/T." (an LM agent keeps
    the conversation in its context). A right guess: "Yes! You found it."; at the cap "Game over: it
    was a <item>."

    ## Rewards
    ``correct_reward`` for the right guess; every turn costs ``step_cost``; an invalid turn pays
    ``invalid_penalty`` (minus ``step_cost``). A wrong guess is answered "No." and the game goes on.

    ## Episode end
    Terminated: the right guess (``success``). Truncated: the turn cap (a loss; the turn is part of
    the state key, so the capped state is terminal in the tabular form).

    ## Info
    ``protocol.INFO_KEYS`` (state_key: (consistent item indices, turns used)) and the ground truth
    ``item`` (= ``task``), ``action`` (the index read, or None).

    ## Arguments
    items: the K candidate items; attributes: the questions that may be asked. table: optional
    {item: attribute tuple} replacing ``CATALOG`` (e.g. a random world), its columns
    ``table_attributes``. max_turns, correct_reward, step_cost, invalid_penalty, gamma. brief: see
    Observations.

    ## Exact form
    The belief state (consistent items, turns used) is Markov under the uniform prior:
    ``optimal_values`` (V*, Q*), ``policy_values`` (V^pi, Q^pi) and ``success_probability`` are
    exact recursions over it (``transitions``); ``expert_actions`` lists the Q* ties.
    """

    system_prompt = "Find the hidden item. Ask one yes/no question or guess."
    """the system message an LM agent sees (``rollout.lm_rollout`` uses it unless given another)"""

    def __init__(self, items: list[str] | None = None, attributes: list[str] | None = None,
                 max_turns: int = 6, correct_reward: float = 1.0, step_cost: float = 0.0,
                 invalid_penalty: float = 0.0, gamma: float = 1.0,
                 table: dict | None = None, table_attributes: list[str] | None = None,
                 brief: bool = False):
        table = dict(table or CATALOG)
        columns = list(table_attributes or ATTRIBUTES)  # the order of the table's tuples
        self.items = list(items or DEFAULT_ITEMS)
        self.attributes = list(attributes or columns)
        unknown = [i for i in self.items if i not in table]
        if unknown:
            raise ValueError(f"items not in the table: {unknown}")
        if len(set(self.items)) != len(self.items) or len(self.items) < 1:
            raise ValueError("items must be distinct and at least one")
        missing = [a for a in self.attributes if a not in columns]
        if missing:
            raise ValueError(f"unknown attributes: {missing}")
        # has[i, j] = 1 when item i has attribute j (j over self.attributes)
        self.has = np.array([[table[it][columns.index(a)] for a in self.attributes]
                             for it in self.items], dtype=bool)  # (K, J)
        self.max_turns, self.gamma = int(max_turns), float(gamma)
        self.correct_reward, self.step_cost = float(correct_reward), float(step_cost)
        self.invalid_penalty = float(invalid_penalty)
        self.brief = bool(brief)
        # the symbolic action set: every question, then every guess
        self.actions = ([f"Is it {a}?" for a in self.attributes]
                        + [f"Is it {self._article(it)} {it}?" for it in self.items])
        self.num_questions = len(self.attributes)
        self._rng = np.random.default_rng()
        self.num_invalid = 0
        self.item = None
        self.task = None
        self.turn = 0
        self.consistent: tuple = ()
        self.history: list[tuple[str, str]] = []

    @staticmethod
    def _article(word: str) -> str:
        return "an" if word[0] in "aeiou" else "a"

    @property
    def num_items(self) -> int:
        return len(self.items)

    # --- parsing -------------------------------------------------------------------------------
    def parse(self, text: str) -> tuple[int | None, str | None]:
        """(action index into ``self.actions``, None) or (None, error message).

        Accepts "Is it <attribute>?" and "Is it a/an <item>?", case and punctuation free.

        >>> env = TwentyQuestionsEnv()
        >>> env.parse("is it ALIVE")[0], env.parse("Is it a dog?")[0], env.parse("Is it an dog")[0]
        (0, 8, 8)
        >>> env.parse("Is it purple?")
        (None, "unknown attribute or item 'purple'")
        """
        unreadable = protocol.action_error(text)
        if unreadable:
            return None, unreadable
        s = _normalise(text)
        if not s.startswith("is it "):
            return None, "ask 'Is it <attribute>?' or guess 'Is it a <item>?'"
        rest = s[len("is it "):].strip()
        if rest in self.attributes:
            return self.attributes.index(rest), None
        for art in ("a ", "an ", "the "):
            if rest.startswith(art) and rest[len(art):] in self.items:
                return self.num_questions + self.items.index(rest[len(art):]), None
        if rest in self.items:
            return self.num_questions + self.items.index(rest), None
        return None, f"unknown attribute or item {rest[:40]!r}"

    # --- the protocol --------------------------------------------------------------------------
    def reset(self, seed: int | None = None, item: str | int | None = None) -> str:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if item is None:
            idx = int(self._rng.integers(self.num_items))
        else:
            idx = item if isinstance(item, (int, np.integer)) else self.items.index(item)
        self.item = self.items[int(idx)]
        self.task = self.item
        self.turn = 0
        self.consistent = tuple(range(self.num_items))
        self.history = []
        return self._observe()

    def state_key(self) -> tuple:
        """(consistent item indices, turns used): the Markov belief state, hashable."""
        return (self.consistent, self.turn)

    def step(self, action_text: str):
        if self.item is None:
            raise RuntimeError("call reset() before step()")
        self.turn += 1
        a, err = self.parse(action_text)
        info = {"valid": a is not None, "error": err, "item": self.item, "task": self.item,
                "action": a, "success": False}
        if a is None:
            self.num_invalid += 1
            done = self.turn >= self.max_turns
            info.update(state_key=self.state_key(), truncated=done)
            said = action_text if isinstance(action_text, str) else repr(action_text)
            self.history.append((said.strip()[:60], "Invalid question."))
            obs = f"Invalid question: {err}.\n" + ("" if done else self._observe())
            return obs, self.invalid_penalty - self.step_cost, done, info
        k = self.items.index(self.item)
        if a < self.num_questions:
            yes = bool(self.has[k, a])
            self.consistent = tuple(i for i in self.consistent if self.has[i, a] == yes)
            answer, success = ("Yes." if yes else "No."), False
        else:
            guess = a - self.num_questions
            success = guess == k
            answer = "Yes! You found it." if success else "No."
            if not success:
                self.consistent = tuple(i for i in self.consistent if i != guess)
        self.history.append((self.actions[a], answer))
        done = success or self.turn >= self.max_turns
        info.update(state_key=self.state_key(), success=success,
                    truncated=done and not success)
        reward = self.correct_reward * success - self.step_cost
        obs = answer if success else (answer + " " + (
            f"Game over: it was {self._article(self.item)} {self.item}." if done
            else self._observe()))
        return obs, reward, done, info

    def _observe(self) -> str:
        if self.brief and self.turn > 0:
            return f"Turn {self.turn + 1}/{self.max_turns}."
        lines = [f"Turn {self.turn + 1}/{self.max_turns}. I am thinking of one of: "
                 f"{', '.join(self.items)}."]
        lines += [f"Q: {q} A: {ans}" for q, ans in self.history]
        lines.append(f"Ask 'Is it <attribute>?' ({', '.join(self.attributes)}) or guess "
                     f"'Is it a <item>?'.")
        return "\n".join(lines)

    # --- features for critics and actors -------------------------------------------------------
    def key_features(self, key: tuple) -> np.ndarray:
        """A dense feature vector of a state key: the consistent-item indicator (K,) and the
        one-hot turn (max_turns + 1,); (K + max_turns + 1,)."""
        items, turn = key
        x = np.zeros(self.num_items + self.max_turns + 1, dtype=np.float32)
        x[list(items)] = 1.0
        x[self.num_items + min(int(turn), self.max_turns)] = 1.0
        return x

    # --- the tabular form ----------------------------------------------------------------------
    def transitions(self, key: tuple, a: int) -> list[tuple[float, float, tuple, bool]]:
        """[(probability, reward, next key, terminal)] of action ``a`` in belief state ``key``."""
        b, t = key
        t2 = t + 1
        cap = t2 >= self.max_turns
        r = -self.step_cost
        if a < self.num_questions:
            yes = tuple(i for i in b if self.has[i, a])
            no = tuple(i for i in b if not self.has[i, a])
            return [(len(s) / len(b), r, (s, t2), cap) for s in (yes, no) if s]
        g = a - self.num_questions
        if g not in b:
            return [(1.0, r, (b, t2), cap)]
        out = [(1.0 / len(b), self.correct_reward + r, ((g,), t2), True)]
        rest = tuple(i for i in b if i != g)
        if rest:
            out.append((len(rest) / len(b), r, (rest, t2), cap))
        return out

    def start_key(self) -> tuple:
        return (tuple(range(self.num_items)), 0)

    def optimal_values(self, gamma: float | None = None):
        """V*(key) and Q*(key) = (A,) by exact recursion over belief states.

        V*(b, t) = max_a sum_{b'} P(b'|b,a) [r + gamma (1 - terminal) V*(b', t+1)].
        Returns (v_star, q_star): functions of a state key (cached).
        """
        return self._values(lambda key, q: float(q.max()), gamma)

    def expert_actions(self) -> list[str]:
        """The optimal actions in the current belief state (texts of ``actions``, in that order;
        every Q* tie listed), by the exact recursion ``optimal_values`` at the env's gamma.

        >>> env = TwentyQuestionsEnv(items=["dog", "eagle", "car", "airplane"],
        ...                          attributes=["alive", "able to fly", "edible"], max_turns=3)
        >>> _ = env.reset(seed=0, item="dog"); env.expert_actions()  # two questions, then win
        ['Is it alive?', 'Is it able to fly?']
        >>> _ = env.step("Is it alive?"); env.expert_actions()  # dog or eagle: ask, or guess one
        ['Is it able to fly?', 'Is it a dog?', 'Is it an eagle?']
        """
        if self.item is None:
            raise RuntimeError("call reset() before expert_actions()")
        game = (tuple(self.items), tuple(self.attributes), self.has.tobytes(), self.max_turns,
                self.gamma, self.correct_reward, self.step_cost)
        if game not in _OPTIMAL_Q:  # shared by every env of the same game (make_env per episode)
            _OPTIMAL_Q[game] = self.optimal_values()[1]
        q = _OPTIMAL_Q[game](self.state_key())  # (A,)
        return [self.actions[i] for i in np.flatnonzero(q >= q.max() - 1e-9)]

    def policy_values(self, policy, gamma: float | None = None):
        """V^pi and Q^pi of a tabular policy ``policy(key) -> (A,) probabilities``.

        Q^pi(s,a) = sum_{s'} P(s'|s,a) [r + gamma (1 - terminal) V^pi(s')],
        V^pi(s) = sum_a pi(a|s) Q^pi(s,a). Returns (v_pi, q_pi), cached functions of a key.
        A malformed turn is not in the symbolic action set, so it is not modelled here.
        """
        return self._values(lambda key, q: float(np.dot(np.asarray(policy(key), dtype=float), q)),
                            gamma)

    def _values(self, backup, gamma):
        """(v, q) of the recursion q(s, a) = sum P (r + gamma (1 - terminal) v(s')), v(s) =
        backup(s, q(s, .)): the max for V*, the policy's expectation for V^pi."""
        g = self.gamma if gamma is None else float(gamma)
        A = len(self.actions)

        @lru_cache(maxsize=None)
        def q(key):
            out = np.zeros(A)
            for a in range(A):
                out[a] = sum(p * (r + (0.0 if term else g * v(k2)))
                             for p, r, k2, term in self.transitions(key, a))
            return out

        @lru_cache(maxsize=None)
        def v(key):
            return backup(key, q(key))

        return v, q

    def success_probability(self, policy) -> float:
        """P(the game is won within max_turns) under ``policy(key) -> probs``, exactly:
        V^pi at the start with reward 1[correct guess], no step cost and gamma = 1."""
        saved = (self.correct_reward, self.step_cost)
        self.correct_reward, self.step_cost = 1.0, 0.0
        try:
            v_pi, _ = self.policy_values(policy, gamma=1.0)
            return v_pi(self.start_key())
        finally:
            self.correct_reward, self.step_cost = saved

    # --- evaluation panels ---------------------------------------------------------------------
    def eval_panel(self, n: int = 64) -> tuple[list[tuple[int, str]], str]:
        """A fixed panel of ``n`` (seed, item) episodes, items balanced, seeds from 10**6, and a
        hash of the panel *and* the game (items, attributes, table rows, max_turns), so numbers
        are comparable only when the hashes match."""
        return protocol.eval_panel(
            n, lambda s: (s, self.items[(s - protocol.PANEL_SEED) % self.num_items]), self._game())

    def panel_hash(self, panel) -> str:
        return protocol.panel_hash([self._game(), panel])

    def _game(self) -> list:
        return [self.items, self.attributes, self.has.astype(int).tolist(), self.max_turns]
