"""The pipeline against bad files and failures (issue 29, section 2): each gives one line naming the
file and the problem, no traceback, and loses nothing already computed; and the rule of what a
published profile asserts (section 3)."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from test_pipeline import PARAMS, WORK, make_repo

from agentrl_lib import cli
from agentrl_lib.pipeline import notebooks as nbs
from agentrl_lib.pipeline import report, sweep
from agentrl_lib.pipeline.results import (
    assert_claims, claim, read_results, write_results,
)

REPO = Path(__file__).resolve().parents[1]
DIE = "die_seed: int = -1  # the kernel exits (os._exit) at this seed\n"


def toy_repo(tmp_path, profiles_yaml="cpu:\n  steps: 5\n"):
    """make_repo's toy notebook, with a parameter whose seed kills the kernel in the work cell."""
    root = make_repo(tmp_path, profiles_yaml)
    path = root / "notebooks" / "00_toy.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = PARAMS + DIE
    nb.cells[2].source = "import os\nif seed == die_seed:\n    os._exit(1)\n" + WORK
    nbformat.write(nb, path)
    return root


def valid_results(notebook="00_toy", seed=0, ours=1.0):
    return {"notebook": notebook, "profile": "cpu", "point": "", "seed": seed,
            "params": {"seed": seed}, "metrics": {"total": ours},
            "claims": [{"id": "positive", "statement": "total is positive", "metric": "total",
                        "ours": ours, "baseline": 0.0, "direction": ">", "margin": 0.0,
                        "holds": ours > 0, "asserted": True, "kind": "sanity"}]}


BAD_RESULTS = {  # what is written -> words the one line must hold
    "empty": (b"", "is empty"),
    "truncated": (b'{"notebook": "00_toy", "claims": [', "not valid JSON"),
    "not_json": (b"hello", "not valid JSON"),
    "not_utf8": (b'{"notebook": "\xff"}', "not UTF-8"),
    "list": (b"[]", "not a mapping (a list)"),
    "null": (b"null", "not a mapping (null)"),
    "claims_str": (json.dumps({**valid_results(), "claims": "x"}).encode(), "'claims' is 'x'"),
    "ours_str": (json.dumps({**valid_results(), "claims": [
        {**valid_results()["claims"][0], "ours": "abc"}]}).encode(), "'ours' is 'abc'"),
}


def _one_line_no_traceback(text: str) -> None:
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text


@pytest.mark.parametrize("case", sorted(BAD_RESULTS))
def test_read_results_names_the_problem(tmp_path, case):
    raw, words = BAD_RESULTS[case]
    (tmp_path / "results.json").write_bytes(raw)
    data, problem = read_results(tmp_path / "results.json")
    assert data is None and words in problem
    (tmp_path / "results.json").write_text(json.dumps(valid_results()))
    assert read_results(tmp_path / "results.json") == (valid_results(), "")


def test_report_lists_invalid_results_and_keeps_the_valid(tmp_path, monkeypatch, capsys):
    root = make_repo(tmp_path)
    monkeypatch.chdir(root)
    runs = root / "runs" / "cpu" / "00_toy"
    (runs / "seed0").mkdir(parents=True)
    (runs / "seed0" / "results.json").write_text(json.dumps(valid_results()))
    for i, case in enumerate(sorted(BAD_RESULTS), start=1):
        (runs / f"seed{i}").mkdir()
        (runs / f"seed{i}" / "results.json").write_bytes(BAD_RESULTS[case][0])
    assert cli.main(["report", "--no-notebooks"]) == 0
    out = capsys.readouterr().out
    invalid = [x for x in out.splitlines() if x.startswith("invalid: ")]
    assert len(invalid) == len(BAD_RESULTS)
    for i, case in enumerate(sorted(BAD_RESULTS), start=1):
        line = next(x for x in invalid if f"seed{i}/results.json" in x)
        assert BAD_RESULTS[case][1] in line
    assert out.startswith("invalid: ") or "1 results" in out
    md = (root / "report" / "summary.md").read_text()
    assert "could not be read" in md and "seed3/results.json" in md
    assert "total is positive" in md  # the valid run is still reported
    assert "runs: 9 (1 completed, 0 failed, 8 with an invalid results.json)" in out


def complete_point(tmp_path):
    """(a sweep point of the toy notebook, its folder holding a finished run)."""
    root = make_repo(tmp_path)
    info = nbs.load_notebook(root / "notebooks" / "00_toy.ipynb", root)
    (point,) = sweep.plan(info, "cpu", [0], runs_root=tmp_path / "runs")
    d = Path(point.run_dir)
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"ok": True}))
    (d / "params.json").write_text(json.dumps(point.params))
    (d / "results.json").write_text(json.dumps(valid_results()))
    return point, d


@pytest.mark.parametrize("case", sorted(BAD_RESULTS))
def test_reproduce_reruns_a_point_with_invalid_results(tmp_path, case):
    point, d = complete_point(tmp_path)
    assert sweep.is_complete(point)  # the control: a valid folder is complete
    (d / "results.json").write_bytes(BAD_RESULTS[case][0])
    assert not sweep.is_complete(point)


@pytest.mark.parametrize("name", ["run.json", "params.json"])
@pytest.mark.parametrize("raw", [b"null", b"[]", b'{"ok": "\xff\xfe"}', b"\xff\xfe\x00"])
def test_bad_run_or_params_json_makes_a_point_incomplete(tmp_path, name, raw):
    point, d = complete_point(tmp_path)
    assert sweep.is_complete(point)
    (d / name).write_bytes(raw)
    assert sweep.is_complete(point) is False  # no exception: the sweep goes on and reruns it


def test_kernel_death_and_reruns_keep_finished_runs(tmp_path, monkeypatch, capsys):
    root = toy_repo(tmp_path)
    monkeypatch.chdir(root)
    assert cli.main(["run", "00", "--seed", "0", "--seed", "1", "--quiet"]) == 0
    d0 = root / "runs/ci/00_toy/seed0"
    (d0 / "figures").mkdir()
    (d0 / "figures" / "curve.png").write_bytes(b"png")
    before = {p.relative_to(d0): p.read_bytes() for p in d0.rglob("*") if p.is_file()}
    assert Path("metrics.jsonl") in before

    # seed 0's kernel dies: one line, a run.json that says so, seed 1 still runs, and the
    # finished seed-0 run (figures, metrics.jsonl, results) is kept as it was
    rc = cli.main(["run", "00", "--seed", "0", "--seed", "1", "-p", "die_seed", "0", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 1 and "the kernel died" in out and "1 of 2 runs ok" in out
    after = {p.relative_to(d0): p.read_bytes() for p in d0.rglob("*") if p.is_file()}
    assert after == before
    failed = json.loads((root / "runs/ci/00_toy/.seed0.failed/run.json").read_text())
    assert failed["ok"] is False and "kernel died" in failed["error"]
    assert json.loads((root / "runs/ci/00_toy/seed1/params.json").read_text())["die_seed"] == 0

    # a seed with no finished run: the failed run takes the folder, run.json says why
    rc = cli.main(["run", "00", "--seed", "2", "-p", "die_seed", "2", "--quiet"])
    assert rc == 1
    run = json.loads((root / "runs/ci/00_toy/seed2/run.json").read_text())
    assert run["ok"] is False and "kernel died" in run["error"]
    assert report.failed_runs(root / "runs")[0]["error"].startswith("the kernel died")

    # a re-run that succeeds replaces the folder, and the kept failure goes
    assert cli.main(["run", "00", "--seed", "0", "--quiet"]) == 0
    assert not (d0 / "figures").exists() and (d0 / "results.json").is_file()
    assert not (root / "runs/ci/00_toy/.seed0.failed").exists()
    assert not list((root / "runs/ci/00_toy").glob(".*staging"))


def test_runs_folder_that_is_a_file_or_read_only(tmp_path, monkeypatch, capsys):
    root = make_repo(tmp_path)
    monkeypatch.chdir(root)
    (root / "afile").write_text("x")
    for args in (["run", "00", "--runs", "afile"], ["report", "--runs", "afile"],
                 ["reproduce", "00", "--runs", "afile"]):
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        _one_line_no_traceback(err)
        assert "afile: is a file, not a folder" in err

    def read_only(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(root / "runs"))

    monkeypatch.setattr("tempfile.TemporaryFile", read_only)
    assert cli.main(["run", "00", "--quiet"]) == 2
    err = capsys.readouterr().err
    _one_line_no_traceback(err)
    assert "runs: cannot write there (Read-only file system)" in err


def test_report_is_written_atomically_on_a_full_disk(tmp_path, monkeypatch, capsys):
    root = make_repo(tmp_path)
    monkeypatch.chdir(root)
    (root / "runs/cpu/00_toy/seed0").mkdir(parents=True)
    (root / "runs/cpu/00_toy/seed0/results.json").write_text(json.dumps(valid_results()))
    assert cli.main(["report", "--no-notebooks"]) == 0
    summary = (root / "report/summary.md").read_bytes()
    assert summary

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(report.os, "fsync", full)
    capsys.readouterr()
    assert cli.main(["report", "--no-notebooks"]) == 2
    err = capsys.readouterr().err
    _one_line_no_traceback(err)
    assert "No space left on device" in err
    assert (root / "report/summary.md").read_bytes() == summary  # the earlier report is kept
    assert not list((root / "report").glob(".*tmp*"))


def test_bad_yaml_notebooks_and_parameters(tmp_path, monkeypatch, capsys):
    root = make_repo(tmp_path)
    monkeypatch.chdir(root)
    info = nbs.load_notebook(root / "notebooks" / "00_toy.ipynb", root)
    grid = tmp_path / "g.yaml"
    cases = [(b"lr: [0.1, \xff]\n", "g.yaml: not UTF-8"),
             (b"", "g.yaml: the grid is empty"), (b"# only a comment\n", "the grid is empty"),
             (b"points: []\n", "'points' is empty"),
             (b"lr: [0.1]\nlr: [0.2]\n", "duplicate key 'lr'"),
             (b"steps: [1, 'x']\n", "g.yaml: parameter 'steps' expects int")]
    for raw, words in cases:
        grid.write_bytes(raw)
        with pytest.raises(nbs.PipelineError, match=words):
            sweep.load_grid(grid, info)
    profiles = root / "reproductions/00_toy/profiles.yaml"
    for raw, words in [(b"cpu:\n  steps: 5\n  lr: \xff\n", "profiles.yaml: not UTF-8"),
                       (b"cpu:\n  steps: 5\n  steps: 6\n", "duplicate key 'steps'"),
                       (b"cpu:\n  steps: 5\ncpu:\n  steps: 6\n", "duplicate key 'cpu'"),
                       (b"cpu:\n  seed: 3\n", "'seed' is not a profile setting; use --seed"),
                       (b"cpu:\n  profile: gpu\n", "'profile' is not a profile setting")]:
        profiles.write_bytes(raw)
        assert cli.main(["run", "00", "--profile", "cpu"]) == 2
        err = capsys.readouterr().err
        _one_line_no_traceback(err)
        assert words in err
    profiles.write_text("cpu:\n  steps: 5\n")

    # -p seed and -p profile are refused, not silently overwritten
    for args, words in [(["-p", "seed", "5"], "use"), (["-p", "profile", "gpu"], "--profile")]:
        assert cli.main(["run", "00", *args]) == 2
        err = capsys.readouterr().err
        _one_line_no_traceback(err)
        assert f"-p {args[1]} {args[2]}:" in err and words in err

    # a truncated notebook is named by list and all, and the others go on
    good = nbformat.read(root / "notebooks/00_toy.ipynb", as_version=4)
    nbformat.write(good, root / "notebooks/01_other.ipynb")
    text = (root / "notebooks/00_toy.ipynb").read_text()
    (root / "notebooks/00_toy.ipynb").write_text(text[: len(text) // 2])
    assert cli.main(["list"]) == 1
    io = capsys.readouterr()
    _one_line_no_traceback(io.err)
    assert "00_toy.ipynb: not a notebook: invalid JSON" in io.err and "01_other" in io.out
    assert cli.main(["reproduce", "all", "--profile", "ci", "--dry-run"]) == 1
    io = capsys.readouterr()
    assert "00_toy.ipynb" in io.err and "01_other [ci, seed 0]" in io.out
    assert cli.main(["run", "00"]) == 2
    _one_line_no_traceback(capsys.readouterr().err)

    # a syntax error in the parameters cell
    good.cells[1].source = PARAMS + "lr: float = (0.1  # unclosed\n"
    nbformat.write(good, root / "notebooks/00_toy.ipynb")
    assert cli.main(["run", "00"]) == 2
    err = capsys.readouterr().err
    _one_line_no_traceback(err)
    assert "00_toy.ipynb: parameters cell line" in err and "not valid Python" in err


def test_checksummed_cache_reports_and_repairs_a_corrupt_base(tmp_path, monkeypatch, capsys):
    from agentrl_lib.algorithms import sft
    from agentrl_lib.models import loading

    names = cli.shipped_bases()
    if not names:
        pytest.skip("no shipped base in bases/")
    name = names[0]
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AGENTRL_QUIET", "1")  # cmd_cache sets it; restored after the test
    assert cli.main(["cache", name, "--quiet"]) == 0
    path = sft.checkpoint_path(sft.BASE_MODELS[name])
    assert loading.checksum_problems(path) == []  # recorded at install
    weights = path / "model.safetensors"
    good = weights.read_bytes()
    capsys.readouterr()

    for broken in (good[: len(good) // 2], good[:-8] + bytes(8)):  # half a file; flipped bytes
        weights.write_bytes(broken)
        with pytest.raises(loading.CorruptCheckpoint, match="model.safetensors"):
            loading.load_policy(str(path))
        assert cli.main(["cache", name, "--quiet"]) == 0
        out = capsys.readouterr().out
        assert "model.safetensors" in out and "checksum differs" in out
        assert weights.read_bytes() == good  # reinstalled from the shipped copy

    # a cache entry written before checksums were kept: compared with the shipped copy
    (path / loading.CHECKSUMS).unlink()
    weights.write_bytes(good[:100])
    assert cli.main(["cache", name, "--quiet"]) == 0
    assert "differs from its shipped copy in model.safetensors" in capsys.readouterr().out
    assert weights.read_bytes() == good and loading.checksum_problems(path) == []

    # a read-only cache: one line
    shutil.rmtree(path)

    def read_only(src, dst, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))

    monkeypatch.setattr(loading.shutil, "copytree", read_only)
    assert cli.main(["cache", name, "--quiet"]) == 2
    err = capsys.readouterr().err
    _one_line_no_traceback(err)
    assert "Read-only file system" in err and str(tmp_path / "cache") in err


def _unshare_ok() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_ok(), reason="needs root and unshare -m (tmpfs mounts)")
def test_real_read_only_and_full_disk(tmp_path):
    """The same, on real file systems: a read-only tmpfs and a full one (in a private mount
    namespace, so nothing outlives the test)."""
    (tmp_path / "repo").mkdir()
    root = make_repo(tmp_path / "repo")
    runs = root / "runs/cpu/00_toy/seed0"
    runs.mkdir(parents=True)
    (runs / "results.json").write_text(json.dumps(valid_results()))
    ro, full = tmp_path / "ro", tmp_path / "full"
    ro.mkdir(), full.mkdir()
    py = f"PYTHONPATH={REPO} {sys.executable} -m agentrl_lib.cli"
    script = f"""
mount -t tmpfs -o ro,size=64k tmpfs {ro}
mount -t tmpfs -o size=48k tmpfs {full}
echo earlier > {full}/summary.md
dd if=/dev/zero of={full}/filler bs=1k count=100 2>/dev/null
{py} run 00 --runs {ro} --quiet 2> {tmp_path}/run.err; echo "run $?"
{py} report --no-notebooks --out {ro}/report 2> {tmp_path}/report_ro.err; echo "report_ro $?"
{py} report --no-notebooks --out {full} 2> {tmp_path}/report_full.err; echo "report_full $?"
cat {full}/summary.md > {tmp_path}/summary_after
AGENTRL_CACHE={ro} {py} cache {cli.shipped_bases()[0]} --quiet 2> {tmp_path}/cache.err
echo "cache $?"
"""
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=root, capture_output=True,
                         text=True, timeout=300)
    codes = dict(line.split() for line in out.stdout.splitlines() if line.count(" ") == 1)
    assert codes == {"run": "2", "report_ro": "2", "report_full": "2", "cache": "2"}, out
    for name, words in [("run", "Read-only file system"), ("report_ro", "Read-only file system"),
                        ("report_full", "No space left on device"),
                        ("cache", "Read-only file system")]:
        err = (tmp_path / f"{name}.err").read_text()
        err = "\n".join(x for x in err.splitlines() if "WARNING" not in x)
        _one_line_no_traceback(err)
        assert words in err
    assert (tmp_path / "summary_after").read_text() == "earlier\n"  # never a 0-byte summary


@pytest.mark.parametrize("command, sig", [("reproduce", signal.SIGTERM),
                                          ("reproduce", signal.SIGINT), ("run", signal.SIGTERM)])
def test_killing_reproduce_stops_its_workers_and_kernels(tmp_path, command, sig):
    import psutil

    root = make_repo(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = {"reproduce": ["--seeds", "0-1", "--jobs", "2"], "run": ["--quiet"]}[command]
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl_lib.cli", command, "00", "--profile", "ci", *args,
         "-p", "sleep_s", "120", "--runs", str(root / "runs")],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=_default_sigint)
    want = 2 if command == "reproduce" else 1
    try:
        me = psutil.Process(proc.pid)
        deadline = time.time() + 240
        kids = []
        while time.time() < deadline:  # until both kernels run the sleeping cell
            kids = me.children(recursive=True)
            kernels = [k for k in kids if "ipykernel" in " ".join(_cmdline(k))]
            if len(kernels) >= want:
                break
            time.sleep(1)
        assert len(kernels) >= want, "the kernels never started"
        time.sleep(3)
        kids = me.children(recursive=True)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 130
        _, alive = psutil.wait_procs(kids, timeout=15)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for k in psutil.Process().children(recursive=True):
            if "ipykernel" in " ".join(_cmdline(k)):
                k.kill()


def _default_sigint() -> None:
    """Ctrl-C as a terminal delivers it: a test runner started in the background (or a pytest-xdist
    worker) may ignore SIGINT, and a child inherits that, so Python would install no handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:  # noqa: BLE001 - gone, or a zombie
        return []


def test_published_profiles_assert_only_sanity_and_theorem(tmp_path, monkeypatch):
    from agentrl_lib.pipeline import results

    monkeypatch.setattr(results, "_PROFILE", [])  # this process's last profile, restored after
    monkeypatch.setenv("AGENTRL_RUN_DIR", str(tmp_path / "r"))
    paper = claim("beats", "ours beats the baseline", "acc", 0.4, 0.5, ">", kind="paper")
    ext = claim("ext", "an extension", "acc", 0.4, 0.5, ">", kind="extension")
    sanity = claim("same", "equals the library", "x", 1.0, 2.0, "~", kind="sanity")
    design = claim("built", "true by construction", "x", 1.0, 2.0, "~", kind="design")
    params = {"seed": 0, "profile": "cpu"}
    for profile in ("cpu", "gpu"):
        write_results("00_toy", {**params, "profile": profile}, {}, [paper, ext])
        assert_claims([paper, ext, design])  # failing paper, extension, design: results
        saved = json.loads((tmp_path / "r/results.json").read_text())
        assert [c["asserted"] for c in saved["claims"]] == [False, False]
        with pytest.raises(AssertionError, match="same"):
            assert_claims([paper, sanity])
        paper.asserted = ext.asserted = True
    write_results("00_toy", {**params, "profile": "ci"}, {}, [paper, ext])
    with pytest.raises(AssertionError, match="beats"):  # ci asserts what the notebook asserts
        assert_claims([paper, ext])
    with pytest.raises(AssertionError, match="beats"):
        assert_claims([paper], profile="ci")
    assert_claims([paper], profile="gpu")


def test_report_last_lines_count_runs_and_claims(tmp_path, monkeypatch, capsys):
    root = make_repo(tmp_path)
    monkeypatch.chdir(root)
    base = root / "runs/cpu/00_toy"
    for seed, ours in [(0, 1.0), (1, 2.0)]:
        (base / f"seed{seed}").mkdir(parents=True)
        (base / f"seed{seed}/results.json").write_text(json.dumps(valid_results(seed=seed,
                                                                                ours=ours)))
    (base / "seed2").mkdir()
    (base / "seed2/run.json").write_text(json.dumps({"ok": False, "error": "boom"}))
    bad = valid_results(seed=3, ours=-1.0)
    bad["claims"].append({**bad["claims"][0], "id": "other", "holds": False})
    (root / "runs/cpu/00_toy/pt").mkdir()
    (root / "runs/cpu/00_toy/pt/results.json").write_text(json.dumps({**bad, "point": "x"}))
    # a run whose sanity claim failed its assert after writing its results: failed, reported
    (root / "runs/cpu/00_toy/pt2").mkdir()
    (root / "runs/cpu/00_toy/pt2/results.json").write_text(json.dumps({**bad, "point": "y"}))
    (root / "runs/cpu/00_toy/pt2/run.json").write_text(json.dumps({"ok": False, "error": "x"}))
    assert cli.main(["report", "--no-notebooks"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-2:]
    assert last[0] == "runs: 5 (3 completed, 2 failed, 0 with an invalid results.json)"
    assert last[1].startswith("claims: 5: 1 held, 4 failed") and "0 had no power" in last[1]


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
@pytest.mark.parametrize("reproduce_rc, report_rc, want", [(0, 0, 0), (1, 0, 1), (0, 2, 1),
                                                           (2, 0, 1)])
def test_make_report_exit_code(tmp_path, reproduce_rc, report_rc, want):
    """`make report` exits 0 only when every run completed and the report was written (the
    Makefile's recipe, with a stand-in agentrl that exits as told)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "agentrl"
    fake.write_text(f"#!/bin/sh\necho \"$1\" >> {tmp_path}/calls\n"
                    f"[ \"$1\" = reproduce ] && exit {reproduce_rc}\nexit {report_rc}\n")
    fake.chmod(0o755)
    (venv / ".installed").touch()  # newer than the lock file: no install
    os.utime(venv / ".installed", (time.time() + 60, time.time() + 60))
    out = subprocess.run(["make", "-s", "-C", str(REPO), "report", f"VENV={venv}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == (2 if want else 0), out.stderr  # make's own code for a failed recipe
    assert (tmp_path / "calls").read_text().split() == ["reproduce", "report"]
    if want:
        assert "Error 1" in out.stderr


def test_compare_names_a_bad_results_file_and_skips_kept_aside_runs(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "ci/00_toy/seed0").mkdir(parents=True)
        (root / "ci/00_toy/seed0/results.json").write_text(json.dumps(valid_results()))
    (a / "ci/00_toy/.seed1.failed").mkdir()  # a failed re-run kept aside: not compared
    (a / "ci/00_toy/.seed1.failed/results.json").write_text(json.dumps(valid_results()))
    assert cli.main(["compare", str(a), str(b)]) == 0
    (b / "ci/00_toy/seed0/results.json").write_text('{"claims": [')
    capsys.readouterr()
    assert cli.main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    _one_line_no_traceback(err)
    assert "b/ci/00_toy/seed0/results.json: not readable JSON" in err
