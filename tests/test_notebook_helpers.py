"""The helpers every notebook shares: params_from, verdict, the claims printout, the lr rule, and
exact success by DP."""

import json
from itertools import product

import nbformat
import pytest
import torch

from agentrl_lib.algorithms import dp
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.pipeline.results import (
    claim, claim_line, params_from, print_claims, verdict, write_results,
)
from agentrl_lib.pipeline.tuning import pick_lr

PARAMS = 'seed: int = 0  # seed\nprofile: str = "ci"  # profile\nlr: float = 0.1  # step\n'


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A notebook 00_toy.ipynb declaring seed, profile and lr, in the working directory."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(PARAMS)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nbformat.write(nb, tmp_path / "00_toy.ipynb")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTRL_NOTEBOOK", raising=False)
    monkeypatch.setenv("AGENTRL_RUN_DIR", str(tmp_path / "run"))
    return tmp_path


def test_params_from_reads_every_declared_name_in_order(toy):
    ns = {"NOTEBOOK": "00_toy", "lr": 0.3, "profile": "cpu", "seed": 2, "other": 1}
    assert list(params_from(ns).items()) == [("seed", 2), ("profile", "cpu"), ("lr", 0.3)]
    with pytest.raises(LookupError, match=r"not defined: \['lr'\]"):
        params_from({"seed": 0, "profile": "ci"}, "00_toy")
    with pytest.raises(LookupError, match="cannot find"):
        params_from({"seed": 0}, "01_missing")


def test_a_declared_parameter_missing_from_results_params_is_an_error(toy):
    c = [claim("c", "s", "m", 1, 0, ">", kind="sanity")]
    with pytest.raises(ValueError, match=r"lacks declared parameters \['lr'\]"):
        write_results("00_toy", {"seed": 0, "profile": "ci"}, {"m": 1.0}, c)
    # the file is written first, so the run's numbers survive the error
    assert json.loads((toy / "run" / "results.json").read_text())["metrics"] == {"m": 1.0}
    path = write_results("00_toy", params_from({"seed": 0, "profile": "ci", "lr": 0.1}, "00_toy"),
                         {"m": 1.0}, c)
    assert json.loads(path.read_text())["params"] == {"seed": 0, "profile": "ci", "lr": 0.1}


def test_verdict_wordings():
    held = claim("a", "s", "m", 1, 0, ">", kind="paper")
    lost = claim("b", "s", "m", 0, 1, ">", kind="paper", asserted=False)
    assert verdict(held) == "holds (asserted)"
    assert verdict(lost) == "does not hold (reported, not asserted)"
    assert verdict(held, note="unasserted") == "holds"
    assert verdict(lost, failed="does **not** hold", note=None) == "does **not** hold"
    assert verdict(lost, reported="reported") == "does not hold (reported)"
    with pytest.raises(ValueError):
        verdict(held, note="sometimes")


def test_claims_printout(capsys):
    c = claim("agree", "s", "acc", 0.52, 0.5, "~", margin=0.05, kind="paper", control=0.3,
              post_hoc=True, paper_id="aepo")
    none = claim("bar", "s", "acc", 0.5, None, ">=", kind="design", asserted=False)
    print_claims([c, none])
    out = capsys.readouterr().out.splitlines()
    assert out == [claim_line(c), claim_line(none)]
    assert out[0] == ("[HOLDS] (asserted, paper of aepo, post hoc) agree: acc: ours=0.52 ~ "
                      "baseline=0.5 (margin 0.05); control=0.3 (fails, as it must)")
    assert out[1] == "[fails] (reported, design) bar: acc: ours=0.5 >= baseline=None (margin 0)"


def test_pick_lr_highest_mean_ties_to_the_smaller_lr():
    assert pick_lr({0.1: [0.5, 0.7], 0.3: [0.9, 0.1]}) == 0.1  # means 0.6 and 0.5
    assert pick_lr({0.3: [0.4, 0.6], 0.1: [0.6, 0.4], 1.0: [0.2, 0.2]}) == 0.1  # a tie
    assert pick_lr({0.3: 1.0, 0.1: 2.0}, higher_is_better=False) == 0.3
    assert pick_lr({0.1: [float("nan")], 0.01: [0.0]}) == 0.01  # a diverged lr is not picked
    with pytest.raises(ValueError):
        pick_lr({})


def test_success_within_equals_brute_force_and_the_per_turn_form():
    env = GridAgentEnv(["..."], tasks=[((0, 0), (0, 2))], max_turns=8)
    mdp = env.tabular_form((0, 0), (0, 2))
    uniform = torch.full((3, 4), 0.25, dtype=torch.float64)
    for h in range(1, 5):  # every sequence of h moves, each with probability 4^-h
        hits = 0
        for seq in product(env.actions, repeat=h):
            e = GridAgentEnv(["..."], tasks=[((0, 0), (0, 2))], max_turns=h)
            e.reset(seed=0)
            for a in seq:
                _, r, done, _ = e.step(a)
                if done:
                    hits += r > 0
                    break
        assert dp.success_within(mdp, uniform, h) == pytest.approx(hits / 4 ** h, abs=1e-12)
        # a per-turn table equal at every turn gives the same number, to the bit
        assert dp.success_within(mdp, uniform.expand(h, 3, 4), h) == dp.success_within(mdp,
                                                                                   uniform, h)
