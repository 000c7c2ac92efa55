"""The pipeline: parameter parsing and checking, profiles, runs with papermill, results, report."""

import json

import nbformat
import pytest

from agentrl_lib import cli
from agentrl_lib.pipeline import notebooks as nbs
from agentrl_lib.pipeline.report import summarise
from agentrl_lib.pipeline.results import assert_claims, claim, write_results

PARAMS = '''seed: int = 0  # random seed
profile: str = "ci"  # profile
lr: float = 0.1  # learning rate
steps: int = 3  # number of steps
fail_at: int = -1  # raise in the work cell when steps reaches this
tags: list = ["a"]  # some tags
sleep_s: float = 0.0  # seconds to sleep in the work cell
'''

WORK = '''
from agentrl_lib.pipeline.results import claim, write_results, assert_claims, params_from
import json, os, time
time.sleep(sleep_s)
total = sum(range(steps)) * lr
if fail_at == steps:
    raise RuntimeError("boom at the work cell")
claims = [claim("positive", "total is positive", "total", total, 0.0, ">",
                kind="sanity")]
write_results("00_toy", params_from(globals(), "00_toy"), {"total": total}, claims)
assert_claims(claims)
'''


def make_repo(tmp_path, profiles_yaml="cpu:\n  steps: 5\n"):
    (tmp_path / "agentrl_lib").mkdir()
    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell(PARAMS)
    p.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# toy"), p, nbformat.v4.new_code_cell(WORK)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["agentrl"] = {"title": "Toy", "paper": "A paper", "url": "https://example.org"}
    nbformat.write(nb, tmp_path / "notebooks" / "00_toy.ipynb")
    if profiles_yaml is not None:
        (tmp_path / "reproductions" / "00_toy").mkdir(parents=True)
        (tmp_path / "reproductions" / "00_toy" / "profiles.yaml").write_text(profiles_yaml)
    return tmp_path


def test_parse_parameters():
    ps = nbs.parse_parameters(PARAMS)
    assert list(ps) == ["seed", "profile", "lr", "steps", "fail_at", "tags", "sleep_s"]
    assert ps["lr"].type == "float" and ps["lr"].default == 0.1 and ps["lr"].help == "learning rate"
    assert ps["tags"].default == ["a"]
    assert nbs.parse_parameters("x = 3  # inferred\n")["x"].type == "int"
    with pytest.raises(nbs.PipelineError, match="must be a literal"):
        nbs.parse_parameters("x: int = len([1])\n")
    with pytest.raises(nbs.PipelineError, match="expects int"):
        nbs.parse_parameters("x: int = 1.5\n")
    with pytest.raises(nbs.PipelineError, match="only `name: type = literal`"):
        nbs.parse_parameters("import os\n")
    with pytest.raises(nbs.PipelineError, match="not one of"):
        nbs.parse_parameters("x: tuple = (1,)\n")


def test_cli_value_types():
    assert nbs.parse_cli_value("lr", "float", "1e-3") == 1e-3
    assert nbs.parse_cli_value("f", "bool", "false") is False
    assert nbs.parse_cli_value("t", "list", "[1, 2]") == [1, 2]
    for tname, text in [("int", "1.5"), ("bool", "maybe"), ("list", "{a: 1}"), ("float", "x")]:
        with pytest.raises(nbs.PipelineError, match=f"expects {tname}"):
            nbs.parse_cli_value("p", tname, text)
    with pytest.raises(nbs.PipelineError, match="expects int"):
        nbs.check_value("p", "int", True)  # a bool is not an int


def test_resolve_params_precedence_and_errors(tmp_path):
    root = make_repo(tmp_path)
    info = nbs.load_notebook(root / "notebooks" / "00_toy.ipynb", root)
    assert nbs.resolve_params(info, "ci", 3)["steps"] == 3
    cpu = nbs.resolve_params(info, "cpu", 1, [("lr", "0.5")])
    assert (cpu["steps"], cpu["lr"], cpu["seed"], cpu["profile"]) == (5, 0.5, 1, "cpu")
    with pytest.raises(nbs.PipelineError, match="unknown parameter 'lrr'"):
        nbs.resolve_params(info, "ci", 0, [("lrr", "1")])
    with pytest.raises(nbs.PipelineError, match="has no 'gpu' profile"):
        nbs.resolve_params(info, "gpu", 0)
    with pytest.raises(nbs.PipelineError, match="unknown profile 'tpu'"):
        nbs.resolve_params(info, "tpu", 0)


def test_bad_profiles_file(tmp_path):
    root = make_repo(tmp_path, "cpu:\n  stepz: 5\n")
    with pytest.raises(nbs.PipelineError, match="unknown parameter 'stepz'"):
        nbs.load_notebook(root / "notebooks" / "00_toy.ipynb", root)
    (root / "reproductions/00_toy/profiles.yaml").write_text("cpu:\n  steps: many\n")
    with pytest.raises(nbs.PipelineError, match="'steps' expects int"):
        nbs.load_notebook(root / "notebooks" / "00_toy.ipynb", root)
    for text in ("cpu: steps: 5\n", "- cpu\n", "cpu:\n  - 5\n"):  # not mappings
        (root / "reproductions/00_toy/profiles.yaml").write_text(text)
        with pytest.raises(nbs.PipelineError, match="profiles.yaml"):
            nbs.load_notebook(root / "notebooks" / "00_toy.ipynb", root)


def test_malformed_yaml_is_one_clear_line(tmp_path, monkeypatch, capsys):
    """A malformed profiles.yaml or grid names the file, the line and what is wrong, in one line
    and exit code 2, before anything runs; no parser traceback."""
    root = make_repo(tmp_path, "cpu:\n  steps: [5\n  lr: 0.1\n")
    monkeypatch.chdir(root)
    assert cli.main(["run", "00", "--profile", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "profiles.yaml:3:5: malformed YAML" in err and "flow sequence that starts at line 2" in err
    (root / "reproductions/00_toy/profiles.yaml").write_text("cpu:\n  steps: 5\n")
    grid = root / "bad.yaml"
    grid.write_text("lr: [0.1\nsteps: [1]\n")
    assert cli.main(["reproduce", "00", "--grid", str(grid), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"agentrl: error: {grid}:2:6: malformed YAML: expected ',' or ']', but got ':' "
                   f"(while parsing a flow sequence that starts at line 1)")
    assert not (root / "runs").exists()


def test_find_notebook(tmp_path):
    root = make_repo(tmp_path)
    assert nbs.find_notebook("00", root).stem == "00_toy"
    with pytest.raises(nbs.PipelineError, match="unknown notebook 'zz'; known notebooks: 00_toy"):
        nbs.find_notebook("zz", root)


def test_claim_directions():
    k = {"kind": "sanity"}
    assert claim("a", "", "m", 1.0, 0.5, ">", margin=0.4, **k).holds
    assert not claim("a", "", "m", 1.0, 0.5, ">", margin=0.6, **k).holds
    assert claim("a", "", "m", 0.1, 0.5, "<", **k).holds
    assert claim("a", "", "m", 475.0, 475.0, ">=", **k).holds
    assert not claim("a", "", "m", float("nan"), 1.0, "<=", **k).holds
    assert claim("a", "", "m", 0.55, 0.5, "~", margin=0.1, **k).holds
    with pytest.raises(ValueError, match="unknown direction"):
        claim("a", "", "m", 1, 1, "!=", **k)
    with pytest.raises(ValueError, match="unknown claim kind"):
        claim("a", "", "m", 1, 1, ">", kind="hunch")
    failing = [claim("ok", "", "m", 1, 0, ">", **k), claim("bad", "s", "m", 0, 1, ">", **k),
               claim("skip", "", "m", 0, 1, ">", asserted=False, **k)]
    with pytest.raises(AssertionError, match="bad: s") as e:
        assert_claims(failing)
    assert "skip" not in str(e.value)


def test_write_results_is_complete_and_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_RUN_DIR", str(tmp_path / "r"))
    path = write_results("nb", {"seed": 4, "profile": "cpu"}, {"m": 1.0, "curve": [3, 2.5]},
                         [claim("c", "s", "m", 1, 0, ">", paper_value=3, kind="paper")])
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"series": "curve", "index": 0, "value": 3},
                    {"series": "curve", "index": 1, "value": 2.5}, {"final": {"m": 1.0}}]
    r = json.loads(path.read_text())
    for key in ("notebook", "paper", "profile", "seed", "params", "metrics", "claims", "versions",
                "device", "wall_s", "git_commit"):
        assert key in r
    assert r["seed"] == 4 and r["claims"][0]["holds"] is True and "torch" in r["versions"]
    assert not list((tmp_path / "r").glob("*.tmp"))
    # the device names torch's CPU kernel set: runs repeat bit for bit only on the same one
    import torch
    if not torch.cuda.is_available():
        assert r["device"].startswith("cpu: ")
        assert f" {torch.backends.cpu.get_cpu_capability()}, " in r["device"]


def test_run_ok_fail_and_report(tmp_path, monkeypatch, capsys):
    root = make_repo(tmp_path)
    monkeypatch.chdir(root)
    assert cli.main(["run", "00", "--seed", "1", "--seed", "2", "--quiet"]) == 0
    r1 = json.loads((root / "runs/ci/00_toy/seed1/results.json").read_text())
    assert r1["metrics"]["total"] == pytest.approx(0.3) and r1["paper"]["title"] == "A paper"
    assert (root / "runs/ci/00_toy/seed1/00_toy.ipynb").is_file()

    # a failing cell: the run fails, names the cell, keeps the executed notebook; the finished
    # run already in the folder is kept as it was (nothing computed is lost), and the failed
    # re-run beside it, where the report lists it
    d = root / "runs/ci/00_toy/seed1"
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    rc = cli.main(["run", "00", "--seed", "1", "-p", "fail_at", "3", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 1 and "RuntimeError: boom at the work cell" in out and "cell" in out
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    kept = root / "runs/ci/00_toy/.seed1.failed"
    assert json.loads((kept / "run.json").read_text())["ok"] is False
    assert (kept / "00_toy.ipynb").is_file() and not (kept / "results.json").exists()

    # a claim that fails: results.json is still written (nothing computed is lost)
    rc = cli.main(["run", "00", "--seed", "3", "-p", "lr", "-1.0", "--quiet"])
    assert rc == 1
    r3 = json.loads((root / "runs/ci/00_toy/seed3/results.json").read_text())
    assert r3["claims"][0]["holds"] is False

    # a hung cell becomes a failed run that says so, not a wait without end
    rc = cli.main(["run", "00", "--seed", "4", "-p", "sleep_s", "30", "--cell-timeout", "2", "--quiet"])
    assert rc == 1 and "cell-timeout=2" in capsys.readouterr().out

    # bad input is refused before anything runs
    assert cli.main(["run", "00", "-p", "nope", "1"]) == 2
    assert cli.main(["run", "00", "-p", "steps", "x"]) == 2
    assert "expects int" in capsys.readouterr().err

    assert cli.main(["report"]) == 0
    md = (root / "report/summary.md").read_text()
    assert "mixed 2/3" in md  # seeds 1 (its finished run) and 2 held, seed 3 did not
    html = (root / "report/index.html").read_text()
    assert "boom at the work cell" in html and "Toy" in html
    # each run's executed notebook is linked as HTML and every relative link resolves
    from agentrl_lib.pipeline.report import broken_links

    page = root / "report/notebooks/ci/00_toy/seed2.html"
    assert "href='notebooks/ci/00_toy/seed2.html'" in html and page.is_file()
    assert "total is positive" in page.read_text()  # the executed cell's source is there
    assert broken_links(root / "report/index.html") == []
    (root / "report/index.html").write_text(html + "<a href='notebooks/missing.html'>x</a>")
    assert broken_links(root / "report/index.html") == ["notebooks/missing.html"]


def test_summarise_numbers():
    res = [{"notebook": "n", "profile": "cpu", "seed": s, "title": "T", "paper": {},
            "claims": [{"id": "c", "statement": "s", "metric": "m", "ours": o, "baseline": 1.0,
                        "direction": ">", "paper_value": None, "holds": o > 1}]}
           for s, o in [(0, 2.0), (1, 4.0)]]
    (row,) = summarise(res)
    assert row["ours"] == "3 ± 1.4" and row["baseline"] == "1" and row["verdict"] == "holds"
    assert row["on_mean"] == "holds"
    # a bar judged on the mean of seeds: one seed below it, the mean above
    res2 = [{"notebook": "n", "profile": "cpu", "seed": s, "paper": {},
             "claims": [{"id": "bar", "statement": "s", "metric": "m", "ours": o, "baseline": 475.0,
                         "direction": ">=", "margin": 0.0, "paper_value": None, "holds": o >= 475}]}
            for s, o in [(0, 490.8), (1, 474.3), (2, 497.3)]]
    (bar,) = summarise(res2)
    assert bar["verdict"] == "mixed 2/3" and bar["on_mean"] == "holds"
    assert row["seeds"] == [0, 1]


def test_list_and_markdown(tmp_path, monkeypatch, capsys):
    root = make_repo(tmp_path)
    monkeypatch.chdir(root)
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "lr: float = 0.1  # learning rate" in out and "[cpu: 5]" in out
    assert cli.main(["list", "--markdown"]) == 0
    assert "[A paper](https://example.org)" in capsys.readouterr().out


def test_publish_writes_csv_figures_and_results_md(tmp_path, monkeypatch):
    from agentrl_lib.pipeline.report import publish

    root = make_repo(tmp_path)
    monkeypatch.chdir(root)
    for s in (0, 1):
        assert cli.main(["run", "00", "--profile", "cpu", "--seed", str(s), "--quiet"]) == 0
    fig_dir = root / "runs/cpu/00_toy/seed0/figures"
    fig_dir.mkdir()
    (fig_dir / "curve.png").write_bytes(b"png")
    written = publish(root / "runs", root / "reproductions", "cpu")
    csv_text = (root / "reproductions/00_toy/cpu_summary.csv").read_text()
    assert "positive" in csv_text and "0 1" in csv_text and "holds" in csv_text
    assert (root / "reproductions/00_toy/figures/cpu_seed0_curve.png").read_bytes() == b"png"
    md = (root / "reproductions/RESULTS.md").read_text()
    assert md.count("## Profile `cpu`") == 1 and "1 ± 0" not in md  # ours = 1.0 both seeds
    publish(root / "runs", root / "reproductions", "cpu")  # a second publish replaces the section
    assert (root / "reproductions/RESULTS.md").read_text().count("## Profile `cpu`") == 1
    assert len(written) == 3
