"""Test-suite wiring: notebooks executed by nbval write their runs to a temporary folder; the files
(test modules, doctest modules, notebooks) run longest first, by ``tests/durations.json``, so that
``pytest -n 2`` (pytest-xdist, ``--dist loadfile`` in pyproject) ends both workers together; the
wall time of each notebook is printed at the end, and ``--store-durations`` records every file's."""

import json
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "tests" / "durations.json"
"""{file (its node id, e.g. 'notebooks/31_gigpo.ipynb'): seconds} of the last `make durations`"""
_FILE_TIMES: dict[str, float] = defaultdict(float)


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="write each file's seconds (setup + call + teardown of its tests) into "
                          "tests/durations.json; files that did not run keep their entries, files "
                          "that no longer exist lose theirs")


def pytest_configure(config):
    # under xdist the workers inherit these from the controller: one runs folder for the session
    os.environ.setdefault("AGENTRL_RUNS_ROOT", tempfile.mkdtemp(prefix="agentrl-nbval-"))
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("AGENTRL_HEADLESS", "1")  # no widgets under nbval (interactive_view)


def estimated_seconds(files: list[str], known: dict[str, float]) -> dict[str, float]:
    """Each file's expected seconds: its recorded time, else the median recorded time of its kind
    (notebook or Python file), so a new notebook is neither first nor last; 1.0 with no record."""
    def kind(f):
        return f.endswith(".ipynb")

    median = {k: statistics.median(v) for k in (True, False)
              if (v := [t for f, t in known.items() if kind(f) == k])}
    return {f: known.get(f, median.get(kind(f), 1.0)) for f in files}


def pytest_collection_modifyitems(config, items):
    """Files longest first (ties in collection order), each file's items kept together and in
    order (nbval runs a notebook's cells in order, in one kernel). xdist's loadfile scheduler hands
    out whole files in this order to whichever worker is nearly idle: longest-processing-time-first
    list scheduling (Graham 1969: within 4/3 of the best split when the recorded times hold), which
    stays balanced as files are added. Serial runs take the same order."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)
    est = estimated_seconds(list(first), known)
    items.sort(key=lambda it: (-est[f := it.nodeid.split("::")[0]], first[f]))


def pytest_runtest_logreport(report):
    _FILE_TIMES[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session):
    # the xdist controller sees every worker's reports; a worker writes nothing
    if not session.config.getoption("store_durations") or hasattr(session.config, "workerinput"):
        return
    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    known = {f: t for f, t in known.items() if (DURATIONS.parents[1] / f).is_file()}  # renamed
    known.update({f: round(t, 1) for f, t in _FILE_TIMES.items()})
    DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")


def pytest_terminal_summary(terminalreporter):
    nb_times = {f: t for f, t in _FILE_TIMES.items() if f.endswith(".ipynb")}
    if nb_times:
        terminalreporter.section("notebook wall time (nbval, ci profile)")
        for path, t in sorted(nb_times.items()):
            terminalreporter.write_line(f"{t:7.1f} s  {path}")
        terminalreporter.write_line(f"{sum(nb_times.values()):7.1f} s  total")
