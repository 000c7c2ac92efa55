"""``agentrl compare``: two runs folders, the numbers and verdicts that changed."""

import json
import subprocess
import sys

from agentrl_lib.pipeline.compare import compare, summary


def _run(root, nb, seed, metrics, holds, wall=1.0):
    d = root / "ci" / nb / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({
        "metrics": metrics, "wall_s": wall,
        "claims": [{"id": "c", "ours": metrics.get("acc"), "holds": holds}]}))


def test_identical_runs_differing_numbers_flips_and_missing_runs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _run(a, "01_x", 0, {"acc": 0.5, "curve": [1.0, 2.0], "time/step_s": 3.0}, True)
    _run(b, "01_x", 0, {"acc": 0.5 + 1e-12, "curve": [1.0, 2.0], "time/step_s": 9.0}, True, 7.0)
    _run(a, "02_y", 1, {"acc": 0.5, "nested": {"k": [0.1, 0.2]}}, True)
    _run(b, "02_y", 1, {"acc": 0.4, "nested": {"k": [0.1, 0.3]}}, False)
    _run(a, "03_z", 0, {"acc": 0.1}, False)
    r = compare(a, b)
    assert r["ci/01_x/seed0"] == {"missing": False, "diffs": [], "flips": []}  # timings left out
    assert [k for k, _, _ in r["ci/02_y/seed1"]["diffs"]] == ["claims/c/holds", "claims/c/ours",
                                                               "metrics/acc", "metrics/nested/k"]
    assert r["ci/02_y/seed1"]["flips"] == [("c", True, False)] and r["ci/03_z/seed0"]["missing"]
    text = summary(r)
    assert "1 of 3 runs identical; 1 claim verdicts flipped" in text and "missing" in text
    cli = [sys.executable, "-m", "agentrl_lib.cli", "compare"]
    assert subprocess.run(cli + [str(a), str(a)], capture_output=True).returncode == 0
    bad = subprocess.run(cli + [str(a), str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a runs folder" in bad.stderr
    assert subprocess.run(cli + [str(a), str(b)], capture_output=True).returncode == 1
