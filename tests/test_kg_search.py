"""KGSearchEnv: the graph, the corpus and its alignment knob, the FTS5 index against a linear scan,
k-hop questions, the tool-call protocol (malformed calls never raise), the scripted searcher."""

import re

import numpy as np
import pytest

from agentrl_lib.envs import kg_search
from agentrl_lib.envs.kg_search import KGSearchEnv, SearchIndex, make_graph, render_corpus
from agentrl_lib.rollout import play_episodes


def test_graph_is_functional_and_deterministic():
    g = make_graph(50, 4, seed=3)
    assert g.tail.shape == (50, 4) and len(set(g.names)) == 50
    assert not (g.tail == np.arange(50)[:, None]).any()  # nobody is their own mentor
    assert g.tail.min() >= 0 and g.tail.max() < 50
    assert np.array_equal(g.tail, make_graph(50, 4, seed=3).tail)
    assert not np.array_equal(g.tail, make_graph(50, 4, seed=4).tail)
    with pytest.raises(ValueError, match="num_relations"):
        make_graph(50, 9)


def stated_tail(corpus, graph, h, r):
    """The tail the entity document of h names for relation r, read back from its text."""
    m = re.search(rf"The {graph.relations[r]} of {graph.names[h]} is (\w+)\.", corpus.bodies[h])
    return graph.names.index(m.group(1))


@pytest.mark.parametrize("alignment", [1.0, 0.0, 0.5])
def test_alignment_knob(alignment):
    g = make_graph(60, 3, seed=0)
    c = render_corpus(g, alignment, num_distractors=2, seed=0)
    assert len(c.titles) == 60 * 3  # one entity document and two distractors each
    truth = np.array([[stated_tail(c, g, h, r) == g.tail[h, r] for r in range(3)] for h in range(60)])
    assert np.array_equal(truth, c.aligned)  # a fact is stated truly exactly where it is aligned
    if alignment == 1.0:
        assert truth.all()
    elif alignment == 0.0:
        assert not truth.any()
        wrong = np.array([[stated_tail(c, g, h, r) for r in range(3)] for h in range(60)])
        assert not (wrong == np.arange(60)[:, None]).any()  # a wrong tail is never the head
    else:
        assert 0.3 < truth.mean() < 0.7


def test_index_returns_exactly_the_matching_documents():
    """A one-word query returns every document containing the word and no other (against a linear
    scan), ranked with title matches first; FTS5 syntax in a query is treated as plain words."""
    g = make_graph(40, 4, seed=1)
    c = render_corpus(g, 1.0, 1, seed=1)
    idx = SearchIndex(c.titles, c.bodies)
    name = g.names[7]
    hits = idx.search(name, k=1000)
    scan = {i for i, (t, b) in enumerate(zip(c.titles, c.bodies))
            if name.lower() in re.findall(r"\w+", (t + " " + b).lower())}
    assert {i for i, _ in hits} == scan
    assert {t for _, t in hits[:2]} == {name, f"Notes on {name}"}  # title weight
    assert idx.search('"AND (OR', k=3) == idx.search("and or", k=3)
    assert idx.search("  ...  ") == [] and idx.get(10**9) is None
    assert idx.get(7) == (c.titles[7], c.bodies[7])


def test_questions_follow_the_graph():
    env = KGSearchEnv(num_entities=80, hops=(1, 2, 3), alignment=0.7)
    ks = set()
    for seed in range(60):
        q = env.question(seed)
        ks.add(q["hops"])
        e = q["chain"][0]
        for r in q["relations"]:
            e = env.graph.tail[e, r]
        assert env.graph.names[e] == q["answer"] and len(q["gold_docs"]) == q["hops"]
        assert q["text"].endswith(env.graph.names[q["chain"][0]] + "?")
        assert q["text"].count(" of ") == q["hops"]
        assert q["grounded"] == all(env.corpus.aligned[h, r]
                                    for h, r in zip(q["chain"], q["relations"]))
        assert q == env.question(seed)
    assert ks == {1, 2, 3}


def test_malformed_calls_are_counted_and_change_nothing():
    env = KGSearchEnv(num_entities=50, invalid_penalty=0.1, max_turns=10)
    env.reset(seed=1)
    key = env.state_key()
    for bad in ["hello", "search()", "fly(away)", "open(d999999)", "open(abc)", ""]:
        obs, r, done, info = env.step(bad)
        assert obs.startswith("Error:") and r == -0.1 and not done
        assert not info["valid"] and info["state_key"] == key
    assert env.num_invalid == 6
    obs, r, done, info = env.step("search(" + env.graph.names[0] + ")")
    assert obs.startswith("Results: [d") and info["valid"] and info["tool"] == "search"


def test_turn_cap_and_wrong_answer():
    env = KGSearchEnv(num_entities=50, max_turns=2)
    env.reset(seed=0)
    assert env.step("search(x)")[2] is False
    assert env.step("search(y)")[2] is True  # truncated at the cap
    env.reset(seed=0)
    obs, r, done, info = env.step("answer(nobody)")
    assert (obs, r, done, info["success"]) == ("Wrong.", 0.0, True, False)
    env.reset(seed=0)
    obs, r, done, info = env.step(f"answer(  {env.task['answer'].upper()}. )")
    assert (r, done, info["success"]) == (1.0, True, True)


def test_scripted_searcher_solves_grounded_questions():
    """The expert reads the chain: 2 calls per hop, then the answer; on a fully aligned corpus it
    solves every question, and through play_episodes the record shows it."""
    def make_env():
        return KGSearchEnv(num_entities=120, hops=(1, 2, 3), max_turns=8)

    def expert(envs, observations):
        return [e.expert_actions()[0] for e in envs]

    eps = play_episodes(make_env, expert, list(range(40)), group_size=1)
    assert all(ep.success for ep in eps)
    assert all(len(ep) == 2 * ep.infos[-1]["hops"] + 1 for ep in eps)
    assert all(set(ep.state_keys[-1][1]) == set(ep.infos[-1]["gold_docs"]) for ep in eps)


def test_misaligned_corpus_breaks_document_following():
    """On a corpus with alignment 0 every fact the documents state is wrong, so an agent that
    answers what the documents say fails every question while the graph-following expert still
    succeeds: the rewards are misaligned with what search can find."""
    env = KGSearchEnv(num_entities=80, hops=(1,), alignment=0.0)
    for seed in range(20):
        env.reset(seed=seed)
        q = env.task
        assert not q["grounded"]
        said = env.graph.names[stated_tail(env.corpus, env.graph, q["chain"][0], q["relations"][0])]
        assert env.step(f"answer({said})")[3]["success"] is False


def test_panel_hash_and_world_cache():
    a, b = KGSearchEnv(num_entities=50), KGSearchEnv(num_entities=50)
    assert a.index is b.index  # one index per configuration and process
    seeds, h = a.eval_panel(8)
    assert seeds == list(range(10**6, 10**6 + 8)) and h == b.eval_panel(8)[1]
    assert KGSearchEnv(num_entities=50, alignment=0.5).eval_panel(8)[1] != h
    assert (50, 4, 1.0, 1, 0, 5.0) in kg_search._WORLDS
    with pytest.raises(ValueError, match="hops"):
        KGSearchEnv(hops=(0,))
    with pytest.raises(RuntimeError, match="reset"):
        KGSearchEnv(num_entities=50).step("search(x)")


def test_an_entity_document_outranks_its_distractors():
    """With four distractors per entity (five title matches for a name), the entity's own document
    is the first hit for its name: each field is length-normalised on its own (a single FTS5 table
    normalised the title by the body's length too and ranked the short distractors first)."""
    g = make_graph(300, 4, seed=2)
    c = render_corpus(g, 1.0, 4, seed=2)
    idx = SearchIndex(c.titles, c.bodies)
    assert all(idx.search(g.names[h], 3)[0][0] == h for h in range(300))
    env = KGSearchEnv(num_entities=300, hops=(2,), num_distractors=4, world_seed=2)
    eps = play_episodes(lambda: env.__class__(num_entities=300, hops=(2,), num_distractors=4,
                                              world_seed=2),
                        lambda envs, obs: [e.expert_actions()[0] for e in envs], list(range(20)), 1)
    assert all(ep.success and len(ep) == 5 for ep in eps)
