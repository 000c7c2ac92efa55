"""The notebook lint (``pipeline/lint.py``): code lines within 100 characters, code cells of about
25 lines. A notebook still in ``PENDING`` has not had its teaching pass (issue 27, section 3); the
mark is strict, so a notebook that passes while listed fails the suite until it leaves the list."""

import pytest

from agentrl_lib.pipeline import lint
from agentrl_lib.pipeline import notebooks as nbs
from tests.test_notebooks_clean import NOTEBOOKS, ROOT

# shrinks to empty as the teaching pass reaches each notebook; never grows
PENDING: set = set()


def _case(path):
    marks = [pytest.mark.xfail(strict=True, reason="teaching pass pending")] \
        if path.stem in PENDING else []
    return pytest.param(path, marks=marks, id=path.stem)


@pytest.mark.parametrize("path", [_case(p) for p in NOTEBOOKS])
def test_notebook_lint(path):
    problems = lint.lint_notebook(path)
    assert not problems, "\n".join(problems[:20])


def test_pending_names_real_notebooks():
    assert PENDING <= {p.stem for p in nbs.notebook_paths(ROOT)}


def test_lint_catches_both_limits(tmp_path):
    """A notebook with one long line and one long cell gives exactly those two problems."""
    import json

    cells = [{"cell_type": "code", "source": "a = 1\n" + "b" * 101},
             {"cell_type": "code", "source": "pass\n" * 31},
             {"cell_type": "code", "source": "pass\n" * 29 + "c" * 100},  # at both limits
             {"cell_type": "code", "source": "x = 1\n" * 40,  # the parameters cell: no cell limit
              "metadata": {"tags": ["parameters"]}}]
    p = tmp_path / "x.ipynb"
    p.write_text(json.dumps({"cells": cells}))
    assert lint.lint_notebook(p) == ["x cell 0: line 2 has 101 characters (> 100)",
                                     "x cell 1: 31 lines (> 30)"]
    p.write_text("{not json")
    assert lint.lint_notebook(p)[0].startswith("x: not a readable notebook")
