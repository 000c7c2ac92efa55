"""The GPU path's prepared command (``reproductions/gpu/gpu_check.py``, issue 31), rehearsed on the
CPU so it cannot rot between lent GPUs: the profiler-trace arithmetic by hand, the stage deadline,
and the whole script end to end with ``--device cpu`` (tiny sizes, no wheel install), whose files
are checked for shapes and plausible values."""

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from argparse import Namespace

import pytest

from agentrl_lib.pipeline.notebooks import repo_root

ROOT = repo_root()
SCRIPT = ROOT / "reproductions" / "gpu" / "gpu_check.py"
WHEELS = ROOT / "reproductions" / "gpu" / "gpu_wheels.py"


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GC = load(SCRIPT, "gpu_check")


def x(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 0}


def test_trace_breakdown_by_hand():
    """A made-up kineto trace (microseconds): the loop runs 0-100, generation 10-60; kernels at
    10-20 and 15-30 (overlapping: 20 us busy, not 25), 70-80, a host-to-device copy 85-90, a
    device-to-host copy 95-97, a kernel at 120-130 outside the loop; the host waits in
    cudaStreamSynchronize 90-99. The GPU-side mirror of the annotation is not the window."""
    trace = {"traceEvents": [
        x("user_annotation", GC.RL_LOOP, 0, 100), x("gpu_user_annotation", GC.RL_LOOP, 5, 200),
        x("user_annotation", GC.RL_GEN, 10, 50), x("kernel", "gemm", 10, 10),
        x("kernel", "softmax", 15, 15), x("kernel", "adamw", 70, 10),
        x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 85, 5),
        x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 95, 2),
        x("kernel", "later", 120, 10), x("cuda_runtime", "cudaStreamSynchronize", 90, 9),
        x("cuda_runtime", "cudaLaunchKernel", 9, 1), x("cuda_runtime", "cudaLaunchKernel", 14, 1),
        {"ph": "s", "cat": "ac2g", "ts": 1}]}
    out = GC.trace_breakdown(trace)
    busy = 20 + 10 + 5 + 2  # union of the device spans inside 0-100
    assert out["wall_s"] == pytest.approx(100e-6) and out["generation_s"] == pytest.approx(50e-6)
    assert out["gpu_busy_s"] == pytest.approx(busy * 1e-6)
    assert out["gpu_busy_frac"] == pytest.approx(busy / 100)
    assert out["gpu_busy_frac_generation"] == pytest.approx(20 / 50)
    assert out["gpu_busy_frac_update"] == pytest.approx((busy - 20) / 50)
    assert (out["copies"], out["copies_htod"], out["copies_dtoh"]) == (2, 1, 1)
    assert out["copies_gpu_s"] == pytest.approx(7e-6)
    assert out["host_wait_s"] == pytest.approx(9e-6)
    assert out["host_launch_s"] == pytest.approx(2e-6) and out["kernels"] == 3
    assert out["device_events"] == 6  # the one outside the loop is counted, not timed
    assert out["device_time_sum_s"] == pytest.approx((10 + 15 + 10 + 5 + 2 + 10) * 1e-6)


def test_trace_without_device_work_has_no_busy_fraction():
    """A CPU trace: the busy fractions are None (not measured), never 0."""
    out = GC.trace_breakdown({"traceEvents": [x("user_annotation", GC.RL_LOOP, 0, 10),
                                              x("cpu_op", "aten::mm", 1, 2)]})
    assert out["wall_s"] == pytest.approx(10e-6) and out["gpu_busy_frac"] is None
    assert out["copies"] is None and out["device_events"] == 0
    with pytest.raises(ValueError, match="no 'gpu_check/rl_loop' annotation"):
        GC.trace_breakdown({"traceEvents": []})


def test_a_stage_past_its_budget_is_stopped_and_the_next_still_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(GC, "MIN_STAGE_S", 0)
    monkeypatch.setattr(GC, "LOG", [])
    args = Namespace(device="cpu", out=str(tmp_path), total_s=60, seed=0, no_install=True,
                     wheels="")
    check = GC.Check(args)
    check.p = dict(check.p, budget_s=dict(check.p["budget_s"], setup=0.3, pretrain=5))
    check.modules = {"torch": "x", "transformers": "x"}
    t = time.perf_counter()
    check.run_stage("setup", lambda deadline: time.sleep(3))
    assert time.perf_counter() - t < 2.5  # stopped at its 0.3 s budget, not after 3 s
    assert check.results["stages"]["setup"]["status"] == "timeout"
    check.run_stage("pretrain", lambda deadline: {"answer": 1})
    assert check.results["stages"]["pretrain"]["answer"] == 1
    assert check.results["stages"]["pretrain"]["status"] == "ok"
    check.run_stage("base", lambda deadline: {})  # needs the pretrain checkpoint it did not make
    assert check.results["stages"]["base"]["status"] == "skipped"
    assert "no pretrain checkpoint" in check.results["stages"]["base"]["why"]
    assert "| setup | timeout |" in (tmp_path / "gpu_check.md").read_text()


def test_wheel_set_is_the_missing_packages_pinned():
    """The wheels are the needed packages and what they need that the machine lacks, at the
    versions installed here; nothing the machine has is downloaded again."""
    W = load(WHEELS, "gpu_wheels")
    pins = W.closure()
    assert set(W.NEEDED) <= set(pins) and not set(pins) & W.DEVICE_PACKAGES
    assert {"torch", "transformers", "numpy", "pyarrow"}.isdisjoint(pins)
    import importlib.metadata as md

    assert pins["trl"] == md.version("trl") and pins["pyzmq"] == md.version("pyzmq")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without one")
def test_without_a_gpu_the_check_says_so_in_one_line(tmp_path):
    """``--device cuda`` where torch sees no GPU: one MISSING line, every later stage skipped
    saying why, the files written, exit status 1."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OUT="")
    res = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda", "--out", str(tmp_path),
                          "--wheels", str(tmp_path / "none"), "--stages", "setup,pretrain"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    missing = [line for line in res.stdout.splitlines() if line.startswith("MISSING: ")]
    assert len(set(missing)) == 1 and "a CUDA GPU (torch" in missing[0]
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    assert r["stages"]["pretrain"] == {"status": "skipped", "why": "no CUDA GPU"}
    assert "**MISSING: a CUDA GPU" in (tmp_path / "gpu_check.md").read_text()


def test_cpu_rehearsal_end_to_end(tmp_path):
    """``gpu_check.py --device cpu``: every stage runs, and the files say something plausible."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OUT="")
    t = time.perf_counter()
    res = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    wall = time.perf_counter() - t
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu_check.json", "gpu_check.log", "gpu_check.md", "loss_curves.csv",
                     "nb11_results.json", "nb30_results.json"]  # at most eight, small
    assert all((out / f).stat().st_size < 2**20 for f in files)
    r = json.loads((out / "gpu_check.json").read_text())
    st = r["stages"]
    assert {k: v["status"] for k, v in st.items()} == {k: "ok" for k in GC.STAGES}, st
    assert not r["missing"] and r["elapsed_s"] <= wall
    for impl in ("ours", "trl"):
        rl = st["rl"][impl]
        assert rl["gen_tokens_per_s"] > 0 and rl["updates_per_s"] > 0 and rl["gen_tokens"] > 0
        prof = rl["profile"]
        assert prof["wall_s"] > 0 and prof["gpu_busy_frac"] is None  # no GPU: not measured
    ours = st["rl"]["ours"]["profile"]
    assert 0 < ours["generation_s"] < ours["wall_s"]
    rows = [line.split(",") for line in (out / "loss_curves.csv").read_text().splitlines()]
    assert rows[0] == ["model", "step", "loss"]
    for model in ("pretrain", "base"):
        losses = [float(r[2]) for r in rows[1:] if r[0] == model]
        assert len(losses) >= 2 and all(math.isfinite(v) for v in losses), model
        assert st[model]["steps"] >= 1 and st[model]["loss_finite"]
    pre = st["pretrain"]["loss_first"], st["pretrain"]["loss_last"]
    assert pre[0] > pre[1], pre  # from ln(2048) = 7.6, pretraining lowers it
    for nb in ("nb11", "nb30"):
        data = json.loads((out / f"{nb}_results.json").read_text())
        assert data["metrics"] and data["claims"] and st[nb]["results_json"]
        assert data["params"]["profile"] == "gpu"
    assert st["nb30"]["ok"]
    md = (out / "gpu_check.md").read_text()
    assert "| updates/s |" in md and "| nb30 | ok |" in md
