"""KGSearchEnv: multi-hop questions over a synthetic knowledge graph, answered by searching a
document corpus through a real full-text index (the shared environment of part 5's search papers:
SearchGym, ReSeek, TreePS-RAG, SLATE, Stratified GRPO, Dr. MAS).

**The world.** ``make_graph`` draws ``num_entities`` fictional people (pronounceable made-up names,
so no pretrained model knows them: ReSeek's contamination-free setting) and, for each person and
each relation of ``RELATIONS`` (mentor, rival, partner, employer, ...), one other person: a
functional knowledge graph, (head, relation) -> tail.

**The corpus** (``render_corpus``). One document per person, its title the name, one sentence per
fact ("The mentor of Talomir is Brevan."), and ``num_distractors`` distractor documents per person
that mention the name and the relation words but state no fact ("Rumours about the rival of Talomir
named Quessa; none were confirmed."): lexically close, useless as evidence. ``alignment`` is
SearchGym's knob: the probability that a fact is rendered as it is in the graph; otherwise the
document names a wrong tail (a stale or corrupted snapshot), so a question whose chain crosses such
a fact is not grounded in the corpus and its reward is misaligned with what search can find.

**A question** of k hops (``hops``) starts at a person e_0 and follows relations r_1 .. r_k:
"Who is the rival of the mentor of Talomir?" The answer is e_k (from the graph); the gold evidence is
the documents of e_0 .. e_{k-1}; ``grounded`` says whether every fact on the chain is aligned.

**The search tool** is SQLite's FTS5 (in Python's standard library: no dependency, no server),
ranked by its built-in BM25: ``title_weight`` x BM25 of the title plus BM25 of the body, each in its
own FTS5 table (one table would normalise both by the whole document's length). A query is split into
words and OR-ed, so any text is a valid query (FTS5's own syntax never reaches the index).
``reproductions/benchmarks/kg_search_index.py`` times indexing 100k documents and querying them,
against a linear scan.

**The protocol** is ``envs/protocol.py``'s; ``KGSearchEnv``'s docstring has its actions (text
tool calls ``search``, ``open``, ``answer``), rewards, episode end and info.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

import numpy as np

from agentrl_lib.envs import protocol

# (relation, the words a question uses, the fact sentence, a distractor sentence)
RELATIONS = [
    ("mentor", "mentor", "The mentor of {h} is {t}.",
     "Rumours about the mentor of {h} named {t}; none were confirmed."),
    ("rival", "rival", "The rival of {h} is {t}.",
     "A critic once called {t} the rival of {h}, wrongly."),
    ("partner", "partner", "The partner of {h} is {t}.",
     "Some letters mistake {t} for the partner of {h}."),
    ("employer", "employer", "The employer of {h} is {t}.",
     "An old list gives {t} as the employer of {h}; it is out of date."),
    ("neighbour", "neighbour", "The neighbour of {h} is {t}.",
     "A tourist guide says the neighbour of {h} is {t}; it confused two houses."),
    ("editor", "editor", "The editor of {h} is {t}.",
     "{t} claimed to be the editor of {h}; the claim was false."),
]
RELATION_NAMES = [r[0] for r in RELATIONS]
_ONSETS = ["b", "br", "d", "f", "g", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "th", "v", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "n", "r", "l", "s", "m"]
_CALL = re.compile(r"^\s*([a-z_]+)\s*\((.*)\)\s*$", re.S)
_WORD = re.compile(r"\w+")
MAX_QUERY_WORDS = 128
"""the most words a ``search`` call may have (a longer query is an invalid call): FTS5's OR query
costs about the square of its repeated words (1000 x "mentor of" took 12 s on the 200-entity world,
within ``protocol.MAX_ACTION_CHARS``); above what an agent of ``max_new_tokens`` <= 100 writes"""
MAX_DOC_DIGITS = 18
"""the most digits of a document id ``open`` reads (SQLite's integers are 64-bit: a longer id is no
document, an invalid call, never an OverflowError)"""


def make_names(n: int, seed: int, syllables=(2, 3)) -> list[str]:
    """``n`` distinct capitalised made-up names of ``syllables`` syllables (an int, or the (low,
    high) range drawn uniformly; deterministic in ``seed``).

    >>> make_names(3, 0) == make_names(3, 0) and len(set(make_names(500, 1))) == 500
    True
    """
    low, high = (syllables, syllables) if isinstance(syllables, int) else map(int, syllables)
    if not 1 <= low <= high:
        raise ValueError(f"syllables must be a positive int or a (low, high) range, got {syllables!r}")
    rng = np.random.default_rng(seed)
    names, seen = [], set()
    while len(names) < n:
        syll = int(rng.integers(low, high + 1))
        word = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
                       + _CODAS[rng.integers(len(_CODAS))] for _ in range(syll))
        if word not in seen:
            seen.add(word)
            names.append(word.capitalize())
    return names


@dataclass
class KnowledgeGraph:
    names: list  # (N,) entity names
    relations: list  # relation names, in ``RELATIONS`` order
    tail: np.ndarray  # (N, R) int: tail[h, r] = the entity that relation r maps h to (never h)


def make_graph(num_entities: int = 200, num_relations: int = 4, seed: int = 0,
               name_syllables=(2, 3)) -> KnowledgeGraph:
    """A functional graph: every entity has one tail per relation, drawn uniformly among the others;
    names of ``name_syllables`` syllables (``make_names``)."""
    if not 2 <= num_relations <= len(RELATIONS):
        raise ValueError(f"num_relations must be in 2..{len(RELATIONS)}, got {num_relations}")
    if num_entities < 3:
        raise ValueError(f"num_entities must be >= 3, got {num_entities}")
    rng = np.random.default_rng([seed, 1])
    tail = rng.integers(0, num_entities - 1, size=(num_entities, num_relations))  # (N, R)
    tail += tail >= np.arange(num_entities)[:, None]  # skip the head itself
    return KnowledgeGraph(make_names(num_entities, seed, name_syllables),
                          RELATION_NAMES[:num_relations], tail)


@dataclass
class Corpus:
    titles: list  # (D,) document titles
    bodies: list  # (D,) document texts
    entity_doc: np.ndarray  # (N,) the id of each entity's own document
    aligned: np.ndarray  # (N, R) bool: the fact (h, r) is rendered as in the graph
    shown: np.ndarray  # (N, R) int: the tail h's document states for relation r (= tail where aligned)


def render_corpus(graph: KnowledgeGraph, alignment: float = 1.0, num_distractors: int = 1,
                  seed: int = 0) -> Corpus:
    """Entity documents (one fact sentence per relation; with probability 1 - ``alignment`` the
    sentence names a wrong tail) followed by ``num_distractors`` distractor documents per entity."""
    if not 0.0 <= alignment <= 1.0:
        raise ValueError(f"alignment must be in [0, 1], got {alignment}")
    if num_distractors < 0:
        raise ValueError(f"num_distractors must be >= 0, got {num_distractors}")
    rng = np.random.default_rng([seed, 2])
    N, R = graph.tail.shape
    aligned = rng.random((N, R)) < alignment  # (N, R)
    shown = graph.tail.copy()
    wrong = rng.integers(0, N - 2, size=(N, R))  # a tail that is neither the head nor the truth
    for h, r in zip(*np.nonzero(~aligned)):
        skip = sorted((h, graph.tail[h, r]))
        w = int(wrong[h, r])
        for s in skip:
            w += w >= s
        shown[h, r] = w
    titles, bodies = [], []
    for h in range(N):
        titles.append(graph.names[h])
        bodies.append(" ".join(RELATIONS[r][2].format(h=graph.names[h], t=graph.names[shown[h, r]])
                               for r in range(R)))
    decoys = rng.integers(0, N, size=(N, max(num_distractors, 1), 2))
    for h in range(N):
        for j in range(num_distractors):
            r, t = int(decoys[h, j, 0]) % R, int(decoys[h, j, 1])
            titles.append(f"Notes on {graph.names[h]}")
            bodies.append(RELATIONS[r][3].format(h=graph.names[h], t=graph.names[t]))
    return Corpus(titles, bodies, np.arange(N), aligned, shown)


class SearchIndex:
    """A full-text index of (title, body) documents: SQLite FTS5 in memory, BM25 ranking.
    ``search(query, k)`` -> [(doc id, title)] best first; ``get(doc_id)`` -> (title, body)."""

    def __init__(self, titles: list[str], bodies: list[str], title_weight: float = 5.0):
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        try:  # two tables: FTS5's bm25 normalises by the whole row's length, titles and bodies
            # together, which let a short distractor's long title outrank a long document's exact one
            self.db.execute("CREATE VIRTUAL TABLE titles USING fts5(title)")
            self.db.execute("CREATE VIRTUAL TABLE bodies USING fts5(body)")
        except sqlite3.OperationalError as err:
            raise RuntimeError(f"this Python's SQLite ({sqlite3.sqlite_version}) has no FTS5: "
                               "KGSearchEnv's search tool needs it") from err
        self.db.executemany("INSERT INTO titles(rowid, title) VALUES (?, ?)", enumerate(titles))
        self.db.executemany("INSERT INTO bodies(rowid, body) VALUES (?, ?)", enumerate(bodies))
        self.titles = list(titles)
        self.size, self.title_weight = len(titles), float(title_weight)

    @staticmethod
    def match_expression(query: str) -> str | None:
        """The FTS5 MATCH string of free text: its words, each quoted, OR-ed (None if no word).

        >>> SearchIndex.match_expression('mentor of "Talomir" AND (x')
        '"mentor" OR "of" OR "talomir" OR "and" OR "x"'
        """
        words = _WORD.findall(query.lower())
        return " OR ".join(f'"{w}"' for w in words) if words else None

    def search(self, query: str, k: int = 3) -> list[tuple[int, str]]:
        """The ``k`` best documents for free text: score = title_weight * BM25(title) + BM25(body)
        (each table's own length normalisation), ties by document id."""
        expr = self.match_expression(query)
        if expr is None:
            return []
        rows = self.db.execute(
            "SELECT id FROM (SELECT rowid AS id, ? * bm25(titles) AS s FROM titles WHERE titles MATCH ? "
            "UNION ALL SELECT rowid AS id, bm25(bodies) AS s FROM bodies WHERE bodies MATCH ?) "
            "GROUP BY id ORDER BY SUM(s), id LIMIT ?",
            (self.title_weight, expr, expr, int(k))).fetchall()
        return [(int(i), self.titles[i]) for (i,) in rows]

    def get(self, doc_id: int) -> tuple[str, str] | None:
        """(title, body) of a document; None for an id outside 0 .. size - 1 (never reaching
        SQLite, whose integers are 64-bit)."""
        if not 0 <= doc_id < self.size:
            return None
        row = self.db.execute("SELECT body FROM bodies WHERE rowid = ?", (int(doc_id),)).fetchone()
        return None if row is None else (self.titles[int(doc_id)], row[0])


_WORLDS: dict[tuple, tuple] = {}
"""(graph, corpus, index) per world configuration, shared by every environment instance"""


def world(num_entities: int, num_relations: int, alignment: float, num_distractors: int,
          seed: int, title_weight: float = 5.0, name_syllables=(2, 3)):
    """The cached (graph, corpus, index) of a configuration (built once per process)."""
    syll = name_syllables if isinstance(name_syllables, int) else tuple(name_syllables)
    key = (num_entities, num_relations, float(alignment), num_distractors, seed, float(title_weight),
           syll)
    if key not in _WORLDS:
        g = make_graph(num_entities, num_relations, seed, syll)
        c = render_corpus(g, alignment, num_distractors, seed)
        _WORLDS[key] = (g, c, SearchIndex(c.titles, c.bodies, title_weight))
    return _WORLDS[key]


def normalise_answer(text: str) -> str:
    """Lower case, words joined by one space, punctuation dropped: 'answer( Talomir. )' -> 'talomir'."""
    return " ".join(_WORD.findall(text.lower()))


class KGSearchEnv:
    """Multi-hop question answering by tool calls over a searchable corpus.

    ## Description
    Each episode asks a question of ``hops`` hops over the world of the module docstring (graph,
    corpus, full-text index; cached per configuration): "Who is the rival of the mentor of Talomir?"
    ``expert_actions()`` is the scripted searcher the SFT traces imitate: search the next entity of
    the chain, open its document, and answer once the chain is read (it follows the graph, so on a
    misaligned corpus it knows more than the documents say).

    ## Actions
    Text tool calls, one per turn: ``search(words)`` (top ``top_k`` titles with document ids),
    ``open(d12)`` (the document's text), ``answer(name)``. A malformed call (unknown tool, no
    parentheses, an unknown document, an empty argument, a query of more than ``MAX_QUERY_WORDS``
    words, a non-string or a text over ``protocol.MAX_ACTION_CHARS``) is invalid: an error
    observation, the state unchanged, the turn used.

    ## Observations
    ``Question: ...`` at reset; then ``Results: [d3] Title | ...`` (or "Results: none."), the opened
    document ``Title: body`` cut at ``max_doc_chars``, "Correct." / "Wrong." after an answer, or
    ``Error: ...``.

    ## Rewards
    ``answer_reward`` for an answer naming e_k (case and spaces ignored), else 0; an invalid call
    pays ``-invalid_penalty``.

    ## Episode end
    Terminated: an ``answer`` call, right (``success``) or wrong. Truncated: ``max_turns`` turns
    without an answer. A step after the end returns "The episode is over." (invalid, done).

    ## Info
    ``protocol.INFO_KEYS`` (state_key: (question seed, the gold documents opened so far)) and
    ``tool``, ``answer``, ``gold_docs``, ``grounded``, ``hops``.

    ## Arguments
    num_entities, num_relations, alignment, num_distractors, world_seed, title_weight,
    name_syllables: the world (module docstring). hops: the hop counts questions draw from. top_k,
    max_turns, max_doc_chars, answer_reward, invalid_penalty.

    ## Exact form
    None: the world is too large for a table. ``question(seed)`` is the exact task (chain, answer,
    gold documents, grounded); ``KGMenuEnv`` is the finite-menu rung.
    """

    tools = ("search", "open", "answer")
    system_prompt = ("Answer the question. Call one tool per turn: search(words), open(doc id) or "
                     "answer(name).")

    def __init__(self, num_entities: int = 200, num_relations: int = 4, hops=(1, 2),
                 alignment: float = 1.0, num_distractors: int = 1, top_k: int = 3,
                 max_turns: int = 8, max_doc_chars: int = 240, answer_reward: float = 1.0,
                 invalid_penalty: float = 0.0, world_seed: int = 0, title_weight: float = 5.0,
                 name_syllables=(2, 3)):
        hops = (hops,) if isinstance(hops, int) else tuple(int(k) for k in hops)
        if not hops or min(hops) < 1:
            raise ValueError(f"hops must be positive hop counts, got {hops!r}")
        if top_k < 1 or max_turns < 1:
            raise ValueError("top_k and max_turns must be >= 1")
        self.hops, self.top_k, self.max_turns = hops, int(top_k), int(max_turns)
        self.max_doc_chars, self.answer_reward = int(max_doc_chars), float(answer_reward)
        self.invalid_penalty = float(invalid_penalty)
        self.config = dict(num_entities=num_entities, num_relations=num_relations,
                           alignment=alignment, num_distractors=num_distractors, seed=world_seed,
                           title_weight=title_weight, name_syllables=name_syllables)
        self.graph, self.corpus, self.index = world(**self.config)
        self.num_invalid = 0
        self.task = None
        self.turn = 0

    # --- tasks ------------------------------------------------------------------------------------
    def question(self, seed: int) -> dict:
        """The task reset(seed) draws: hop count, start, relation path, the entity chain e_0..e_k,
        text, answer, gold documents and whether the chain is grounded in the corpus."""
        rng = np.random.default_rng([int(seed), 3])
        k = int(self.hops[rng.integers(len(self.hops))])
        R = self.graph.tail.shape[1]
        chain = [int(rng.integers(len(self.graph.names)))]
        rels = [int(r) for r in rng.integers(0, R, size=k)]
        for r in rels:
            chain.append(int(self.graph.tail[chain[-1], r]))
        phrase = "".join(f"the {RELATIONS[r][1]} of " for r in reversed(rels))
        names = self.graph.names
        return {"seed": int(seed), "hops": k, "relations": rels, "chain": chain,
                "text": f"Who is {phrase}{names[chain[0]]}?", "answer": names[chain[-1]],
                "gold_docs": [int(self.corpus.entity_doc[e]) for e in chain[:-1]],
                "grounded": bool(all(self.corpus.aligned[e, r] for e, r in zip(chain, rels)))}

    def eval_panel(self, n: int = 64) -> tuple[list[int], str]:
        """Task seeds 10**6 .. 10**6 + n - 1 and their hash: numbers from two runs compare only when
        the hashes match."""
        return protocol.eval_panel(n, blob=self._panel_blob)

    def panel_hash(self, seeds) -> str:
        return protocol.panel_hash(self._panel_blob(seeds))

    def _panel_blob(self, seeds) -> dict:
        tasks = [(q["text"], q["answer"]) for q in map(self.question, seeds)]
        return {"config": self.config, "hops": self.hops, "tasks": tasks}

    # --- the protocol -----------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> str:
        if seed is None:
            seed = int(np.random.default_rng().integers(2**31))
        self.task = self.question(seed)
        self.turn, self.opened, self.last_results, self.done = 0, [], [], False
        self.believed = [self.task["chain"][0]]
        return f"Question: {self.task['text']}"

    def state_key(self) -> tuple:
        gold = set(self.task["gold_docs"])
        return (self.task["seed"], tuple(sorted(gold & set(self.opened))))

    def _info(self, valid: bool, error: str | None, tool: str | None, success: bool,
              truncated: bool = False) -> dict:
        return {"state_key": self.state_key(), "valid": valid, "error": error, "tool": tool,
                "success": success, "answer": self.task["answer"], "gold_docs": self.task["gold_docs"],
                "grounded": self.task["grounded"], "hops": self.task["hops"],
                "truncated": truncated}

    def parse(self, text: str) -> tuple[str | None, str | None, str | None]:
        """(tool, argument, error) of one action text; error is None for a well-formed call."""
        unreadable = protocol.action_error(text)
        if unreadable:  # a query of thousands of words costs the index seconds
            return None, None, unreadable
        m = _CALL.match(text.strip().splitlines()[0] if text.strip() else "")
        if m is None:
            return None, None, "not a tool call: write search(words), open(doc id) or answer(name)"
        tool, arg = m.group(1), m.group(2).strip().strip("'\"").strip()
        if tool not in self.tools:
            return None, None, f"unknown tool {tool!r}: use search, open or answer"
        if not arg:
            return None, None, f"{tool}() needs an argument"
        if tool == "search" and len(_WORD.findall(arg)) > MAX_QUERY_WORDS:
            return None, None, (f"search() takes at most {MAX_QUERY_WORDS} words, got "
                                f"{len(_WORD.findall(arg))}")
        return tool, arg, None

    def step(self, action_text: str):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            return "The episode is over.", 0.0, True, self._info(False, "episode over", None, False)
        self.turn += 1
        tool, arg, error = self.parse(action_text)
        reward, done, success = 0.0, False, False
        if error is None and tool == "open":
            m = re.fullmatch(r"d?(\d+)", arg.lower())
            # an id past SQLite's 64-bit integers overflows it: no such document either way
            doc = (None if m is None or len(m.group(1).lstrip("0")) > MAX_DOC_DIGITS
                   else self.index.get(int(m.group(1))))
            if doc is None:
                error = f"no document {arg!r}: open an id from the search results, e.g. open(d3)"
        if error is not None:
            self.num_invalid += 1
            obs, reward = f"Error: {error}.", -self.invalid_penalty
        elif tool == "search":
            self.last_results = self.index.search(arg, self.top_k)
            obs = ("Results: " + " | ".join(f"[d{i}] {t}" for i, t in self.last_results)
                   if self.last_results else "Results: none.")
        elif tool == "open":
            doc_id = int(m.group(1))
            self.opened.append(doc_id)
            self.read(doc_id)
            title, body = doc
            obs = f"{title}: {body}"[:self.max_doc_chars]
        else:  # answer
            success = normalise_answer(arg) == normalise_answer(self.task["answer"])
            reward, done = (self.answer_reward if success else 0.0), True
            obs = "Correct." if success else "Wrong."
        truncated = not done and self.turn >= self.max_turns  # the cap ends a live episode
        self.done = done = done or truncated
        return obs, reward, done, self._info(error is None, error, tool, success, truncated)

    def read(self, doc_id: int) -> None:
        """The agent's belief after opening ``doc_id``: if it is the document of the entity believed
        at the current hop, append the tail that document states for the next relation (the truth
        where the corpus is aligned, a wrong entity where it is not)."""
        read = len(self.believed) - 1
        head = self.believed[-1]
        if read < self.task["hops"] and doc_id == int(self.corpus.entity_doc[head]):
            self.believed.append(int(self.corpus.shown[head, self.task["relations"][read]]))

    def menu_calls(self) -> dict[str, str]:
        """The call text of each entry of ``KGMenuEnv.actions`` at the current state: search the
        believed current entity / a random other name (seeded by question seed and turn), open the
        first / second result of the last search (``open()``, a malformed call, if there is none),
        answer the believed entity."""
        names, cur = self.graph.names, self.believed[-1]
        rng = np.random.default_rng([self.task["seed"], self.turn, 7])
        other = int(rng.integers(len(names) - 1))
        other += other >= cur
        res = [i for i, _ in self.last_results]
        return {"search_next": f"search({names[cur]})", "search_other": f"search({names[other]})",
                "open_top": f"open(d{res[0]})" if res else "open()",
                "open_second": f"open(d{res[1]})" if len(res) > 1 else "open()",
                "answer": f"answer({names[cur]})"}

    def expert_actions(self) -> list[str]:
        """The scripted searcher's next call: open the next chain entity's document if the last
        search listed it, else search its name; answer once every gold document is open."""
        chain, gold = self.task["chain"], self.task["gold_docs"]
        read = 0
        while read < len(gold) and gold[read] in self.opened:
            read += 1
        if read == len(gold):
            return [f"answer({self.task['answer']})"]
        want = gold[read]
        if any(i == want for i, _ in self.last_results):
            return [f"open(d{want})"]
        return [f"search({self.graph.names[chain[read]]})"]


class KGMenuEnv:
    """``KGSearchEnv`` played through a finite menu of calls: the tabular / MLP rung of part 5.

    ## Description
    The inner environment ``self.env`` does all the work: every reward, the turn cap and the
    counting of malformed calls are its. On an aligned corpus the menu's expert answers every
    question in 2 * hops + 1 turns.

    ## Actions
    ``actions`` = search_next, search_other, open_top, open_second, answer, as an index or a name;
    ``step`` sends ``menu_calls()[name]`` to the inner environment (see ``KGSearchEnv.menu_calls``).
    Anything off the menu is invalid: the inner environment gets an empty call, so the turn is used
    and counted.

    ## Observations
    The inner environment's.

    ## Rewards
    The inner environment's.

    ## Episode end
    The inner environment's: terminated by the answer, truncated at ``max_turns``.

    ## Info
    The inner environment's with this state key and ``call``, the text sent (None off the menu). The
    state key is (hops, hops read, the last search's first result is the believed entity's
    document): what a menu policy needs, no question identity, so one table serves every question.

    ## Arguments
    ``KGSearchEnv``'s, passed through.

    ## Exact form
    None (the state key aggregates questions); ``expert_actions`` is the menu's optimal move.
    """

    actions = ["search_next", "search_other", "open_top", "open_second", "answer"]

    def __init__(self, **kg_kwargs):
        self.env = KGSearchEnv(**kg_kwargs)
        self.max_turns = self.env.max_turns

    def eval_panel(self, n: int = 64):
        return self.env.eval_panel(n)

    def panel_hash(self, seeds) -> str:
        return self.env.panel_hash(seeds)

    def state_key(self) -> tuple:
        env = self.env
        found = bool(env.last_results) and env.last_results[0][0] == int(
            env.corpus.entity_doc[env.believed[-1]])
        return (env.task["hops"], len(env.believed) - 1, found)

    def reset(self, seed: int | None = None) -> str:
        return self.env.reset(seed)

    def step(self, action):
        i = protocol.menu_index(action, self.actions)
        if i is None:  # off the menu: the inner env gets an empty call (invalid, uses the turn)
            _, reward, done, info = self.env.step("")
            error = (f"menu action {repr(action)[:40]} out of range: 0..{len(self.actions) - 1} "
                     f"or one of {self.actions}")
            return f"Error: {error}.", reward, done, {**info, "error": error,
                                                      "state_key": self.state_key(), "call": None}
        call = self.env.menu_calls()[self.actions[i]]
        obs, reward, done, info = self.env.step(call)
        return obs, reward, done, {**info, "state_key": self.state_key(), "call": call}

    def expert_actions(self) -> list[str]:
        """The menu's optimal move: answer once every hop is read, open the believed entity's
        document when the last search put it first, else search it."""
        hops, read, found = self.state_key()
        return ["answer"] if read == hops else ["open_top"] if found else ["search_next"]
