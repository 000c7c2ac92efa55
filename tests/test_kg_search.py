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
    assert (50, 4, 1.0, 1, 0, 5.0, (2, 3)) in kg_search._WORLDS
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


def test_shown_is_what_the_documents_state_and_names_have_their_syllables():
    g = make_graph(40, 3, seed=2, name_syllables=2)
    c = render_corpus(g, 0.5, num_distractors=1, seed=2)
    stated = np.array([[stated_tail(c, g, h, r) for r in range(3)] for h in range(40)])
    assert np.array_equal(stated, c.shown)
    assert np.array_equal(c.shown == g.tail, c.aligned)
    # two syllables: two vowel groups each; three-syllable names never appear
    assert all(len(re.findall(r"[aeiou]+", n.lower())) == 2 for n in g.names)
    with pytest.raises(ValueError, match="syllables"):
        kg_search.make_names(3, 0, syllables=(3, 2))


def test_belief_follows_the_documents_not_the_graph():
    env = KGSearchEnv(num_entities=60, num_relations=2, hops=2, alignment=0.0, world_seed=5)
    env.reset(seed=11)
    e0, (r1, r2) = env.task["chain"][0], env.task["relations"]
    assert env.believed == [e0]
    env.step(f"open(d{int(env.corpus.entity_doc[e0]) + 60})")  # a distractor: no progress
    assert env.believed == [e0]
    env.step(f"open(d{int(env.corpus.entity_doc[e0])})")
    e1 = int(env.corpus.shown[e0, r1])
    assert env.believed == [e0, e1] and e1 != env.task["chain"][1]  # every fact is misaligned
    env.step(f"open(d{int(env.corpus.entity_doc[e0])})")  # re-reading e0 adds nothing
    assert env.believed == [e0, e1]
    env.step(f"open(d{e1})")
    assert env.believed == [e0, e1, int(env.corpus.shown[e1, r2])]
    env.step(f"open(d{e1})")  # every hop read: the belief stops growing
    assert len(env.believed) == 3


def test_menu_env_expert_reads_the_chain_in_2k_plus_1_turns():
    from agentrl_lib.envs import make_agent_env
    kw = dict(num_entities=80, num_relations=3, hops=(1, 2, 3), max_turns=10)
    act = lambda envs, obs: [e.expert_actions()[0] for e in envs]  # noqa: E731
    eps = play_episodes(lambda: make_agent_env("kg_menu", **kw), act, list(range(60)), 1, 10)
    for ep in eps:
        k = ep.infos[-1]["hops"]
        assert sum(ep.rewards) == 1.0 and len(ep) == 2 * k + 1
        # keys: (k, 0, False), (k, 0, True), (k, 1, False), ... , (k, k, False)
        want = [(k, j // 2, j % 2 == 1) for j in range(2 * k)] + [(k, k, False)]
        assert ep.state_keys == want
        assert [i["call"].split("(")[0] for i in ep.infos] == ["search", "open"] * k + ["answer"]


def test_menu_env_calls_and_bad_input():
    from agentrl_lib.envs.kg_search import KGMenuEnv
    env = KGMenuEnv(num_entities=60, num_relations=2, hops=1, max_turns=4)
    env.reset(seed=3)
    obs, r, done, info = env.step("open_top")  # nothing searched yet: open() is malformed
    assert info["call"] == "open()" and not info["valid"] and env.env.num_invalid == 1
    assert info["state_key"] == (1, 0, False) and r == 0.0 and not done
    _, _, _, info = env.step("search_other")
    assert info["valid"] and info["call"] != f"search({env.env.graph.names[env.env.believed[0]]})"
    obs, r, done, info = env.step(4)  # answer e_0 to a one-hop question: wrong
    assert done and r == 0.0 and obs == "Wrong."
    env.reset(seed=3)
    obs, r, done, info = env.step(7)  # off the menu: an invalid turn (the protocol never raises)
    assert not info["valid"] and "out of range" in info["error"] and info["call"] is None


def test_scripted_text_policy_on_the_search_env():
    from agentrl_lib.algorithms.sft import KG_AGENT_GAME, scripted_policy
    make = lambda: KGSearchEnv(**KG_AGENT_GAME)  # noqa: E731
    eps = play_episodes(make, scripted_policy(0.0, np.random.default_rng(0)), list(range(30)), 1, 6)
    assert all(ep.success for ep in eps)  # epsilon 0: the scripted searcher, aligned corpus
    noisy = play_episodes(make, scripted_policy(1.0, np.random.default_rng(0)), [0, 1], 4, 6)
    for ep in noisy:  # epsilon 1: every call is one of the menu's texts at its state
        assert all(re.fullmatch(r"(search|open|answer)\(.*\)", a) for a in ep.actions)
    assert len({tuple(ep.actions) for ep in noisy}) > 1
