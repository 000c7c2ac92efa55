"""Notebook lint: the house style's limits a learner feels, checked in `make test`.

A code line longer than ``MAX_LINE`` characters scrolls sideways in JupyterLab and in the rendered
report; a code cell longer than ``MAX_CELL`` lines is more than one idea (STYLE.md: "cells of about
25 lines at most; code lines within 100 characters"). The 25 is "about": the hard limit allows a
few lines over it, so a cell is not split mid-thought to dodge the count. The cell tagged
``parameters`` is exempt from the cell limit (papermill reads one such cell; it is a list of
literals with their help, not code to follow), not from the line limit. Markdown is not linted
(tables and prose wrap in the browser). ``agentrl lint`` prints every problem, one a line.
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_LINE = 100
MAX_CELL = 30


def lint_notebook(path: str | Path, max_line: int = MAX_LINE, max_cell: int = MAX_CELL) -> list[str]:
    """Every problem of one notebook as ``'NAME cell K: ...'`` lines (K counts from 0).

    >>> import tempfile, os
    >>> cells = [{"cell_type": "code", "source": ["x = 1\\n", "y = '" + "a" * 120 + "'"]},
    ...          {"cell_type": "markdown", "source": ["b" * 300]},
    ...          {"cell_type": "code", "source": ["z = 0\\n"] * 31}]
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "nb.ipynb")
    >>> _ = open(p, "w").write(json.dumps({"cells": cells}))
    >>> for line in lint_notebook(p): print(line)
    nb cell 0: line 2 has 126 characters (> 100)
    nb cell 2: 31 lines (> 30)
    """
    path = Path(path)
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"{path.stem}: not a readable notebook ({type(e).__name__}: {e})"]
    problems = []
    for k, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        lines = ("".join(src) if isinstance(src, list) else src).rstrip("\n").split("\n")
        for i, line in enumerate(lines, 1):
            if len(line) > max_line:
                problems.append(f"{path.stem} cell {k}: line {i} has {len(line)} characters "
                                f"(> {max_line})")
        if len(lines) > max_cell and "parameters" not in cell.get("metadata", {}).get("tags", []):
            problems.append(f"{path.stem} cell {k}: {len(lines)} lines (> {max_cell})")
    return problems
