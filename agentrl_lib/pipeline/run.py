"""Execute a notebook with papermill into ``runs/<profile>/<notebook>/seed<S>/``.

The run directory receives the executed notebook, ``params.json``, ``run.json`` (status, wall
time, the failing cell if any) and whatever the notebook writes itself (``results.json``,
``metrics.jsonl``, ``figures/``). The notebook runs in a staging folder beside it
(``.seed<S>.staging``) that replaces the run directory when the run ends, so a run killed half way
leaves the earlier run's files as they were. A failed run replaces an earlier failed (or never
finished) one; a failed re-run of a folder that holds a finished run keeps that run and is kept
beside it as ``.seed<S>.failed`` (the report lists it). Whatever ends the run, a cell's error, a
timeout or a kernel that died (``os._exit``, the OOM killer), ``run.json`` says so in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl_lib.pipeline.notebooks import NotebookInfo, PipelineError, resolve_params
from agentrl_lib.pipeline.paths import point_tag, run_dir_for


@dataclass
class RunOutcome:
    notebook: str
    profile: str
    seed: int
    run_dir: Path
    ok: bool
    wall_s: float
    error: str = ""
    failed_cell: int | None = None

    def line(self) -> str:
        status = "ok" if self.ok else f"FAILED: {self.error}"
        return f"{self.notebook} [{self.profile}, seed {self.seed}] {status} ({self.wall_s:.1f} s)"


def _finished_ok(folder: Path) -> bool:
    try:
        run = json.loads((folder / "run.json").read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    return isinstance(run, dict) and bool(run.get("ok")) and (folder / "results.json").is_file()


def _settle(staging: Path, out_dir: Path, ok: bool) -> Path:
    """Move the finished staging folder into place (see the module docstring); return where the
    run's files are now."""
    if not ok and _finished_ok(out_dir):
        kept = out_dir.with_name(f".{out_dir.name}.failed")
        shutil.rmtree(kept, ignore_errors=True)
        os.replace(staging, kept)
        return kept
    old = out_dir.with_name(f".{out_dir.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(staging, out_dir)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(out_dir.with_name(f".{out_dir.name}.failed"), ignore_errors=True)
    return out_dir


def _kernel_error(e: BaseException) -> str:
    """One line for what ended a run outside the notebook's own cells."""
    text = (str(e).strip().splitlines() or [""])[0]
    if type(e).__name__ == "DeadKernelError":
        return f"the kernel died ({text or 'no reason given'}; out of memory, or os._exit?)"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def execute(info: NotebookInfo, profile: str, seed: int, cli_params=None,
            runs_root: Path | str = "runs", progress: bool = True,
            cell_timeout: int | None = 3600, run_dir: Path | None = None,
            overrides: dict | None = None) -> RunOutcome:
    """Run one notebook for one seed. Parameter errors raise before anything runs; an error inside
    the notebook, a timeout or a dead kernel is caught and returned in the outcome (with the cell
    that raised it), and recorded in ``run.json``.
    ``cell_timeout`` (seconds per cell) turns a hung cell into a failed run instead of a wait
    without end."""
    import papermill as pm

    params = resolve_params(info, profile, seed, cli_params, overrides)
    out_dir = Path(run_dir or run_dir_for(runs_root, profile, info.name, seed, overrides)).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists() and not out_dir.is_dir():
        raise PipelineError(f"{out_dir}: exists and is not a folder")
    # this run's files gather here, apart from an earlier run's, until it ends
    staging = out_dir.with_name(f".{out_dir.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    (staging / "params.json").write_text(json.dumps(params, indent=2))

    env_backup = {k: os.environ.get(k) for k in ("AGENTRL_RUN_DIR", "AGENTRL_NOTEBOOK",
                                                 "AGENTRL_HEADLESS", "AGENTRL_POINT")}
    os.environ["AGENTRL_POINT"] = point_tag(overrides or {})
    os.environ["AGENTRL_RUN_DIR"] = str(staging)
    os.environ["AGENTRL_NOTEBOOK"] = str(info.path.resolve())
    os.environ["AGENTRL_HEADLESS"] = "1"  # no widgets: nobody is looking (plotting.interactive_view)
    t0 = time.time()
    error, cell = "", None
    try:
        pm.execute_notebook(
            str(info.path), str(staging / f"{info.name}.ipynb"), parameters=params,
            cwd=str(info.path.parent), progress_bar=progress, kernel_name="python3",
            report_mode=False, execution_timeout=cell_timeout,
        )
    except pm.PapermillExecutionError as e:
        cell = e.exec_count
        error = f"cell {e.exec_count} raised {e.ename}: {e.evalue}".strip()
    except TimeoutError as e:  # nbclient's CellTimeoutError is a TimeoutError
        error = f"a cell ran past --cell-timeout={cell_timeout} s: {str(e).splitlines()[0]}"
    except Exception as e:  # noqa: BLE001 - a dead kernel (DeadKernelError), papermill trouble
        error = _kernel_error(e)
    finally:
        for k, v in env_backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    wall = time.time() - t0
    ok = not error and (staging / "results.json").is_file()
    if not error and not ok:
        error = "the notebook finished without writing results.json"
    (staging / "run.json").write_text(json.dumps(
        {"ok": ok, "wall_s": round(wall, 2), "error": error, "failed_cell": cell,
         "executed_notebook": f"{info.name}.ipynb", "finished": time.strftime("%Y-%m-%dT%H:%M:%S")},
        indent=2))
    where = _settle(staging, out_dir, ok)
    return RunOutcome(info.name, profile, seed, where, ok, wall, error, cell)
