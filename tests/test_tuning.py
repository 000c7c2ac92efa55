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


def test_a_change_of_the_notebook_code_tunes_again(monkeypatch, tmp_path):
    from agentrl_lib.pipeline.tuning import notebook_code_hash

    run = tmp_path / "cpu" / "nb" / "seed0"
    run.mkdir(parents=True)
    monkeypatch.setenv("AGENTRL_RUN_DIR", str(run))

    def write(code, seed_line):
        cells = [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": "seed = 0"},
                 {"cell_type": "code", "metadata": {"tags": ["injected-parameters"]},
                  "source": seed_line},
                 {"cell_type": "code", "metadata": {}, "source": code}]
        (run / "nb.ipynb").write_text(json.dumps({"cells": cells}))

    write("x = 1", "seed = 0")
    h0 = notebook_code_hash("nb")
    write("x = 1", "seed = 1")  # another seed's injected parameters: the same code
    assert notebook_code_hash("nb") == h0 != ""
    calls = []
    params = {"seed": 0, "lrs": [0.1, 0.3]}
    shared_tuning("nb", params, lambda: calls.append(1) or {"best": 0.1})
    write("x = 2", "seed = 0")  # the code changed: tune again
    assert notebook_code_hash("nb") != h0
    shared_tuning("nb", params, lambda: calls.append(1) or {"best": 0.1})
    assert len(calls) == 2


def test_pick_setting_is_pick_lr_on_numbers_and_takes_lr_beta_pairs():
    from agentrl_lib.pipeline.tuning import pick_setting

    rng = np.random.default_rng(0)
    for _ in range(50):  # the same rule as pick_lr on an lr sweep, ties and NaNs included
        scores = {lr: list(rng.choice([0.1, 0.2, np.nan], size=2)) for lr in (0.03, 0.1, 0.3)}
        assert pick_setting(scores) == pick_lr(scores)
        assert pick_setting(scores, higher_is_better=False) == \
            pick_lr(scores, higher_is_better=False)
    grid = {(0.1, 0.1): [0.6, 0.8], (0.03, 0.5): [0.7, 0.7], (0.1, 0.5): [0.9, 0.5]}
    assert pick_setting(grid) == (0.03, 0.5)  # the means tie at 0.7: the smaller lr
    assert pick_setting({**grid, (0.3, 0.1): [0.8]}) == (0.3, 0.1)
    assert pick_setting({(0.1, 0.1): [np.nan], (0.3, 0.1): [0.0]}) == (0.3, 0.1)


def test_tune_arms_over_lr_beta_pairs(monkeypatch, tmp_path):
    from agentrl_lib.pipeline.tuning import tune_arms

    def score(arm, setting, s):  # a peaks at (0.1, 0.5), b at (0.3, 0.1)
        assert isinstance(setting, tuple)
        return -abs(setting[0] - (0.1 if arm == "a" else 0.3)) - abs(
            setting[1] - (0.5 if arm == "a" else 0.1))

    grid = [(lr, b) for lr in (0.1, 0.3) for b in (0.1, 0.5)]
    params = dict(_at_seed(monkeypatch, tmp_path, 0), grid=grid)
    first = tune_arms("nb", params, ["a", "b"], grid, [100], score, name="grid")
    read = tune_arms("nb", dict(_at_seed(monkeypatch, tmp_path, 1), grid=grid), ["a", "b"], grid,
                     [100], score, name="grid")  # through the JSON cache: tuples again
    for out in (first, read):
        assert out["picks"] == {"a": (0.1, 0.5), "b": (0.3, 0.1)}
    assert not first["cached"] and read["cached"]
    assert set(first["scores"]) == {f"{a}@{lr:g},{b:g}@100" for a in "ab" for lr, b in grid}
    assert first["scores"]["a@0.1,0.5@100"] == 0.0
    assert tune_arms("nb", params, ["a"], [[0.1, 0.5]], [], score)["picks"] == {"a": (0.1, 0.5)}
