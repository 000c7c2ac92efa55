"""reasoning-gym as a task source (``envs.rgym``) and its verifier as a reward in TRL's signature
(``rewards.rgym``): seeded generation, a disjoint split, a fixed panel, curriculum levels, the
reward equal to reasoning-gym's own ``score_answer``, the tokenizer's coverage, one TRL step."""

import json
import os
import tempfile

import pytest

pytest.importorskip("reasoning_gym", reason="the optional extra agentrl[envs]")

from agentrl_lib.envs import rgym  # noqa: E402
from agentrl_lib.envs.text_tasks import split_of  # noqa: E402
from agentrl_lib.rewards.rgym import answer_text, rgym_reward  # noqa: E402

TASKS = rgym.TOKENIZER_TASKS


def columns(problems):
    """The keyword lists TRL hands a reward function: one per data set column."""
    return {k: [p[k] for p in problems] for k in problems[0]}


@pytest.mark.parametrize("name", TASKS)
def test_generation_is_seeded_and_deterministic(name):
    a = rgym.make_problems(name, 30, 1, seed=4)
    assert a == rgym.make_problems(name, 30, 1, seed=4)
    assert [p["prompt"] for p in a] != [p["prompt"] for p in rgym.make_problems(name, 30, 1, seed=5)]
    assert len({p["prompt"] for p in a}) == 30
    assert all(p["task"] == name and p["difficulty"] == 1 for p in a)


@pytest.mark.parametrize("name", TASKS)
def test_split_is_disjoint_and_the_panel_fixed(name):
    train = rgym.make_problems(name, 300, 2)
    test = rgym.make_problems(name, 100, 2, split="test")
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in test}
    assert {split_of(p["prompt"]) for p in train} == {"train"}
    assert {split_of(p["prompt"]) for p in test} == {"test"}
    panel, h = rgym.eval_panel(name, 40, 2)
    assert (panel, h) == rgym.eval_panel(name, 40, 2) and len(h) == 16 and int(h, 16) >= 0
    assert h != rgym.eval_panel(name, 40, 3)[1] and {split_of(p["prompt"]) for p in panel} == {"test"}


def test_levels_come_from_the_curriculum_and_cfg_overrides_them():
    c1 = rgym.make_config("chain_sum", 1)
    assert (c1.min_terms, c1.max_terms, c1.min_digits, c1.max_digits) == (2, 3, 1, 2)
    assert rgym.make_config("chain_sum", 1, max_digits=5).max_digits == 5
    assert rgym.make_config("chain_sum", 99).max_terms == 12  # capped at the last level
    assert rgym.num_levels("chain_sum") == 11
    for p in rgym.make_problems("chain_sum", 50, 0):  # level 0: two one-digit terms
        assert all(len(t) == 1 for t in json.loads(p["entry"])["metadata"]["expression"].split()
                   if t not in "+-")
    pools = rgym.curriculum_problems("chain_sum", 50, [0, 3])
    assert pools[0] == rgym.make_problems("chain_sum", 50, 0)
    long = pools[3]
    assert max(json.loads(p["entry"])["metadata"]["num_terms"] for p in long) > 2


@pytest.mark.parametrize("name", TASKS)
def test_reward_is_score_answer_on_right_and_wrong_answers(name):
    from reasoning_gym.factory import DATASETS

    probs = rgym.make_problems(name, 20, 1)
    ref = DATASETS[name][0](config=rgym.make_config(name, 1))
    entries = [json.loads(p["entry"]) for p in probs]
    right = [p["answer"] for p in probs]
    wrong = [str(int(p["answer"]) + 1) for p in probs]
    for texts in (right, wrong):
        expected = [ref.score_answer(t, e) for t, e in zip(texts, entries)]
        assert rgym_reward(texts, **columns(probs)) == expected
    assert rgym_reward(right, **columns(probs)) == [1.0] * 20
    assert rgym_reward(wrong, **columns(probs)) == [0.0] * 20
    # the answer is cut out of the completion before scoring; other text earns nothing
    tagged = [f"thinking...\n<answer>{a}</answer>" for a in right]
    assert rgym_reward(tagged, **columns(probs)) == [1.0] * 20
    assert rgym_reward([f"12+3=15\nanswer {a}" for a in right], **columns(probs)) == [1.0] * 20
    assert rgym_reward(["", "no idea"] * 10, **columns(probs)) == [0.0] * 20


def test_the_trl_signature_takes_lists_and_conversations():
    probs = rgym.make_problems("chain_sum", 4, 1)
    convs = [[{"role": "assistant", "content": p["answer"]}] for p in probs]
    assert rgym_reward(convs, **columns(probs), completion_ids=[[0]] * 4) == [1.0] * 4
    mixed = [probs[0]["answer"], "0" if probs[1]["answer"] != "0" else "1"] + convs[2:]
    assert rgym_reward(mixed, **columns(probs)) == [1.0, 0.0, 1.0, 1.0]
    # entry dicts work as well as the JSON the problems carry
    cols = {**columns(probs), "entry": [json.loads(p["entry"]) for p in probs]}
    assert rgym_reward([p["answer"] for p in probs], **cols) == [1.0] * 4
    assert answer_text("<answer>a</answer> <answer> b </answer>") == "b"


def test_worked_solution_checks_every_step():
    """The working of chain_sum and of basic_arithmetic in its chain form: each line a true step
    from the last line's value, the answer line the entry's answer; by hand on one case."""
    assert rgym.worked_solution({"answer": "-2", "entry": json.dumps(
        {"metadata": {"expression": "1 + 4 - 7"}})}) == "1+4=5\n5-7=-2\nanswer -2"
    for name in ("chain_sum", "basic_arithmetic"):
        for level in range(4):
            cfg = {"min_digits": 1, "max_digits": 1, **rgym.CHAIN_FORM.get(name, {})}
            for p in rgym.make_problems(name, 40, level, strict=False, **cfg):
                *steps, last = rgym.worked_solution(p).split("\n")
                assert last == f"answer {p['answer']}"
                value = None
                for line in steps:
                    lhs, rhs = line.split("=")
                    a, op, b = (lhs[:1] + lhs[1:].replace("-", " - ", 1).replace("+", " + ", 1)
                                ).split()
                    assert value is None or int(a) == value
                    value = int(a) + int(b) if op == "+" else int(a) - int(b)
                    assert value == int(rhs)
                assert str(value) == p["answer"]
    bad = rgym.make_problems("basic_arithmetic", 20, 2, min_digits=1, max_digits=1)
    with pytest.raises(ValueError, match="not a left-to-right sum"):
        [rgym.worked_solution(p) for p in bad]  # products, parentheses, negated terms


def test_the_tokenizer_covers_the_chosen_tasks():
    from agentrl_lib.models.tiny_lm import load_tokenizer

    tok = load_tokenizer("bpe")
    for name in TASKS:
        probs = rgym.make_problems(name, 50, 1)
        cov = rgym.coverage(tok, [p["prompt"] for p in probs] + [p["answer"] for p in probs])
        assert cov["unknown"] == 0 and cov["non_ascii"] == 0, (name, cov)
        assert all(p["answer"].lstrip("-").isdigit() for p in probs)
    cov = rgym.coverage(tok, ["héllo ☃"])
    assert cov["non_ascii"] == 2 and cov["unknown"] == 0  # byte-level: nothing is dropped


def test_bad_requests():
    with pytest.raises(ValueError, match="unknown reasoning-gym task"):
        rgym.make_problems("poetry", 3)
    with pytest.raises(ValueError, match="split must be"):
        rgym.make_problems("chain_sum", 3, split="dev")
    with pytest.raises(ValueError, match="level must be"):
        rgym.make_config("chain_sum", -1)
    with pytest.raises(ValueError, match="only .* distinct"):
        rgym.make_problems("chain_sum", 100, 0, split="test")  # 200 prompts, about 40 held out
    assert len(rgym.make_problems("chain_sum", 100, 0, split="test", strict=False)) < 100


def test_one_trl_grpo_step_scores_with_score_answer():
    """A real GRPOTrainer step on reasoning-gym problems: the entry column survives the data set,
    TRL calls the reward with its keyword lists, and the reward is logged."""
    pytest.importorskip("trl")
    from agentrl_lib.algorithms import trl_adapter
    from agentrl_lib.algorithms.grpo import GRPOConfig
    from agentrl_lib.models.tiny_lm import new_model

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    model, tok = new_model("tiny-64", seed=0)
    probs = rgym.make_problems("chain_sum", 16, 0)
    calls = []

    def spy(completions, **kw):
        calls.append((completions, kw))
        return rgym_reward(completions, **kw)

    cfg = GRPOConfig(num_prompts=2, group_size=2, num_iters=1, max_new_tokens=4, lr=1e-3)
    trainer = trl_adapter.make_trainer(model, tok, probs, [spy], cfg, tempfile.mkdtemp())
    trainer.train()
    assert trainer.state.global_step == 1 and len(calls) == 1
    completions, kw = calls[0]
    assert len(completions) == 4 and {"task", "entry", "answer"} <= set(kw)
    assert [json.loads(e)["answer"] for e in kw["entry"]] == kw["answer"]
    assert any("rewards/spy/mean" in r for r in trainer.state.log_history)
