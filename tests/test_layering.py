"""Imports follow the library's diagram (README, "Layout"), and a tabular notebook's imports do not
pull in transformers or trl (the modules a notebook imports before its first language model).

Layers, lowest first; a module may import from a lower layer, or from its own package when that
makes no cycle:

    utils                     seeding, the one optimizer step and pair-epoch loop, logging
    core, rewards             pure maths, reward functions
    envs | models             environments; policies, the tiny LM and model loading (siblings)
    rollout                   sequences, masks, log-probs, episodes
    algorithms                one file per family, SFT, the exact DP solvers, the TRL adapter
    analysis                  tools over algorithms' outputs (arena, ablation)
    pipeline | plotting | exercises   runs, results, report; figures; checked exercises
    cli                       the agentrl command

Every import statement counts, including those inside functions.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "agentrl_lib"
LAYERS = [("utils", "offline", "tblog"), ("core", "rewards"), ("envs", "models"), ("rollout",),
          ("algorithms",), ("analysis",), ("pipeline", "plotting", "exercises"), ("cli",)]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_imports() -> dict[str, set[str]]:
    """{module: the agentrl_lib modules it imports} for every module of the package."""
    modules = {module_name(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("agentrl_lib")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentrl_lib"):
                for a in node.names:  # `from pkg import module` is an import of the module
                    sub = f"{node.module}.{a.name}"
                    deps.add(sub if sub in modules else node.module)
        graph[name] = deps - {name}
    return graph


def unit(module: str) -> str:
    """'agentrl_lib.algorithms.grpo' -> 'algorithms'."""
    return module.split(".")[1] if module.count(".") else ""


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the diagram, and import cycles, as readable lines."""
    out = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = unit(mod), unit(dep)
            if a == b or a == "":
                continue
            if b not in LAYER or a not in LAYER:
                out.append(f"{mod} -> {dep}: a module outside the diagram")
            elif LAYER[b] >= LAYER[a]:
                out.append(f"{mod} -> {dep}: {a} may not import {b}")
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                out.append("cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return out


def test_the_checker_finds_each_kind_of_violation():
    bad = {"agentrl_lib.core": {"agentrl_lib.envs.tabular"},  # upwards
           "agentrl_lib.envs.tabular": set(),
           "agentrl_lib.models.loading": {"agentrl_lib.envs.tabular"},  # sideways, siblings
           "agentrl_lib.algorithms.a": {"agentrl_lib.algorithms.b"},
           "agentrl_lib.algorithms.b": {"agentrl_lib.algorithms.a"}}  # a cycle inside a package
    found = violations(bad)
    assert any("core may not import envs" in v for v in found)
    assert any("models may not import envs" in v for v in found)
    assert any(v.startswith("cycle:") and "algorithms.a" in v for v in found)
    assert violations({"agentrl_lib.algorithms.a": {"agentrl_lib.core"}, "agentrl_lib.core": set()}) == []


def test_imports_follow_the_diagram():
    graph = library_imports()
    assert {unit(m) for m in graph} - {""} == set(LAYER), "a new top-level unit: place it in LAYERS"
    assert violations(graph) == []


LM_CALLS = {"load_base", "load_policy", "new_model"}
"""the calls that put a language model in a notebook (sft, models.loading, models.tiny_lm)"""


def notebook_imports(source: str) -> tuple[set[str], set[str]]:
    """(the modules a cell imports, the names it uses); ``from pkg import sub`` counts as
    ``pkg.sub`` when that is a module."""
    source = "\n".join(line for line in source.splitlines()
                       if not line.lstrip().startswith(("%", "!")))  # IPython magics, shell lines
    mods, names = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                sub = ROOT / f"{node.module}.{a.name}".replace(".", "/")
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                mods.add(f"{node.module}.{a.name}" if is_module else node.module)
        elif isinstance(node, (ast.Name, ast.Attribute)):
            names.add(node.id if isinstance(node, ast.Name) else node.attr)
    return mods, names


def light_modules() -> list[str]:
    """The library modules the notebooks import before their first language model (every cell of
    a tabular notebook; a notebook's tabular rungs before its LM rung): derived from the committed
    notebooks, so a new notebook or a new import is checked without a list to keep."""
    light = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            mods, names = notebook_imports("".join(cell["source"]))
            if names & LM_CALLS or {m.split(".")[0] for m in mods} & {"transformers", "trl"}:
                break
            light |= {m for m in mods if m.startswith("agentrl_lib")}
    return sorted(light)


def test_light_modules_are_derived_from_the_notebooks():
    mods, names = notebook_imports("%matplotlib inline\nfrom agentrl_lib.algorithms import dp, grpo"
                                   "\nfrom agentrl_lib.core import gae\nmodel = sft.load_base('x')")
    assert mods == {"agentrl_lib.algorithms.dp", "agentrl_lib.algorithms.grpo", "agentrl_lib.core"}
    assert "load_base" in names
    light = set(light_modules())
    assert {"agentrl_lib.core", "agentrl_lib.algorithms.dp", "agentrl_lib.envs.tabular"} <= light


@pytest.mark.parametrize("heavy", ["transformers", "trl"])
def test_tabular_modules_do_not_import_heavy_dependencies(heavy):
    code = (f"import sys, json\nfor m in {light_modules()!r}: __import__(m)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m == {heavy!r} or "
            f"m.startswith({heavy + '.'!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
