"""Execute a notebook with papermill into ``runs/<profile>/<notebook>/seed<S>/``.

The run directory receives the executed notebook, ``params.json``, ``run.json`` (status, wall
time, the failing cell if any) and whatever the notebook writes itself (``results.json``,
``metrics.jsonl``, ``figures/``). A failed run keeps everything it wrote; a ``results.json`` left by
an earlier run of the same directory is moved aside first, so it is never mistaken for this run's.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl_lib.pipeline.notebooks import NotebookInfo, resolve_params
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


def execute(info: NotebookInfo, profile: str, seed: int, cli_params=None,
            runs_root: Path | str = "runs", progress: bool = True,
            cell_timeout: int | None = 3600, run_dir: Path | None = None,
            overrides: dict | None = None) -> RunOutcome:
    """Run one notebook for one seed. Parameter errors raise before anything runs; an error inside
    the notebook is caught and returned in the outcome (with the cell that raised it).
    ``cell_timeout`` (seconds per cell) turns a hung cell into a failed run instead of a wait
    without end."""
    import papermill as pm

    params = resolve_params(info, profile, seed, cli_params, overrides)
    out_dir = Path(run_dir or run_dir_for(runs_root, profile, info.name, seed, overrides)).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = out_dir / "results.json"
    if stale.exists():
        os.replace(stale, out_dir / "results.previous.json")
    # run.json is the mark of a finished run: gone until this run finishes
    (out_dir / "run.json").unlink(missing_ok=True)
    # what an earlier run of this directory left must not mix with this run's output
    (out_dir / "metrics.jsonl").unlink(missing_ok=True)
    shutil.rmtree(out_dir / "figures", ignore_errors=True)
    (out_dir / "params.json").write_text(json.dumps(params, indent=2))

    env_backup = {k: os.environ.get(k) for k in ("AGENTRL_RUN_DIR", "AGENTRL_NOTEBOOK",
                                                 "AGENTRL_HEADLESS", "AGENTRL_POINT")}
    os.environ["AGENTRL_POINT"] = point_tag(overrides or {})
    os.environ["AGENTRL_RUN_DIR"] = str(out_dir)
    os.environ["AGENTRL_NOTEBOOK"] = str(info.path.resolve())
    os.environ["AGENTRL_HEADLESS"] = "1"  # no widgets: nobody is looking (plotting.interactive_view)
    t0 = time.time()
    error, cell = "", None
    try:
        pm.execute_notebook(
            str(info.path), str(out_dir / f"{info.name}.ipynb"), parameters=params,
            cwd=str(info.path.parent), progress_bar=progress, kernel_name="python3",
            report_mode=False, execution_timeout=cell_timeout,
        )
    except pm.PapermillExecutionError as e:
        cell = e.exec_count
        error = f"cell {e.exec_count} raised {e.ename}: {e.evalue}".strip()
    except TimeoutError as e:  # nbclient's CellTimeoutError is a TimeoutError
        error = f"a cell ran past --cell-timeout={cell_timeout} s: {str(e).splitlines()[0]}"
    finally:
        for k, v in env_backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    wall = time.time() - t0
    ok = not error and (out_dir / "results.json").is_file()
    if not error and not ok:
        error = "the notebook finished without writing results.json"
    outcome = RunOutcome(info.name, profile, seed, out_dir, ok, wall, error, cell)
    tmp = out_dir / "run.json.tmp"
    tmp.write_text(json.dumps(
        {"ok": ok, "wall_s": round(wall, 2), "error": error, "failed_cell": cell,
         "executed_notebook": f"{info.name}.ipynb", "finished": time.strftime("%Y-%m-%dT%H:%M:%S")},
        indent=2))
    os.replace(tmp, out_dir / "run.json")
    return outcome
