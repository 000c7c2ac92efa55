"""Test-suite wiring: notebooks executed by nbval write their runs to a temporary folder, and the
wall time of each notebook is printed at the end."""

import os
import tempfile
from collections import defaultdict

_NB_TIMES: dict[str, float] = defaultdict(float)


def pytest_configure(config):
    os.environ.setdefault("AGENTRL_RUNS_ROOT", tempfile.mkdtemp(prefix="agentrl-nbval-"))
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("AGENTRL_HEADLESS", "1")  # no widgets under nbval (plotting.interactive_view)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _NB_TIMES[path] += report.duration


def pytest_terminal_summary(terminalreporter):
    if _NB_TIMES:
        terminalreporter.section("notebook wall time (nbval, ci profile)")
        for path, t in sorted(_NB_TIMES.items()):
            terminalreporter.write_line(f"{t:7.1f} s  {path}")
        terminalreporter.write_line(f"{sum(_NB_TIMES.values()):7.1f} s  total")
