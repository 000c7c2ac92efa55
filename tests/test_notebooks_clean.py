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


def test_readme_map_lists_every_notebook():
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index("<!-- map:start"), readme.index("<!-- map:end -->")
    missing = [p.stem for p in NOTEBOOKS if f"notebooks/{p.name}" not in readme[start:end]]
    assert not missing, f"regenerate the README map with `agentrl list --markdown`: {missing}"
    for p in NOTEBOOKS:  # the map's module column follows the notebooks' metadata
        for m in nbs.load_notebook(p, ROOT).meta["modules"]:
            assert f"`{m}`" in readme[start:end], f"regenerate the README map: {p.stem} uses {m}"
