"""Every notebook is committed clean and declares what the pipeline needs."""

import importlib.util
import json
from pathlib import Path

import pytest

from agentrl_lib.pipeline import notebooks as nbs

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = nbs.notebook_paths(ROOT)


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean_and_declared(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert not [i for i, c in enumerate(code) if c.get("outputs")], "commit notebooks without outputs"
    assert all(c.get("execution_count") is None for c in code), "clear execution counts"
    if (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5):  # nbformat 4.5: every cell has its id
        ids = [c.get("id") for c in nb["cells"]]
        assert None not in ids and len(set(ids)) == len(ids), "every cell needs a unique id"
    info = nbs.load_notebook(path, ROOT)  # parses the parameters cell and validates the profiles
    assert {"seed", "profile"} <= set(info.params)
    assert info.params["profile"].default == "ci"
    assert all(p.help for p in info.params.values()), "every parameter needs a # help comment"
    for key in ("title", "paper", "url", "modules", "claim"):
        assert info.meta.get(key), f"metadata.agentrl.{key} is missing"
    gone = [m for m in info.meta["modules"] if importlib.util.find_spec(m) is None]
    assert not gone, f"metadata.agentrl.modules names modules that do not exist: {gone}"
    assert {"ci", "cpu", "gpu"} <= set(info.profiles), "declare cpu and gpu profiles"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    # papermill parses the cell with its own regexes (which, e.g., fail on an '=' in a comment) and
    # silently drops what it cannot parse from its list of known parameters
    import papermill

    assert set(papermill.inspect_notebook(str(path))) == set(info.params), \
        "papermill does not parse every parameter line (an '=' in a # comment?)"


def test_readme_generated_parts_are_current():
    """The README's notebook map and layout are what ``agentrl readme`` writes from the notebooks'
    metadata and the modules' docstrings."""
    from agentrl_lib.pipeline.readme import fill, generated_parts

    readme = (ROOT / "README.md").read_text()
    parts = generated_parts(ROOT)
    for name, body in parts.items():
        start = readme.index("\n", readme.index(f"<!-- {name}:start")) + 1
        assert readme[start:readme.index(f"<!-- {name}:end -->")] == body, \
            f"the README's {name} is stale: run `agentrl readme`"
    assert fill(readme, parts) == readme
    assert all(f"notebooks/{p.name}" in parts["map"] for p in NOTEBOOKS)
    assert all(f" {p.name} " in parts["layout"] for p in (ROOT / "agentrl_lib").rglob("*.py")
               if p.name != "__init__.py")
