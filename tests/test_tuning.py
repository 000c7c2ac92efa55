"""The shared tuning pass (pipeline.tuning.shared_tuning): run once, read by the other seeds."""

import json

import numpy as np
import pytest
import torch

from agentrl_lib.pipeline.tuning import pick_lr, shared_tuning


def _at_seed(monkeypatch, tmp_path, seed):
    monkeypatch.setenv("AGENTRL_RUN_DIR", str(tmp_path / "cpu" / "nb" / f"seed{seed}"))
    return {"seed": seed, "lrs": [0.1, 0.3], "budget": 5}


def test_one_pass_shared_by_every_seed_and_rerun_on_a_change(monkeypatch, tmp_path):
    calls = []

    def compute():
        calls.append(1)
        scores = {lr: [float(np.random.rand())] for lr in (0.1, 0.3)}  # draws from the global rng
        return {"scores": {str(k): v for k, v in scores.items()}, "best": pick_lr(scores)}

    first = shared_tuning("nb", _at_seed(monkeypatch, tmp_path, 0), compute)
    second = shared_tuning("nb", _at_seed(monkeypatch, tmp_path, 1), compute)
    assert len(calls) == 1 and not first["cached"] and second["cached"]
    assert {k: v for k, v in first.items() if k != "cached"} == \
        {k: v for k, v in second.items() if k != "cached"}
    changed = dict(_at_seed(monkeypatch, tmp_path, 2), budget=6)  # another budget: tune again
    shared_tuning("nb", changed, compute)
    assert len(calls) == 2


def test_random_state_is_the_same_whether_it_ran_or_was_read(monkeypatch, tmp_path):
    def compute():
        np.random.rand(5), torch.rand(5)
        return {"best": 0.1}

    outcomes = []
    for seed in (0, 1):  # seed 0 runs the pass, seed 1 reads it
        np.random.seed(7), torch.manual_seed(7)
        shared_tuning("nb", _at_seed(monkeypatch, tmp_path, seed), compute)
        outcomes.append((np.random.rand(), torch.rand(1).item()))
    assert outcomes[0] == outcomes[1]


def test_a_corrupt_cache_is_tuned_again(monkeypatch, tmp_path, capsys):
    params = _at_seed(monkeypatch, tmp_path, 0)
    shared_tuning("nb", params, lambda: {"best": 0.1})
    (path,) = (tmp_path / "cpu" / "nb" / "tuning").glob("lr-*.json")
    path.write_text("{not json")
    out = shared_tuning("nb", params, lambda: {"best": 0.3})
    assert out == {"best": 0.3, "cached": False} and "corrupt" in capsys.readouterr().out
    assert json.loads(path.read_text()) == {"best": 0.3}


def test_a_result_that_is_not_json_fails_and_caches_nothing(monkeypatch, tmp_path):
    params = _at_seed(monkeypatch, tmp_path, 0)
    with pytest.raises(TypeError):
        shared_tuning("nb", params, lambda: {(0.1, 100): 0.5})  # tuple keys: not JSON
    assert not list((tmp_path / "cpu" / "nb" / "tuning").glob("*.json"))


def test_tune_arms_picks_per_arm_with_the_same_sweep(monkeypatch, tmp_path):
    from agentrl_lib.pipeline.tuning import tune_arms

    seen = []

    def score(arm, lr, s):  # arm a peaks at lr 0.3, arm b at 0.1
        seen.append((arm, lr, s))
        return -abs(lr - (0.3 if arm == "a" else 0.1))

    params = _at_seed(monkeypatch, tmp_path, 0)
    out = tune_arms("nb", params, ["a", "b"], [0.1, 0.3], [100, 101], score)
    assert out["picks"] == {"a": 0.3, "b": 0.1} and len(seen) == 8
    assert set(seen) == {(a, lr, s) for a in "ab" for lr in (0.1, 0.3) for s in (100, 101)}
    assert tune_arms("nb", params, ["a"], [0.2], [], score) == \
        {"scores": {}, "picks": {"a": 0.2}, "cached": False}  # one lr: no tuning run
    assert len(seen) == 8
    with pytest.raises(ValueError, match="tuning seeds"):
        tune_arms("nb", params, ["a"], [0.1, 0.3], [], score)
