"""The ``agentrl`` command: list notebooks, run them with papermill, build the report.

    agentrl list [--markdown]
    agentrl readme [--check]          rewrite the README's generated parts (pipeline/readme.py)
    agentrl run NOTEBOOK [NOTEBOOK ...] --profile {ci,cpu,gpu} --seed S [--seed S ...] [-p NAME VALUE ...]
    agentrl reproduce NOTEBOOK --profile P --seeds 0-4 [--grid FILE] [--jobs N] [--backend local|ray]
    agentrl report [--runs runs] [--out report]
    agentrl serve ENV [--port 8000] [--kwargs JSON]   an agent environment as an OpenEnv server
    agentrl cache [NAME ... | --shipped] [--ship]  build the cached SFT bases (agentrl-sft/<name>)
    agentrl new NN_name --module M --family F   a new paper's notebook, module, test, profiles
    agentrl compare RUNS_BEFORE RUNS_AFTER [--rtol R]   which results.json numbers changed

``NOTEBOOK`` is a stem, a unique prefix (``01``) or ``all``. Several notebooks or seeds run one
after another; a failure is reported and the others still run (the exit code is 1 if any failed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from agentrl_lib.pipeline.notebooks import (
    PROFILES, PipelineError, find_notebook, load_notebook, notebook_paths, repo_root,
    resolve_params,
)


def cmd_list(args) -> int:
    root = repo_root()
    if args.markdown:
        from agentrl_lib.pipeline.readme import notebook_map

        print(notebook_map(root), end="")
        return 0
    infos, bad = _load_each(notebook_paths(root), root)
    for i in infos:
        print(f"{i.name}: {i.title}")
        if i.meta.get("paper"):
            print(f"  paper: {i.meta['paper']}" + (f" <{i.meta['url']}>" if i.meta.get("url") else ""))
        print(f"  profiles: {', '.join(i.profiles)}")
        print("  parameters:")
        for p in i.params.values():
            over = {prof: o[p.name] for prof, o in i.profiles.items() if p.name in o}
            extra = "  [" + ", ".join(f"{k}: {v!r}" for k, v in over.items()) + "]" if over else ""
            print(f"    {p.name}: {p.type} = {p.default!r}  # {p.help}{extra}")
        print()
    return 1 if bad else 0


def cmd_readme(args) -> int:
    from agentrl_lib.pipeline.readme import fill, generated_parts

    path = repo_root() / "README.md"
    text = path.read_text()
    new = fill(text, generated_parts(repo_root()))
    if new == text:
        print("README.md: the generated parts are up to date")
        return 0
    if args.check:
        print("README.md: the generated parts are stale; run `agentrl readme`", file=sys.stderr)
        return 1
    path.write_text(new)
    print("README.md: rewrote the notebook map and the layout")
    return 0


def _load_each(paths: list[Path], root: Path) -> tuple[list, list[str]]:
    """(the notebooks of ``paths`` that load, the one-line errors of those that do not, each
    printed to stderr naming its file): one broken notebook does not hide the others."""
    infos, bad = [], []
    for p in paths:
        try:
            infos.append(load_notebook(p, root))
        except PipelineError as e:
            print(f"agentrl: error: {e} (skipped)", file=sys.stderr)
            bad.append(str(e))
    return infos, bad


_SKIPPED: list[str] = []
"""the notebooks `all` skipped because they do not load (run and reproduce then exit 1)"""


def _notebooks(names: list[str], root: Path) -> list:
    """The notebooks named on the command line (stems, unique prefixes, or 'all'), loaded. With
    'all', a notebook that does not load is named on stderr and skipped (``_SKIPPED``); a notebook
    named on its own that does not load is an error."""
    if names == ["all"]:
        infos, bad = _load_each(notebook_paths(root), root)
        _SKIPPED.extend(bad)
        return infos
    return [load_notebook(find_notebook(n, root), root) for n in names]


def _runs_folder(arg: str | None, root: Path, write: bool = False) -> Path:
    """The runs folder of ``--runs`` (default ``<repo>/runs``); one that names a file is refused,
    and with ``write`` one that cannot be written, before anything runs."""
    import tempfile

    runs = Path(arg) if arg else root / "runs"
    if runs.exists() and not runs.is_dir():
        raise PipelineError(f"--runs {runs}: is a file, not a folder")
    if write:
        try:
            runs.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=runs):
                pass
        except OSError as e:
            raise PipelineError(f"runs folder {runs}: cannot write there "
                                f"({e.strerror or e})") from None
    return runs


def cmd_run(args) -> int:
    from agentrl_lib.pipeline.run import execute

    root = repo_root()
    infos = _notebooks(args.notebook, root)
    seeds = args.seed or [0]
    # check every parameter of every run before the first one starts
    for info in infos:
        for s in seeds:
            resolve_params(info, args.profile, s, args.param)
    runs_root = _runs_folder(args.runs, root, write=True)
    if args.report_to:
        os.environ["AGENTRL_REPORT_TO"] = args.report_to  # the kernels inherit it (tblog)
    outcomes = []
    total = len(infos) * len(seeds)
    for info in infos:
        for s in seeds:
            k = len(outcomes) + 1
            print(f"[{k}/{total}] {info.name} profile={args.profile} seed={s}", flush=True)
            out = execute(info, args.profile, s, args.param, runs_root, progress=not args.quiet,
                          cell_timeout=args.cell_timeout or None)
            outcomes.append(out)
            print(f"[{k}/{total}] {out.line()}\n        -> {out.run_dir}", flush=True)
    failed = [o for o in outcomes if not o.ok]
    print(f"\n{len(outcomes) - len(failed)} of {len(outcomes)} runs ok")
    for o in failed:
        print(f"  failed: {o.line()}\n          executed notebook: {o.run_dir / (o.notebook + '.ipynb')}")
    if _SKIPPED:
        print(f"{len(_SKIPPED)} notebooks skipped: they do not load (named above)")
    return 1 if failed or _SKIPPED else 0


def cmd_reproduce(args) -> int:
    from agentrl_lib.pipeline.sweep import load_grid, parse_seeds, plan, run_sweep

    root = repo_root()
    infos = _notebooks(args.notebook, root)
    seeds = parse_seeds(args.seeds)
    runs_root = _runs_folder(args.runs, root, write=not args.dry_run)
    points = []
    for info in infos:  # every point of every notebook is checked before the first one runs
        grid_path = args.grid
        if grid_path is None and args.grid_default:
            grid_path = root / "reproductions" / info.name / "grid.yaml"
        grid = load_grid(grid_path, info) if grid_path else None
        points += plan(info, args.profile, seeds, grid, args.param, runs_root)
    if args.dry_run:
        from agentrl_lib.pipeline.sweep import estimate, estimate_line

        for p in points:
            print(f"{p.label} -> {p.run_dir}")
        jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(points) or 1))
        print(estimate_line(estimate(points, root / "reproductions", jobs), jobs))
        return 1 if _SKIPPED else 0
    out = run_sweep(points, jobs=args.jobs, backend=args.backend, address=args.address,
                    cell_timeout=args.cell_timeout or None, gpus_per_run=args.gpus_per_run,
                    rerun=args.rerun, report_to=args.report_to)
    print(f"\n{len(out['ok'])} ran ok, {len(out['skipped'])} were already complete, "
          f"{len(out['failed'])} failed")
    for p, res in out["failed"]:
        print(f"  failed: {p.label}: {res['error']}\n"
              f"          run folder: {res.get('run_dir') or p.run_dir}")
    if _SKIPPED:
        print(f"{len(_SKIPPED)} notebooks skipped: they do not load (named above)")
    return 1 if out["failed"] or _SKIPPED else 0


def cmd_serve(args) -> int:
    import json

    from agentrl_lib.envs import make_agent_env
    from agentrl_lib.envs.openenv_bridge import serve

    kwargs = json.loads(args.kwargs)
    make_agent_env(args.env, **kwargs)  # a bad name or argument fails here, before serving
    print(f"serving {args.env} as an OpenEnv environment at ws://{args.host}:{args.port}/ws",
          flush=True)
    serve(lambda: make_agent_env(args.env, **kwargs), args.host, args.port, args.max_sessions)
    return 0


def cmd_report(args) -> int:
    from agentrl_lib.pipeline.report import build_report

    root = repo_root()
    out = Path(args.out) if args.out else root / "report"
    if args.relabel:
        from agentrl_lib.pipeline.report import rebuild_results_md, relabel

        changes = relabel(root / "reproductions", root / "notebooks", args.relabel)
        print("\n".join(changes) or "every claim's kind already matches its notebook")
        md = rebuild_results_md(root / "reproductions", args.relabel)
        print(f"relabelled {len(changes)} claims of the {args.relabel!r} tables; rebuilt {md}")
        return 0
    runs = _runs_folder(args.runs, root)
    if not runs.is_dir():
        raise PipelineError(f"no runs folder at {runs}; run `agentrl run` first")
    if out.exists() and not out.is_dir():
        raise PipelineError(f"--out {out}: is a file, not a folder")
    info = build_report(runs, out, notebooks=not args.no_notebooks,
                        fidelity_csv=root / "reproductions" / "fidelity" / "counts.csv",
                        repro_root=root / "reproductions")
    for b in info["invalid"]:
        print(f"invalid: {b['path']} {b['problem']} (not counted; run it again)")
    print(f"{info['results']} results, {info['rows']} claim rows, {info['failures']} failed runs, "
          f"{info['notebooks']} executed notebooks linked")
    print(f"report: {info['html'].resolve()}\nsummary: {info['markdown'].resolve()}")
    if args.publish:
        from agentrl_lib.pipeline.report import publish

        written = publish(runs, root / "reproductions", args.publish)
        print(f"published the {args.publish!r} profile: {len(written)} files under reproductions/")
    t, n = info["tally"], info["runs"]
    print(f"runs: {n['runs']} ({n['completed']} completed, {n['failed']} failed, "
          f"{n['invalid']} with an invalid results.json)")
    print(f"claims: {t['claims']}: {t['held']} held, {t['failed']} failed (did not hold, mixed, "
          f"or not evidence), {t['no_power']} had no power")
    return 0


def cmd_compare(args) -> int:
    from agentrl_lib.pipeline.compare import compare, summary

    for folder in (args.before, args.after):
        if not Path(folder).is_dir():
            raise PipelineError(f"{folder}: not a runs folder")
    result = compare(Path(args.before), Path(args.after), args.rtol)
    if not result:
        raise PipelineError(f"{args.before}: no results.json under it")
    print(summary(result))
    return 0 if all(not r["missing"] and not r["diffs"] and not r["flips"]
                    for r in result.values()) else 1


def cmd_new(args) -> int:
    from agentrl_lib.pipeline.scaffold import new_paper

    root = repo_root()
    for path in new_paper(root, args.name, args.module, args.family):
        print(f"wrote {path.relative_to(root)}")
    print(f"next: fill in the TODOs, then `agentrl run {args.name[:2]} --profile ci`")
    return 0


def shipped_bases() -> list[str]:
    """The names of ``sft.BASE_MODELS`` whose checkpoint folder is shipped in ``bases/`` (what
    ``agentrl cache --shipped``, and so ``make test``, fills the cache with, without training)."""
    from agentrl_lib.algorithms.sft import BASE_MODELS, SHIPPED, checkpoint_path

    folders = {p.name for p in SHIPPED.iterdir()} if SHIPPED.is_dir() else set()
    return [n for n, c in BASE_MODELS.items() if checkpoint_path(c).name in folders]


def cmd_cache(args) -> int:
    import time

    import torch

    from agentrl_lib.algorithms.sft import BASE_MODELS, SHIPPED, checkpoint
    from agentrl_lib.models.loading import install_folder

    if args.quiet:
        os.environ["AGENTRL_QUIET"] = "1"  # no progress bars (utils.progress)
    gpu = torch.cuda.is_available()
    if not gpu:
        torch.set_num_threads(1)  # tiny models: as fast as more threads when idle, faster when busy
    if args.shipped and args.names:
        raise PipelineError("--shipped names the bases itself: give names or --shipped")
    if args.shipped:
        names = shipped_bases()
    else:
        names = args.names or [n for n, c in BASE_MODELS.items() if gpu or c.device == "cpu"]
    if not args.names and not args.shipped and len(names) < len(BASE_MODELS):
        print("no GPU: skipping the GPU-trained bases "
              + ", ".join(n for n in BASE_MODELS if n not in names))
    unknown = [n for n in names if n not in BASE_MODELS]
    if unknown:  # unknown names fail before any training
        raise PipelineError(f"unknown model name(s) {', '.join(map(repr, unknown))}; known: "
                            f"{', '.join(BASE_MODELS)}")
    for name in names:
        t0 = time.time()
        try:
            path = checkpoint(BASE_MODELS[name], verbose=not args.quiet)
        except ValueError as e:  # e.g. a GPU base asked for on a machine without one
            raise PipelineError(f"{name}: {e}") from None
        print(f"{name}: {path} ({time.time() - t0:.1f} s)")
        if args.ship:  # tests/test_pretrain.py flags a shipped folder no base names any more
            print(f"  shipped: {install_folder(path, SHIPPED / path.name)}")
    return 0


def cmd_tokenizer(args) -> int:
    from agentrl_lib.algorithms import subword
    from agentrl_lib.models.tiny_lm import BPE_DIR

    if not args.rebuild:
        print(f"the BPE tokenizer: {BPE_DIR} ({subword.VOCAB_SIZE} tokens); --rebuild retrains "
              f"it on the project's corpora")
        return 0
    path = subword.build(Path(args.out) if args.out else BPE_DIR)
    print(f"wrote {path / 'tokenizer.json'}; the BPE bases' cache keys follow its content, so "
          f"they rebuild on next use (`agentrl cache`)")
    return 0


def cmd_lint(args) -> int:
    from agentrl_lib.pipeline import lint

    paths = [p for p in notebook_paths(repo_root())
             if not args.notebook or any(p.stem.startswith(n) for n in args.notebook)]
    problems = [line for p in paths for line in lint.lint_notebook(p)]
    for line in problems:
        print(line)
    bad = len({line.split(" ")[0].rstrip(":") for line in problems})
    print(f"{len(paths) - bad} of {len(paths)} notebooks pass the lint (code lines <= "
          f"{lint.MAX_LINE} characters, code cells <= {lint.MAX_CELL} lines)")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agentrl", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="notebooks with their paper, parameters and profiles")
    p.add_argument("--markdown", action="store_true", help="print the README's notebook map")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("readme", help="rewrite the README's generated parts (notebook map, layout)")
    p.add_argument("--check", action="store_true", help="only say whether they are up to date")
    p.set_defaults(func=cmd_readme)
    p = sub.add_parser("run", help="execute notebooks with papermill into runs/")
    p.add_argument("notebook", nargs="+", help="notebook stem, unique prefix, or 'all'")
    p.add_argument("--profile", default="ci", choices=PROFILES)
    p.add_argument("--seed", type=int, action="append", help="seed (repeat for several)")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   default=[], help="override one parameter (checked against the notebook)")
    p.add_argument("--runs", help="runs folder (default: <repo>/runs)")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress bar")
    p.add_argument("--cell-timeout", type=int, default=3600, metavar="S",
                   help="fail a run whose cell runs longer than S seconds (0: no limit)")
    p.add_argument("--report-to", choices=("none", "tensorboard"),
                   help="copy the training loops' rows to TensorBoard, in <run>/tensorboard "
                        "(sets AGENTRL_REPORT_TO for the notebook; metrics.jsonl is unchanged)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("serve", help="serve an agent environment as an OpenEnv environment "
                       "(WebSocket sessions at /ws; needs agentrl[openenv])")
    p.add_argument("env", help="a name of envs.AGENT_ENVS (grid, shop, kg_search, ...)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=64,
                   help="episodes running at once (one WebSocket session each)")
    p.add_argument("--kwargs", default="{}", help="the environment's arguments, as JSON")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("reproduce", help="sweep notebooks over seeds (and a grid), in parallel, "
                       "resumable: a second call runs only what is missing")
    p.add_argument("notebook", nargs="+", help="notebook stem, unique prefix, or 'all'")
    p.add_argument("--profile", default="cpu", choices=PROFILES)
    p.add_argument("--seeds", default="0-2", help="e.g. 0-4 or 0,1,2 (default 0-2)")
    p.add_argument("--grid", help="YAML grid of parameter values (see pipeline/sweep.py)")
    p.add_argument("--grid-default", action="store_true",
                   help="use reproductions/<notebook>/grid.yaml of each notebook")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   default=[], help="override one parameter for every point")
    p.add_argument("--jobs", type=int, help="points at a time (default: the CPU count)")
    p.add_argument("--backend", default="local", choices=("local", "ray"))
    p.add_argument("--address", help="ray: cluster address ('auto' joins a running cluster; "
                   "default: start a local Ray instance)")
    p.add_argument("--gpus-per-run", type=float, default=0.0,
                   help="ray: GPUs reserved by each point (e.g. 1, or 0.5 to pack two)")
    p.add_argument("--runs", help="runs folder (default: <repo>/runs)")
    p.add_argument("--cell-timeout", type=int, default=3600, metavar="S",
                   help="fail a point whose cell runs longer than S seconds (0: no limit)")
    p.add_argument("--dry-run", action="store_true", help="list the points and their folders")
    p.add_argument("--rerun", action="store_true", help="run complete points again (after a "
                   "code change: completeness compares parameters, not the notebook's code)")
    p.add_argument("--report-to", choices=("none", "tensorboard"),
                   help="copy every run's training-loop rows to TensorBoard, in "
                        "<run>/tensorboard (as `run --report-to`; metrics.jsonl is unchanged)")
    p.set_defaults(func=cmd_reproduce)
    p = sub.add_parser("report", help="collect results.json files into report/index.html")
    p.add_argument("--runs", help="runs folder (default: <repo>/runs)")
    p.add_argument("--out", help="output folder (default: <repo>/report)")
    p.add_argument("--no-notebooks", action="store_true",
                   help="do not render the executed notebooks to HTML (faster; no links)")
    p.add_argument("--publish", metavar="PROFILE", choices=PROFILES,
                   help="also write reproductions/RESULTS.md and per-notebook CSVs and figures "
                        "for this profile (the committed summaries)")
    p.add_argument("--relabel", metavar="PROFILE", choices=PROFILES,
                   help="only: give the committed tables of this profile each claim's kind as "
                        "its notebook's claim() call now writes it, and a table from before the "
                        "power_plan column today's no-power rule, then rebuild RESULTS.md from "
                        "the tables (no run read, no number changed)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("compare", help="which results.json numbers and claim verdicts differ "
                       "between two runs folders (exit 1 if any)")
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rtol", type=float, default=1e-9, help="relative tolerance (default 1e-9)")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("new", help="start a new paper: notebook skeleton, module, test, profiles "
                       "(and the README map regenerated)")
    p.add_argument("name", help="the notebook's stem, NN_short_name (e.g. 99_demo)")
    p.add_argument("--module", required=True, help="the module agentrl_lib/algorithms/<m>.py")
    p.add_argument("--family", required=True,
                   help="the catalog family (../shared/papers/catalog.csv), e.g. agents")
    p.set_defaults(func=cmd_new)
    p = sub.add_parser("cache", help="build (or check) the cached SFT base models")
    p.add_argument("names", nargs="*", help="base model names (default: all that this machine "
                   "can build)")
    p.add_argument("--shipped", action="store_true",
                   help="the bases shipped in bases/: copied into the cache, nothing trained")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--ship", action="store_true",
                   help="also copy each checkpoint into the repository's bases/ folder, from where "
                        "a fresh clone's cache is filled without training (commit it)")
    p.set_defaults(func=cmd_cache)
    p = sub.add_parser("lint", help="check the notebooks' code lines (<= 100 characters) and "
                       "code cells (<= 30 lines); exit 1 on any problem")
    p.add_argument("notebook", nargs="*", help="stem prefixes (default: every notebook)")
    p.set_defaults(func=cmd_lint)
    p = sub.add_parser("tokenizer", help="where the BPE tokenizer lives; --rebuild retrains it")
    p.add_argument("--rebuild", action="store_true",
                   help="retrain it on the project's corpora (deterministic: the shipped files "
                        "come back unchanged unless a corpus changed)")
    p.add_argument("--out", default="", help="write there instead of the shipped folder")
    p.set_defaults(func=cmd_tokenizer)
    return ap


def _os_error_line(e: OSError) -> str:
    """One line for an OSError: the file it names and the system's words ('Read-only file
    system', 'No space left on device', 'Permission denied')."""
    names = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    what = e.strerror or str(e) or type(e).__name__
    return f"{names}: {what}" if names else what


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt  # the same clean-up as Ctrl-C: kernels and sweep workers stopped


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    args = build_parser().parse_args(argv)
    _SKIPPED.clear()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        return args.func(args)
    except PipelineError as e:
        print(f"agentrl: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only folder, a full disk, a file where a folder should be
        print(f"agentrl: error: {_os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        import psutil

        from agentrl_lib.pipeline.sweep import stop_process_trees

        # what this command started (a run's kernel, a sweep's workers and their kernels) stops
        stop_process_trees([p.pid for p in psutil.Process().children()])
        print("agentrl: interrupted; finished runs are kept under runs/", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
