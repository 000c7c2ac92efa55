"""KGJudgeEnv (envs/kg_judge.py) and ReSeek's process rewards (algorithms/reseek.py): the reader,
the JUDGE tool, the hard retriever, the menu, and the rewards/advantages/faithfulness by hand."""

import numpy as np
import pytest

from agentrl_lib.algorithms import reseek
from agentrl_lib.algorithms.credit import grpo_broadcast
from agentrl_lib.envs.kg_judge import KGJudgeEnv, KGJudgeMenuEnv
from agentrl_lib.envs.kg_search import KGSearchEnv
from agentrl_lib.rollout import Episode, play_episodes

KW = dict(num_entities=30, hops=(1, 2), max_turns=12)


def first_seed(env, pred, limit=500):
    for s in range(limit):
        env.reset(s)
        if pred(env):
            return s
    raise AssertionError("no seed found")


def test_without_judge_equals_kg_search():
    """judge=False, decoy_first=0: the same observations, rewards, done and validity."""
    a, b = KGJudgeEnv(judge=False, **KW), KGSearchEnv(**KW)
    rng = np.random.default_rng(0)
    for seed in range(6):
        oa, ob = a.reset(seed), b.reset(seed)
        assert oa == ob and a.system_prompt == b.system_prompt
        for t in range(10):
            names = a.graph.names
            pool = [f"search({names[int(rng.integers(30))]})", f"open(d{int(rng.integers(60))})",
                    "judge(useless)", "open(x)", b.expert_actions()[0]]
            act = pool[int(rng.integers(len(pool)))] if t % 2 else b.expert_actions()[0]
            ra, rb = a.step(act), b.step(act)
            assert ra[:3] == rb[:3] and ra[3]["valid"] == rb[3]["valid"]
            if ra[2]:
                break


def test_reader_decoy_and_judge_replans():
    env = KGJudgeEnv(judge=True, **KW)
    seed = first_seed(env, lambda e: e.task["hops"] == 1 and e.task["grounded"])
    e0, e1 = env.task["chain"]
    name = env.graph.names[e0]
    note = env.corpus.titles.index(f"Notes on {name}")
    obs, r, done, info = env.step(f"open(d{note})")
    decoy = next(w for w in obs.split() if w.strip(".,;") in env.entity_of_title
                 and w.strip(".,;") != name).strip(".,;")
    # the credulous reader takes the decoy's person as the next hop
    assert info["opened_kind"] == "note" and env.believed == [e0, env.entity_of_title[decoy]]
    assert info["advanced"] is (env.entity_of_title[decoy] == e1) and not info["fact_true"]
    obs, r, done, info = env.step("judge(useless)")
    assert info["valid"] and info["judge_truth"] == "useless" and info["rejected_doc"] == note
    assert env.believed == [e0] and r == 0.0
    # the re-plan never lists the rejected document again
    obs, r, done, info = env.step(f"search({name})")
    assert all(i != note for i, _ in env.last_results) and f"[d{note}]" not in obs
    assert info["gold_retrieved"]
    own = int(env.corpus.entity_doc[e0])
    obs, r, done, info = env.step(f"open(d{own})")
    assert info["opened_kind"] == "entity" and info["fact_true"] and info["advanced"]
    assert env.believed == [e0, e1] and info["doc"] == own
    obs, r, done, info = env.step("judge(useful)")
    assert info["judge"] == info["judge_truth"] == "useful" and env.believed == [e0, e1]
    obs, r, done, info = env.step(f"answer({env.graph.names[e1]})")
    assert done and r == 1.0 and info["success"]
    del seed


def test_judge_malformed_calls():
    env = KGJudgeEnv(judge=True, **KW)
    env.reset(0)
    obs, r, done, info = env.step("judge(useful)")  # nothing opened yet
    assert not info["valid"] and "nothing to judge" in info["error"] and env.num_invalid == 1
    own = int(env.corpus.entity_doc[env.task["chain"][0]])
    env.step(f"open(d{own})")
    obs, r, done, info = env.step("judge(maybe)")
    assert not info["valid"] and env.num_invalid == 2
    assert env.step("judge(useful)")[3]["valid"]
    assert not env.step("judge(useful)")[3]["valid"]  # each open is judged once


def test_misaligned_fact_is_not_factual():
    env = KGJudgeEnv(judge=True, alignment=0.5, **KW)
    first_seed(env, lambda e: not e.corpus.aligned[e.task["chain"][0], e.task["relations"][0]])
    e0 = env.task["chain"][0]
    info = env.step(f"open(d{int(env.corpus.entity_doc[e0])})")[3]
    assert info["gold_retrieved"] and not info["fact_true"] and not info["advanced"]
    assert len(env.believed) == 2 and env.believed[1] != env.task["chain"][1]  # the lie is read
    assert env.step("judge(useful)")[3]["judge_truth"] == "useless"


def test_decoy_first_ranks_the_distractor_above():
    for p, want in [(0.0, 0), (1.0, 1)]:
        env = KGJudgeEnv(judge=False, decoy_first=p, **KW)
        for seed in range(5):
            env.reset(seed)
            name = env.graph.names[env.task["chain"][0]]
            env.step(f"search({name})")
            titles = [t for _, t in env.last_results]
            if want:
                assert titles.index(f"Notes on {name}") < titles.index(name)
            else:
                assert titles[0] == name


def test_menu_expert_and_keys():
    mk = lambda: KGJudgeMenuEnv(judge=True, decoy_first=0.5, **KW)  # noqa: E731
    env = mk()
    assert env.actions[-2:] == ["judge_useful", "judge_useless"]
    assert KGJudgeMenuEnv(judge=False, **KW).actions == KGJudgeMenuEnv.BASE_ACTIONS

    def expert(envs, obs):
        return [e.actions.index(e.expert_actions()[0]) for e in envs]

    eps = play_episodes(mk, expert, list(range(40)), 1)
    for ep in eps:  # the expert answers right exactly when the chain is grounded
        assert ep.success == ep.task["grounded"]
    assert reseek.judge_accuracy(eps)[0] == 1.0
    env.reset(3)
    assert env.state_key() == (env.task["hops"], 0, False, None)
    info = env.step("search_next")[3]
    assert info["state_key"][2] and info["call"].startswith("search(")
    info = env.step("fly")[3]  # off the menu: an invalid turn (the protocol never raises)
    assert not info["valid"] and info["call"] is None and env.env.num_invalid == 1


J_RIGHT_USEFUL = dict(tool="judge", judge="useful", judge_truth="useful")
J_WRONG_USEFUL = dict(tool="judge", judge="useful", judge_truth="useless")
ANSWER = dict(tool="answer")


def j_useless(doc):
    return dict(tool="judge", judge="useless", judge_truth="useless", rejected_doc=doc)


def _ep(rewards, flags, group_id=0, gold=(5,)):
    infos = []
    for f in flags:
        info = dict(fact_true=False, advanced=False, judge=None, judge_truth=None, valid=True,
                    tool="search", gold_docs=list(gold), rejected_doc=None)
        info.update(f)
        infos.append(info)
    return Episode.of(list(range(len(rewards))), rewards, group_id=group_id, infos=infos)


def batch():
    """Episode 1: open gold (c, u), judge it useful (right), answer right. Episode 2: open a note,
    judge it useful (wrong), answer wrong. Episode 3: open a note, judge useless (right), open
    gold (c, u), answer right."""
    e1 = _ep([0, 0, 1], [dict(tool="open", doc=5, fact_true=True, advanced=True),
                         J_RIGHT_USEFUL, ANSWER])
    e2 = _ep([0, 0, 0], [dict(tool="open", doc=9),
                         J_WRONG_USEFUL, ANSWER])
    e3 = _ep([0, 0, 0, 1], [dict(tool="open", doc=9),
                            j_useless(9),
                            dict(tool="open", doc=5, fact_true=True, advanced=True), ANSWER])
    return [e1, e2, e3]


def test_process_rewards_by_hand():
    r = reseek.process_rewards(batch(), w_correct=0.2, w_utility=0.3, w_judge=0.1)
    assert np.allclose(r[0], [0.5, 0.1, 1.0])
    assert np.allclose(r[1], [0.0, -0.1, 0.0])
    assert np.allclose(r[2], [0.0, 0.1, 0.5, 1.0])
    with pytest.raises(ValueError, match="fact_true"):
        reseek.process_rewards([Episode.of(["s"], [1.0])])


def test_advantages_episode_and_turn_by_hand():
    eps = batch()
    r = reseek.process_rewards(eps, 0.2, 0.3, 0.1)
    tot = np.array([1.6, -0.1, 1.6])
    z = (tot - tot.mean()) / (tot.std(ddof=1) + 1e-4)
    a = reseek.reseek_advantages(eps, r, "episode")
    assert all(np.allclose(x, np.full(len(e), zi)) for x, e, zi in zip(a, eps, z))
    # turn: returns-to-go of all 10 turns normalised together
    g = [np.array([1.6, 1.1, 1.0]), np.array([-0.1, -0.1, 0.0]), np.array([1.6, 1.6, 1.5, 1.0])]
    flat = np.concatenate(g)
    zt = (flat - flat.mean()) / (flat.std(ddof=1) + 1e-4)
    a = reseek.reseek_advantages(eps, r, "turn")
    assert np.allclose(np.concatenate(a), zt)
    # outcome-only rewards in episode mode are GRPO
    out = reseek.process_rewards(eps, 0.0, 0.0, 0.0)
    assert all(np.allclose(x, y) for x, y in zip(reseek.reseek_advantages(eps, out),
                                                 grpo_broadcast(eps)))


def test_advantage_edge_cases():
    eps = batch()
    for e in eps:
        e.group_id = 7
    eq = [np.zeros(len(e)) for e in eps]
    assert all(np.all(a == 0) for a in reseek.reseek_advantages(eps, eq, "turn"))
    solo = batch()[:1]
    assert np.all(reseek.reseek_advantages(solo, [np.array([1.0, 0.0, 2.0])], "episode")[0] == 0)
    assert not np.all(reseek.reseek_advantages(solo, [np.array([1.0, 0.0, 2.0])], "turn")[0] == 0)
    with pytest.raises(ValueError, match="mode"):
        reseek.reseek_advantages(eps, eq, "token")
    with pytest.raises(ValueError, match="turns got"):
        reseek.reseek_advantages(eps, [np.zeros(1)] * 3)


def test_path_faithfulness_by_hand():
    e1, e2, e3 = batch()
    assert reseek.path_faithfulness(e1) == 1.0
    assert reseek.path_faithfulness(e2) == 0.0
    assert reseek.path_faithfulness(e3) == 1.0  # the rejected note leaves the path
    assert reseek.path_faithfulness(e3, kept_only=False) == 0.5
    assert reseek.path_faithfulness(_ep([0], [dict(tool="answer")])) == 0.0
    # re-opening a gold document and rejecting that second open keeps the first on the path
    again = _ep([0, 0, 0, 1], [dict(tool="open", doc=5), dict(tool="open", doc=5),
                               j_useless(5), ANSWER])
    assert reseek.path_faithfulness(again) == 1.0
    acc, n = reseek.judge_accuracy([e1, e2, e3])
    assert n == 3 and acc == pytest.approx(2 / 3)


# --- the released reward (TencentBAC/ReSeek reseek_regex.compute_score) by hand -----------------
def _open(states_answer):
    return dict(valid=True, tool="open", doc=1, states_answer=states_answer, judge=None)


def _judge(verdict):
    return dict(valid=True, tool="judge", judge=verdict)


def _answer(success):
    return dict(valid=True, tool="answer", judge=None, success=success)


def _episode(infos, outcome):
    rewards = [0.0] * (len(infos) - 1) + [outcome]
    return Episode.of(["s"] * len(infos), rewards, infos=infos)


@pytest.mark.parametrize("verdict, states, right, expected", [
    ("useful", False, True, 1.0 + 0.4),   # Yes with a right answer: 0.3 + 0.1, information unchecked
    ("useful", True, True, 1.0 + 0.4),
    ("useful", True, False, 0.3),         # a right Yes, wrong answer: no boost
    ("useful", False, False, -0.6),       # a wrong Yes
    ("useless", False, True, 1.0 + 0.4),  # a right No, right answer: 0.3 + 0.1
    ("useless", False, False, 0.3),       # a right No, wrong answer
    ("useless", True, False, -0.3),       # a wrong No
    ("useless", True, True, 1.0 - 0.3),   # a wrong No is punished whatever the answer
])
def test_released_reward_every_branch(verdict, states, right, expected):
    ep = _episode([_open(states), _judge(verdict), _answer(right)], 1.0 if right else 0.0)
    r = reseek.released_rewards([ep])[0]
    assert np.allclose(r, [0.0, 0.0, expected])  # one number per episode, on the last turn


def test_released_reward_pairs_and_no_answer():
    # two opens before one verdict both pair with it; an open never judged pairs with nothing
    infos = [_open(False), _open(True), _judge("useless"), _open(False), _answer(False)]
    ep = _episode(infos, 0.0)
    assert reseek.judge_pairs(ep) == [(False, False), (False, True)]
    assert np.isclose(reseek.released_rewards([ep])[0][-1], 0.3 - 0.3)
    # no answer (truncated at the turn cap): no verdict term at all, even for a wrong Yes
    cut = _episode([_open(False), _judge("useful"), _open(False)], 0.0)
    assert np.allclose(reseek.released_rewards([cut])[0], 0.0)
    # an invalid answer call is no answer either
    bad = _episode([_open(False), _judge("useful"), dict(valid=False, tool=None, judge=None)], 0.0)
    assert not reseek.answered(bad) and np.allclose(reseek.released_rewards([bad])[0], 0.0)
    # without JUDGE calls the released reward is the outcome: GRPO's advantage exactly
    plain = [_episode([_open(True), _answer(s)], float(s)) for s in (True, False, True)]
    for ep_ in plain:
        ep_.group_id = 0
    adv = reseek.reseek_advantages(plain, reseek.released_rewards(plain), "episode")
    assert all(np.allclose(a, b) for a, b in zip(adv, grpo_broadcast(plain)))
    # the constants can be overridden (the paper's note quotes the same three; ablations vary them)
    r = reseek.released_rewards([_episode([_open(False), _judge("useful"), _answer(False)], 0.0)],
                                wrong_yes=-1.0)[0]
    assert np.isclose(r[-1], -1.0)


def test_states_answer_flag_in_the_environment():
    """1-hop: the gold document names the answer (a Yes is right); the first hop of a 2-hop
    question names the middle person only (the code's ground truth says No, though it is needed)."""
    env = KGJudgeEnv(judge=True, **dict(KW, alignment=1.0))
    for hops, expected in ((1, True), (2, False)):
        env.reset(first_seed(env, lambda e: e.task["hops"] == hops and e.task["grounded"]))
        doc = env.task["gold_docs"][0]
        obs, _, _, info = env.step(f"open(d{doc})")
        assert info["fact_true"] and info["states_answer"] is expected
        assert (env.task["answer"].lower() in obs.lower()) is expected


def test_soft_mask_keeps_the_document_and_asks_for_a_search():
    """mask='soft' (the paper's): a useless verdict drops the hop from the belief but keeps the
    document listed, tagged; an open or an answer before the next search is malformed."""
    env = KGJudgeEnv(judge=True, mask="soft", **KW)
    first_seed(env, lambda e: e.task["hops"] == 1 and e.task["grounded"])
    e0, e1 = env.task["chain"]
    name = env.graph.names[e0]
    note = env.corpus.titles.index(f"Notes on {name}")
    own = int(env.corpus.entity_doc[e0])
    obs, r, done, info = env.step(f"search({name})")
    assert any(i == note for i, _ in env.last_results)  # the ranking lists the distractor
    env.step(f"open(d{note})")
    listed = list(env.last_results)
    obs, r, done, info = env.step("judge(useless)")
    assert info["valid"] and info["rejected_doc"] == note and env.believed == [e0] and r == 0.0
    assert env.last_results == listed and "search again" in obs  # nothing removed
    for call in (f"open(d{own})", f"answer({env.graph.names[e1]})"):
        turn, invalid = env.turn, env.num_invalid
        obs, r, done, info = env.step(call)  # the rule: search first
        assert not info["valid"] and r == -env.invalid_penalty and obs.startswith("Error")
        assert env.turn == turn + 1 and env.num_invalid == invalid + 1 and env.believed == [e0]
    obs, r, done, info = env.step(f"search({name})")
    assert info["valid"] and f"[d{note}] Notes on {name} (judged useless)" in obs
    assert f"[d{own}] {name} |" in obs + " |"  # the own document untagged
    obs, r, done, info = env.step(f"open(d{own})")
    assert info["valid"] and info["advanced"] and env.believed == [e0, e1]
    obs, r, done, info = env.step(f"answer({env.graph.names[e1]})")
    assert done and r == 1.0
    # the hard mask (the default) on the same calls: the document is gone, no rule
    hard = KGJudgeEnv(judge=True, **KW)
    hard.reset(env.task["seed"])
    hard.step(f"search({name})")
    hard.step(f"open(d{note})")
    hard.step("judge(useless)")
    assert all(i != note for i, _ in hard.last_results)
    assert hard.step(f"open(d{own})")[3]["valid"]


def test_soft_mask_menu_key_and_expert():
    menu = KGJudgeMenuEnv(judge=True, mask="soft", decoy_first=1.0, **KW)
    seed = first_seed(menu.env, lambda e: e.task["hops"] == 2 and e.task["grounded"])
    menu.reset(seed)
    assert len(menu.state_key()) == 6 and menu.state_key()[4:] == (False, False)
    for name in ["search_next", "open_top", "judge_useless"]:
        menu.step(name)
    assert menu.state_key()[4:] == (True, True)  # the tag on top, a search due
    assert menu.expert_actions() == ["search_next"]
    assert not menu.step("open_second")[3]["valid"]  # the rule holds on the menu too
    menu.step("search_next")
    assert menu.state_key()[4:] == (True, False)  # the same ranking: the tagged decoy on top
    assert menu.expert_actions() == ["open_second"]
    hard = KGJudgeMenuEnv(judge=True, decoy_first=1.0, **KW)
    hard.reset(seed)
    assert len(hard.state_key()) == 4  # the hard mask's key is unchanged
    # the expert with the soft mask solves a grounded question
    eps = play_episodes(lambda: KGJudgeMenuEnv(judge=True, mask="soft", decoy_first=1.0,
                                               **dict(KW, max_turns=20)),
                        lambda envs, obs: [e.actions.index(e.expert_actions()[0]) for e in envs],
                        [seed], 1)
    assert eps[0].success and all(i["valid"] for i in eps[0].infos)


def test_bad_mask():
    with pytest.raises(ValueError, match="mask"):
        KGJudgeEnv(mask="gentle", **KW)
