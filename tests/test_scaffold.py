"""``agentrl new``: in a copy of the repository, the scaffold's notebook passes the notebook
hygiene test and nbval unedited, its module the layering test and its own tests, and the README
map lists it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_lib import cli
from agentrl_lib.pipeline.notebooks import PipelineError

ROOT = Path(__file__).resolve().parents[1]


def copy_repo(dst: Path) -> Path:
    """What the checks read: the library, the notebooks, their profiles, two tests, the README."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "agentrl_lib", dst / "agentrl_lib", ignore=ignore)
    shutil.copytree(ROOT / "notebooks", dst / "notebooks", ignore=ignore)
    for p in (ROOT / "reproductions").glob("*/profiles.yaml"):
        (dst / p.parent.relative_to(ROOT)).mkdir(parents=True)
        shutil.copy(p, dst / p.relative_to(ROOT))
    (dst / "tests").mkdir()
    for name in ("conftest.py", "test_notebooks_clean.py", "test_layering.py"):
        shutil.copy(ROOT / "tests" / name, dst / "tests" / name)
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, dst / name)
    return dst


def test_new_paper_passes_the_repository_checks(tmp_path, monkeypatch, capsys):
    root = copy_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    assert cli.main(["new", "99_demo", "--module", "demo", "--family", "agents"]) == 0
    assert "notebooks/99_demo.ipynb" in capsys.readouterr().out
    for rel in ("notebooks/99_demo.ipynb", "agentrl_lib/algorithms/demo.py", "tests/test_demo.py",
                "reproductions/99_demo/profiles.yaml"):
        assert (root / rel).is_file(), rel
    assert "notebooks/99_demo.ipynb" in (root / "README.md").read_text()
    with pytest.raises(PipelineError, match="refusing to overwrite"):
        from agentrl_lib.pipeline.scaffold import new_paper
        new_paper(root, "99_demo", "demo", "agents")
    env = {**os.environ, "PYTHONPATH": str(root), "CI": "true",
           "AGENTRL_RUNS_ROOT": str(tmp_path / "runs")}
    env.pop("AGENTRL_RUN_DIR", None)
    env.pop("AGENTRL_NOTEBOOK", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_notebooks_clean.py", "tests/test_layering.py::test_imports_follow_the_diagram",
         "tests/test_demo.py", "agentrl_lib/algorithms/demo.py",
         "notebooks/99_demo.ipynb", "--nbval-lax", "--nbval-current-env"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert (tmp_path / "runs" / "interactive" / "99_demo" / "seed0" / "results.json").is_file()
