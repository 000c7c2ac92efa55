"""KGJudgeEnv: the search environment with ReSeek's JUDGE tool, a reader's belief, and the step
flags (gold evidence retrieved, a true fact read, the chain advanced) that ReSeek's process rewards
and the path-faithfulness metric are computed from (``algorithms/reseek.py``).

ReSeek (Li et al. 2025, "ReSeek: A Self-Correcting Framework for Search Agents with Instructive
Rewards", arXiv:2510.00568) gives the agent a JUDGE action: after a retrieval it states whether the
information is useful, so that it re-plans instead of building on a bad document. In the paper the
verdict is appended to the context, C_t = tau_{t-1} (+) a_t (+) o_t (+) j_t: a "No" does not
delete the observation but *softly masks* it (it stays in the context, tagged, so the agent sees
what it has already tried), and the prompt's rule "if judge=No, you must search again and cannot
answer directly" forces a new search (paper, via the note in ``reproductions/fidelity/
51_reseek.md``; the released code, TencentBAC/ReSeek ``search/llm_agent/generation.py``
``run_llm_loop``, parses only search and answer and keeps every turn in the context). Here:

**The reader** (``believed``, as in ``KGSearchEnv.read``, made credulous). The agent's belief is
the chain of entities it has resolved from what it read: [e_0] at reset; opening a document about
the believed current entity b (its title is b's name, or "Notes on b") advances the belief by one
hop to the person that document names for the next relation: an entity document states a tail (the
true one, or a wrong one where the corpus is misaligned); a distractor ("Notes on b") names one
person, and this reader is credulous: it takes that person (inferred: the paper's failure mode, a
lexically close document read as evidence; ``KGSearchEnv``'s own reader ignores distractors). Any
other document reads nothing. The reader sees only the observation, so a fact cut off by
``max_doc_chars`` is not read. ``answer`` is scored as in ``KGSearchEnv`` (the name, against
the graph's e_k): a belief off the true chain ends wrong.

**The JUDGE tool** (``judge=True``): ``judge(useful)`` / ``judge(useless)`` is the verdict on the
last opened document, once per opened document (judging twice, or before any open, is a malformed
call). ``useful`` keeps it. ``useless`` re-plans: the document's hop is dropped from the belief
(the verdict masks what was read), and then, by ``mask``:
- ``'soft'`` (the paper's): the document stays in the world: the last results keep it and later
  searches list it again, tagged "(judged useless)" in the observation (and in the menu's state
  key); the next call must be a search (an open or an answer before it is a malformed call: the
  paper's prompt rule, enforced here since a table cannot read a prompt);
- ``'hard'`` (the default, ours before issue 27; the environment the shipped bases and their
  positive controls were built on): the document is removed from the last results and from every
  later search (the re-plan never lists it again), and any call may follow.
The belief's drop is inferred for both: the paper leaves it to the policy to discount a masked
observation, which this environment's reader cannot. The verdict's ground truth (the paper's
j-hat, from gold evidence here instead of a reranker: inferred) is "useful" exactly when that
open advanced the belief along the true chain (a gold document, stating a true fact, for the hop
that was needed).

**The hard retriever** (``decoy_first``): with this probability (drawn once per (question, entity),
so a repeated search ranks the same way) a search whose results list an entity's own document and
its "Notes on" distractor ranks the distractor first. At 0 (default) search is ``KGSearchEnv``'s
(the BM25 ranking puts the entity's own document first for every name we measured), and with
``judge=False`` the environment behaves exactly as ``KGSearchEnv`` (same observations, rewards,
done) while its ``info`` carries the extra flags.

**info** adds: ``gold_retrieved`` (a search listed a gold document, or an open opened one),
``fact_true`` (the open read a fact that is true in the graph: a gold document of the chain whose
fact is aligned), ``advanced`` (the open extended the belief's correct prefix), ``judge``
(the verdict or None), ``judge_truth`` (the verdict's ground truth or None), ``belief``
(``believed``, entity ids), ``opened_kind`` ('entity', 'note', 'other' or None), ``doc`` (the
id an open opened), ``states_answer`` (the open's observation contains the answer's name: the
ground truth of ReSeek's released reward, ``reseek.released_rewards``) and, on a JUDGE turn,
``rejected_doc`` (the id a useless verdict set aside from the evidence path, under either mask,
else None).

``KGJudgeMenuEnv`` plays the same environment through a finite menu (the tabular rung):
``search_next`` (search the believed entity's name), ``search_other`` (a random other name: a
wasted call), ``open_top`` / ``open_second`` (the first / second result of the last search),
``answer`` (the believed entity), and with ``judge=True`` ``judge_useful`` / ``judge_useless``.
State key: (hops, hops believed, the last search lists the believed entity's own document, the
kind of the last opened document while it is unjudged), and with ``mask='soft'`` two more
entries: the first result of the last search is a document judged useless (its tag), and a search
is due (the rule after a "useless"). The calls are ``KGSearchEnv.menu_calls``
(those of ``KGMenuEnv``) plus the two verdicts; the key differs from ``KGMenuEnv``'s (whose third
entry is "the first result is the believed entity's document", which would tell a table where
the decoy is before it opens anything: the hard retriever's point).
"""

from __future__ import annotations

import re

import numpy as np

from agentrl_lib.envs import protocol
from agentrl_lib.envs.kg_search import RELATIONS, KGSearchEnv

JUDGE_VERDICTS = ("useful", "useless")
MASKS = ("hard", "soft")
_NAME = re.compile(r"[A-Z][a-z]+")


def _unit(*keys) -> float:
    """A deterministic draw in [0, 1) from integer keys."""
    return float(np.random.default_rng([int(k) for k in keys]).random())


class _RankedIndex:
    """The shared ``SearchIndex`` seen through one episode: rejected documents are skipped and,
    per ``decoy_first``, an entity's distractor is ranked above its own document."""

    def __init__(self, env: "KGJudgeEnv"):
        self.env, self.inner = env, env.base_index

    def get(self, doc_id: int):
        return self.inner.get(doc_id)

    def search(self, query: str, k: int = 3) -> list[tuple[int, str]]:
        env = self.env
        rows = self.inner.search(query, k + len(env.rejected) + 1)
        rows = [(i, t) for i, t in rows if i not in env.rejected]
        if env.decoy_first > 0.0:
            for j in range(len(rows)):
                i, title = rows[j]
                e = env.entity_of_title.get(title)
                if e is None or i != int(env.corpus.entity_doc[e]):
                    continue
                notes = [n for n, (_, t2) in enumerate(rows)
                         if n > j and t2 == f"Notes on {title}"]
                if notes and _unit(env.task["seed"], e, 4) < env.decoy_first:
                    rows.insert(j, rows.pop(notes[0]))  # the distractor takes the document's rank
                    break
        return rows[:k]


class KGJudgeEnv(KGSearchEnv):
    """``KGSearchEnv`` with a reader's belief, step flags and (``judge=True``) the JUDGE tool.

    ## Description
    ReSeek's search environment (module docstring): a credulous reader's belief (``read``), the step
    flags its process rewards use, and a hard retriever (``decoy_first``). With ``judge=False`` and
    ``decoy_first=0`` it behaves exactly as ``KGSearchEnv`` (same observations, rewards, done).

    ## Actions
    ``KGSearchEnv``'s text tool calls, and with ``judge=True`` ``judge(useful)`` /
    ``judge(useless)``, the verdict on the last opened document (once per opened document; judging
    twice, or before any open, is a malformed call).

    ## Observations
    ``KGSearchEnv``'s; a verdict answers "Noted: d12 kept." or "Noted: d12 set aside." (hard) /
    "Noted: d12 judged useless; search again." (soft), and with the soft mask a search lists a
    document judged useless as "[d12] Notes on X (judged useless)".

    ## Rewards
    ``KGSearchEnv``'s; a verdict pays 0 (an invalid one ``-invalid_penalty``).

    ## Episode end
    ``KGSearchEnv``'s: terminated by an answer, truncated at ``max_turns`` (a verdict on the last
    turn included).

    ## Info
    ``KGSearchEnv``'s and the flags ``gold_retrieved``, ``fact_true``, ``advanced``, ``judge``,
    ``judge_truth``, ``belief``, ``opened_kind``, ``doc``, ``rejected_doc`` (module docstring).

    ## Arguments
    judge: offer the JUDGE tool. decoy_first: the hard retriever's probability. mask: what a
    "useless" verdict does, 'hard' or 'soft' (module docstring). The rest are ``KGSearchEnv``'s.

    ## Exact form
    None; ``expert_actions`` is the scripted searcher with JUDGE (verdicts by the ground truth).
    """

    def __init__(self, judge: bool = True, decoy_first: float = 0.0, mask: str = "hard",
                 **kg_kwargs):
        if not 0.0 <= decoy_first <= 1.0:
            raise ValueError(f"decoy_first must be in [0, 1], got {decoy_first}")
        if mask not in MASKS:
            raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
        super().__init__(**kg_kwargs)
        self.judge_tool, self.decoy_first, self.mask = bool(judge), float(decoy_first), mask
        if self.judge_tool:
            self.tools = ("search", "open", "judge", "answer")
            self.system_prompt = ("Answer the question. Call one tool per turn: search(words), "
                                  "open(doc id), judge(useful) or judge(useless) on the document "
                                  "you opened, or answer(name).")
            if mask == "soft":
                self.system_prompt += " After judge(useless), search again before anything else."
        self.base_index = self.index
        self.index = _RankedIndex(self)
        self.entity_of_title = {n: i for i, n in enumerate(self.graph.names)}
        self.rejected: set = set()

    # --- the reader ---------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> str:
        self.rejected = set()
        self.judged_useless: set = set()  # soft mask: documents tagged by a "useless" verdict
        self.must_search = False  # soft mask: a "useless" verdict asks for a search next
        obs = super().reset(seed)  # believed = [e_0]
        self.pending = None  # (doc id, belief before the open, advanced) of the unjudged last open
        self.last_kind = None
        self.last_read = (None, None)
        return obs

    def correct_prefix(self, belief=None) -> int:
        """How many hops of ``belief`` (default: ``believed``) follow the true chain."""
        belief = self.believed if belief is None else belief
        chain, n = self.task["chain"], 0
        while n + 1 < len(belief) and n + 1 < len(chain) and belief[n + 1] == chain[n + 1]:
            n += 1
        return n

    def read(self, doc_id: int) -> None:
        """The credulous reader (replaces ``KGSearchEnv.read``, called by its ``step`` on every
        open): from the text the agent sees (title and body cut at ``max_doc_chars``), a document
        about the believed entity b advances ``believed`` to the person it names for the next hop:
        an entity document's fact sentence for the next relation, a "Notes on b" distractor's
        other person. ``last_read`` = (kind relative to b: 'entity', 'note' or 'other', the person
        read or None)."""
        b = self.believed[-1]
        hop = len(self.believed) - 1
        title, body = self.base_index.get(doc_id)
        text = f"{title}: {body}"[:self.max_doc_chars]
        body = text[len(title) + 2:]
        name = self.graph.names[b]
        kind = "entity" if title == name else "note" if title == f"Notes on {name}" else "other"
        tail = None
        if kind == "entity" and hop < self.task["hops"]:
            word = RELATIONS[self.task["relations"][hop]][1]
            m = re.search(rf"The {word} of {re.escape(name)} is ([A-Z][a-z]+)\.", body)
            tail = None if m is None else self.entity_of_title.get(m.group(1))
        elif kind == "note" and hop < self.task["hops"]:
            tail = next((self.entity_of_title[w] for w in _NAME.findall(body)
                         if w != name and w in self.entity_of_title), None)
        if tail is not None:
            self.believed.append(int(tail))
        self.last_read = (kind, tail)

    # --- the protocol -------------------------------------------------------------------------
    def step(self, action_text: str):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        tool, arg, error = self.parse(action_text)
        if not self.done and error is None and tool == "judge":
            return self._judge(arg)
        if not self.done and error is None and self.must_search and tool != "search":
            return self._refuse(f"after judge(useless), search again before {tool}")
        before = list(self.believed)
        opened_before = len(self.opened)
        obs, reward, done, info = super().step(action_text)
        flags = dict(gold_retrieved=False, fact_true=False, advanced=False, judge=None,
                     judge_truth=None, opened_kind=None, states_answer=False)
        gold = set(self.task["gold_docs"])
        if info["valid"] and info["tool"] == "search":
            flags["gold_retrieved"] = any(i in gold for i, _ in self.last_results)
            self.must_search = False
            if self.judged_useless:  # the soft mask's tag: what was judged useless stays visible
                obs = "Results: " + " | ".join(
                    f"[d{i}] {t}" + (" (judged useless)" if i in self.judged_useless else "")
                    for i, t in self.last_results)
        elif info["valid"] and info["tool"] == "open" and len(self.opened) > opened_before:
            doc_id = self.opened[-1]
            kind, tail = self.last_read
            flags["opened_kind"] = self.last_kind = kind
            flags["gold_retrieved"] = doc_id in gold
            hop = len(before) - 1
            chain = self.task["chain"]
            flags["fact_true"] = bool(doc_id in gold and kind == "entity" and tail is not None
                                      and hop < len(chain) - 1 and tail == chain[hop + 1])
            flags["advanced"] = self.correct_prefix() > self.correct_prefix(before)
            self.pending = (doc_id, before, flags["advanced"])
            flags["doc"] = doc_id
            # the released reward's ground truth (ReSeek reseek_regex.check_label_in_information):
            # the gold answer is a case-insensitive substring of the information the agent read
            flags["states_answer"] = self.task["answer"].lower().strip() in obs.lower()
        info.update(flags, belief=list(self.believed))
        return obs, reward, done, info

    def _judge(self, arg: str):
        self.turn += 1
        verdict = arg.strip().lower()
        error = None
        if verdict not in JUDGE_VERDICTS:
            error = f"judge takes useful or useless, got {arg!r}"
        elif self.pending is None:
            error = "nothing to judge: open a document first (each opened document is judged once)"
        truth, rejected = None, None
        if error is not None:
            self.num_invalid += 1
            obs, reward = f"Error: {error}.", -self.invalid_penalty
        else:
            doc_id, before, advanced = self.pending
            truth = "useful" if advanced else "useless"
            if verdict == "useless" and self.mask == "soft":  # masked: kept, tagged, search next
                self.believed = before
                self.judged_useless.add(doc_id)
                self.must_search = True
                rejected = doc_id
                obs = f"Noted: d{doc_id} judged useless; search again."
            elif verdict == "useless":  # hard: forget the document's hop, never list it again
                self.believed = before
                self.rejected.add(doc_id)
                self.last_results = [(i, t) for i, t in self.last_results if i != doc_id]
                rejected = doc_id
                obs = f"Noted: d{doc_id} set aside."
            else:
                obs = f"Noted: d{doc_id} kept."
            self.pending, self.last_kind, reward = None, None, 0.0
        done = self.turn >= self.max_turns  # a verdict never ends the task: only the cap
        self.done = done
        info = self._info(error is None, error, "judge" if error is None else None, False, done)
        info.update(gold_retrieved=False, fact_true=False, advanced=False, states_answer=False,
                    judge=verdict if error is None else None, judge_truth=truth,
                    opened_kind=None, belief=list(self.believed), rejected_doc=rejected)
        return obs, reward, done, info

    def _refuse(self, error: str):
        """A well-formed call the soft mask's rule forbids: malformed (the turn is used)."""
        self.turn += 1
        self.num_invalid += 1
        done = self.done = self.turn >= self.max_turns
        info = self._info(False, error, None, False, done)
        info.update(gold_retrieved=False, fact_true=False, advanced=False, states_answer=False,
                    judge=None, judge_truth=None, opened_kind=None, belief=list(self.believed))
        return f"Error: {error}.", -self.invalid_penalty, done, info

    def expert_actions(self) -> list[str]:
        """The scripted searcher with JUDGE: judge the unjudged last open by its ground truth,
        search the believed entity after a soft-masked rejection, else ``KGSearchEnv``'s
        searcher along the belief."""
        if self.judge_tool and self.pending is not None:
            return [f"judge({'useful' if self.pending[2] else 'useless'})"]
        if self.must_search:
            return [f"search({self.graph.names[self.believed[-1]]})"]
        return super().expert_actions()


class KGJudgeMenuEnv:
    """``KGJudgeEnv`` through a finite menu (module docstring): the tabular rung of ReSeek.

    ## Description
    Every call goes to the inner environment ``self.env``, which pays the rewards and counts the
    turns and malformed calls.

    ## Actions
    An index into ``actions`` or a menu name: search_next, search_other, open_top, open_second,
    answer, and with ``judge=True`` judge_useful, judge_useless (``menu_calls``). Anything off the
    menu is invalid: the inner environment gets an empty call (the turn is used and counted).

    ## Observations
    The inner environment's.

    ## Rewards
    The inner environment's.

    ## Episode end
    The inner environment's: terminated by the answer, truncated at ``max_turns``.

    ## Info
    The inner step's, with ``state_key`` and ``call`` (the text sent; None off the menu). State key:
    (hops, hops believed, the last search lists the believed entity's own document, the kind of the
    last opened document while it is unjudged), and with ``mask='soft'`` (the first result is a
    document judged useless, a search is due).

    ## Arguments
    judge, and ``KGJudgeEnv``'s keyword arguments.

    ## Exact form
    None; ``expert_actions`` is the scripted searcher's menu choice.
    """

    BASE_ACTIONS = ["search_next", "search_other", "open_top", "open_second", "answer"]

    def __init__(self, judge: bool = True, **kwargs):
        self.env = KGJudgeEnv(judge=judge, **kwargs)
        self.actions = self.BASE_ACTIONS + (["judge_useful", "judge_useless"] if judge else [])
        self.system_prompt = self.env.system_prompt

    @property
    def task(self):
        return self.env.task

    @property
    def max_turns(self) -> int:
        return self.env.max_turns

    def reset(self, seed: int | None = None) -> str:
        return self.env.reset(seed)

    def state_key(self) -> tuple:
        env = self.env
        b_doc = int(env.corpus.entity_doc[env.believed[-1]])
        listed = any(i == b_doc for i, _ in env.last_results)
        kind = env.last_kind if env.pending is not None else None
        key = (env.task["hops"], len(env.believed) - 1, listed, kind)
        if env.mask == "soft":  # what the soft mask leaves in view: the tag and the rule
            top = env.last_results[0][0] if env.last_results else None
            key += (top in env.judged_useless, env.must_search)
        return key

    def menu_calls(self) -> dict:
        """{menu name: the tool call it makes now}: ``KGSearchEnv.menu_calls`` plus the verdicts."""
        calls = self.env.menu_calls()
        if self.env.judge_tool:
            calls.update(judge_useful="judge(useful)", judge_useless="judge(useless)")
        return calls

    def step(self, action):
        i = protocol.menu_index(action, self.actions)
        if i is None:  # off the menu: the inner env gets an empty call (invalid, uses the turn)
            _, reward, done, info = self.env.step("")
            error = f"unknown menu action {repr(action)[:40]}; the menu is {self.actions}"
            info.update(error=error, state_key=self.state_key(), call=None)
            return f"Error: {error}.", reward, done, info
        name = self.actions[i]
        call = self.menu_calls()[name]
        obs, reward, done, info = self.env.step(call)
        info.update(state_key=self.state_key(), call=call)
        return obs, reward, done, info

    def expert_actions(self) -> list[str]:
        """The scripted searcher's menu choice: judge by the ground truth, open the believed
        entity's own document where listed, search it otherwise, answer at the end."""
        env = self.env
        if env.judge_tool and env.pending is not None:
            return ["judge_useful" if env.pending[2] else "judge_useless"]
        if env.must_search:
            return ["search_next"]
        if len(env.believed) - 1 >= env.task["hops"]:
            return ["answer"]
        b_doc = int(env.corpus.entity_doc[env.believed[-1]])
        for j, (i, _) in enumerate(env.last_results[:2]):
            if i == b_doc:
                return ["open_top" if j == 0 else "open_second"]
        return ["search_next"]

    def eval_panel(self, n: int = 64):
        return self.env.eval_panel(n)
