"""TensorBoard logs of the training loops (``agentrl_lib.tblog``): the event files are really
written and read back with tensorboard's own reader; every scalar equals its row of
metrics.jsonl, and the turn-by-turn table of each evaluation is there."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_lib import tblog
from agentrl_lib.algorithms import agent_pg
from agentrl_lib.algorithms.agent_pg import AgentPGConfig
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.policies import KeyTablePolicy
from agentrl_lib.utils import MetricsLogger

LAYOUT = ["....", ".#..", "...."]


def make_env():
    return GridAgentEnv(LAYOUT, tasks=[((0, 0), (2, 3)), ((2, 0), (0, 3))], max_turns=6)


def _read(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _train(tmp_path, **cfg_kw):
    pol = KeyTablePolicy(4, seed=0)
    cfg = AgentPGConfig(num_prompts=2, group_size=2, num_iters=4, eval_every=2, lr=0.1, **cfg_kw)
    log = MetricsLogger(tmp_path)
    evaluate = lambda p: agent_pg.evaluate(make_env, p, [100, 101])  # noqa: E731
    rows = agent_pg.train(make_env, pol, cfg, list(range(8)), evaluate=evaluate, logger=log)
    return rows, [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_scalars_equal_the_rows_and_the_turn_table_is_there(tmp_path):
    pytest.importorskip("tensorboard")
    rows, jsonl = _train(tmp_path, report_to="tensorboard", logging_dir=str(tmp_path / "tb"))
    runs = sorted((tmp_path / "tb").iterdir())
    assert [r.name for r in runs] == ["agent_pg_0"]
    acc = _read(runs[0])
    tags = set(acc.Tags()["scalars"])
    want = {}
    for row in jsonl:
        for k, v in tblog.scalars({k: v for k, v in row.items() if k != "time_s"}).items():
            want.setdefault(k, []).append((row["iter"], v))
    assert tags == set(want), (tags ^ set(want))
    assert "eval/success" in tags and "losses/loss" in tags
    for tag, pairs in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in pairs], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in pairs], rel=1e-6), tag
    texts = acc.Tensors("rollouts/turns/text_summary")  # add_text appends the suffix
    eval_iters = [r["iter"] for r in rows if "eval/success" in r and r["iter"] > 0]
    assert [t.step for t in texts] == eval_iters == [2, 4]
    table = texts[0].tensor_proto.string_val[0].decode()
    assert "| turn | observation | action | reward | valid |" in table and "**episode 0**" in table


def test_off_by_default_and_rows_unchanged(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTRL_REPORT_TO", raising=False)
    monkeypatch.chdir(tmp_path)
    rows_off, _ = _train(tmp_path / "a")
    assert not (tmp_path / "runs").exists()  # nothing written without report_to
    pytest.importorskip("tensorboard")
    rows_on, _ = _train(tmp_path / "b", report_to="tensorboard")
    assert (tmp_path / "runs" / "tensorboard" / "agent_pg_0").is_dir()
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")}  # noqa: E731
                        for r in rs]
    assert strip(rows_on) == strip(rows_off)  # logging changes no number


def test_environment_switch_and_bad_value(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_REPORT_TO", "tensorboard")
    monkeypatch.setenv("AGENTRL_RUN_DIR", str(tmp_path))
    assert tblog.resolve_report_to(None) == "tensorboard"
    assert tblog.resolve_report_to("none") == "none"  # the config's own value wins
    assert tblog.resolve_logging_dir(None, "grpo") == tmp_path / "tensorboard" / "grpo_0"
    (tmp_path / "tensorboard" / "grpo_0").mkdir(parents=True)
    assert tblog.resolve_logging_dir(None, "grpo").name == "grpo_1"
    with pytest.raises(ValueError, match="report_to"):
        tblog.resolve_report_to("wandb")


def test_cli_has_report_to():
    out = subprocess.run([sys.executable, "-m", "agentrl_lib.cli", "run", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--report-to" in out
