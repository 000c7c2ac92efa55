"""Text tasks, verifiable rewards and the SFT cache."""

import json

import pytest

from agentrl_lib.envs.program_synth import program_reward
from agentrl_lib.envs import text_tasks as tt
from agentrl_lib.rewards import (
    chain_step_reward,
    correctness_reward,
    countdown_reward,
    partial_credit_reward,
)
from agentrl_lib.rewards.verifiable import eval_expression


@pytest.mark.parametrize("task", list(tt.GENERATORS))
@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_reference_completions_earn_full_reward(task, difficulty):
    probs = tt.make_problems(task, 30, difficulty, strict=False)
    refs = [tt.reference_completion(p) for p in probs]
    cols = {k: [p.get(k) for p in probs] for k in probs[0]}
    if task == "program":  # judged by its unit tests, not by string match: any right program passes
        assert program_reward(refs, **cols) == [1.0] * len(probs)
        wrong = [p["tests"][0][1] for p in probs]  # the first output as a constant program
        assert program_reward([str(w) if 0 <= w <= 9 else "x" for w in wrong], **cols) == [0.0] * len(probs)
        assert program_reward([f"{r} dup drop" for r in refs], **cols, sandbox=False) == [1.0] * len(probs)
        assert all(len(r.split()) == difficulty for r in refs)
        return
    assert correctness_reward(refs if task != "countdown" else [p["answer"] for p in probs],
                              **cols) == [1.0] * len(probs)
    if task == "countdown":
        assert countdown_reward(refs, **cols) == [1.0] * len(probs)
    if task == "chain":
        assert chain_step_reward(refs, **cols) == [1.0] * len(probs)
        assert all(len(p["steps"]) == difficulty for p in probs)  # reasoning length grows


def test_answers_are_right():
    for p in tt.make_problems("arithmetic", 50, 2):
        assert str(eval_expression(p["prompt"].rstrip("="))) == p["answer"]
    for p in tt.make_problems("chain", 20, 4):
        assert p["values"][-1] == int(p["answer"])


def test_splits_are_disjoint_and_panels_fixed():
    train = {p["prompt"] for p in tt.make_problems("arithmetic", 1000, 3)}
    test = {p["prompt"] for p in tt.make_problems("arithmetic", 300, 3, split="test")}
    assert not train & test
    a, ha = tt.eval_panel("chain", 50, 3)
    b, hb = tt.eval_panel("chain", 50, 3)
    assert a == b and ha == hb and ha != tt.eval_panel("chain", 50, 2)[1]
    assert all(tt.split_of(p["prompt"]) == "test" for p in a)
    assert 0.15 < sum(tt.split_of(f"{i}+{i}=") == "test" for i in range(5000)) / 5000 < 0.25


def test_bad_requests():
    with pytest.raises(ValueError, match="unknown task 'poetry'"):
        tt.make_problems("poetry", 3)
    with pytest.raises(ValueError, match="distinct train problems"):
        tt.make_problems("arithmetic", 10_000, 1)
    assert len(tt.make_problems("arithmetic", 10_000, 1, strict=False)) < 300
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        eval_expression("2**10")


def test_partial_credit_bounds():
    r = partial_credit_reward(["-12", "12", "999", "1200"], answer=["12"] * 4)
    assert r[1] == 1.0 and all(0.0 <= x < 1.0 for i, x in enumerate(r) if i != 1)


def test_sft_cache_trains_once_and_rebuilds_corrupt_entries(tmp_path, monkeypatch, capsys):
    from agentrl_lib.algorithms import sft

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    cfg = sft.SFTConfig(steps=3, num_problems=40, batch_size=8)
    path = sft.checkpoint(cfg, verbose=True)
    assert "training the SFT base model" in capsys.readouterr().out
    assert (path / "config.json").is_file() and not list(path.parent.glob("*.tmp*"))
    assert sft.checkpoint(cfg) == path and "training" not in capsys.readouterr().out
    (path / "config.json").write_text("{not json")
    sft.checkpoint(cfg, verbose=True)
    assert "is unusable" in capsys.readouterr().out
    model, tok = sft.load_base(cfg, verbose=False)
    assert json.loads((path / "agentrl_sft.json").read_text())["config"]["steps"] == 3
    other = sft.SFTConfig(steps=4, num_problems=40, batch_size=8)
    assert sft.config_key(other) != sft.config_key(cfg)
