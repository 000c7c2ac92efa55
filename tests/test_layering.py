"""Imports follow the library's diagram (README, "Layout"), and a tabular notebook's imports do not
pull in transformers or trl.

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
LAYERS = [("utils",), ("core", "rewards"), ("envs", "models"), ("rollout",), ("algorithms",),
          ("analysis",), ("pipeline", "plotting", "exercises"), ("cli",)]
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


# the library modules the tabular notebooks (0x and 3x) import: none may import transformers or trl
TABULAR = ["agentrl_lib.core", "agentrl_lib.utils", "agentrl_lib.envs", "agentrl_lib.envs.tabular_gym",
           "agentrl_lib.models", "agentrl_lib.rollout", "agentrl_lib.algorithms.dp",
           "agentrl_lib.algorithms.pg", "agentrl_lib.algorithms.ppo", "agentrl_lib.algorithms.rover",
           "agentrl_lib.algorithms.credit", "agentrl_lib.algorithms.agent_pg",
           "agentrl_lib.algorithms.archer", "agentrl_lib.algorithms.spa",
           "agentrl_lib.analysis.arena", "agentrl_lib.pipeline.results", "agentrl_lib.plotting"]


@pytest.mark.parametrize("heavy", ["transformers", "trl"])
def test_tabular_modules_do_not_import_heavy_dependencies(heavy):
    code = (f"import sys, json\nfor m in {TABULAR!r}: __import__(m)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m == {heavy!r} or "
            f"m.startswith({heavy + '.'!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
