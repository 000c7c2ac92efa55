"""Checked exercises, in the manner of Spinning Up's: the learner writes a function, and ``check``
compares it with the library's implementation on random inputs, saying where they first differ.

    def my_returns(r_t, gamma):
        raise NotImplementedError  # your code here

    check(my_returns, core.discounted_returns,
          lambda rng: (torch.tensor(rng.normal(size=6)), float(rng.uniform(0.5, 1.0))))

A function left as ``raise NotImplementedError`` is reported as not attempted (the notebook still
runs, in CI too); a wrong answer raises ``ExerciseError`` with the input, both outputs and the
largest difference; a right one prints how many random inputs agreed.

``notebook_function(path, name)`` reads a function (an exercise's input generator, a reference)
out of a notebook with only what it needs, so that a test answers the notebook's own exercise
rather than a copy of it (tests/exercises/).
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import symtable

import numpy as np


class ExerciseError(AssertionError):
    """The learner's function disagrees with the reference on some input."""


def _as_array(x):
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _close(a, b, atol: float, rtol: float) -> tuple[bool, float]:
    """(equal within tolerance, largest absolute difference) of two outputs: numbers, arrays,
    tensors, or tuples / lists / dicts of them, compared leaf by leaf."""
    if isinstance(b, dict):
        if not isinstance(a, dict) or set(a) != set(b):
            return False, float("inf")
        pairs = [(a[k], b[k]) for k in b]
    elif isinstance(b, (tuple, list)) and not np.isscalar(b):
        if not isinstance(a, (tuple, list)) or len(a) != len(b):
            return False, float("inf")
        pairs = list(zip(a, b))
    else:
        try:
            xa, xb = _as_array(a), _as_array(b)
        except (TypeError, ValueError):
            return False, float("inf")
        if xa.shape != xb.shape:
            return False, float("inf")
        if xa.size == 0:
            return True, 0.0
        with np.errstate(invalid="ignore"):  # inf - inf (an unvisited UCT child) is no error
            gap = np.abs(xa - xb)
        diff = float(np.nanmax(gap)) if np.isfinite(gap).any() else 0.0
        same_nan = bool((np.isnan(xa) == np.isnan(xb)).all())
        return bool(np.allclose(xa, xb, atol=atol, rtol=rtol, equal_nan=True)) and same_nan, diff
    results = [_close(x, y, atol, rtol) for x, y in pairs]
    return all(ok for ok, _ in results), max((d for _, d in results), default=0.0)


def check(mine, reference, make_inputs, num_trials: int = 20, seed: int = 0, atol: float = 1e-6,
          rtol: float = 1e-5, name: str | None = None) -> bool:
    """Compare ``mine(*args)`` with ``reference(*args)`` on ``num_trials`` inputs drawn by
    ``make_inputs(rng)`` (``rng`` a numpy Generator seeded by ``seed``; it returns a tuple of
    positional arguments, or a dict of keyword arguments). Returns True when every trial agrees
    (and prints so), False when ``mine`` raises NotImplementedError (not attempted yet); raises
    ``ExerciseError`` naming the first input where they differ."""
    name = name or getattr(mine, "__name__", "your function")
    rng = np.random.default_rng(seed)
    for trial in range(num_trials):
        args = make_inputs(rng)
        call = (lambda f: f(**args)) if isinstance(args, dict) else (lambda f: f(*args))
        want = call(reference)
        try:
            got = call(mine)
        except NotImplementedError:
            print(f"{name}: not attempted yet (replace `raise NotImplementedError` with your code)")
            return False
        ok, diff = _close(got, want, atol, rtol)
        if not ok:
            raise ExerciseError(f"{name} differs from the reference at trial {trial}:\n"
                                f"  input: {args!r}\n  yours: {got!r}\n  reference: {want!r}\n"
                                f"  largest difference: {diff:.3g}")
    print(f"{name}: correct on {num_trials} random inputs")
    return True


def _cells(path) -> list[ast.Module | None]:
    """The notebook's code cells parsed, IPython's `%magic` / `!shell` lines blanked (None: a cell
    that is not Python)."""
    with open(path, encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    out = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in src.split("\n")]
        try:
            out.append(ast.parse("\n".join(lines)))
        except SyntaxError:
            out.append(None)
    return out


def _binds(stmt: ast.stmt) -> set[str]:
    """The top-level names a statement binds."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
        return {stmt.name}
    out, todo = set(), list(stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
    while todo:  # `a, (b, *c) = ...` binds a, b, c; `torch.x = ...` and `d[k] = ...` bind nothing
        t = todo.pop()
        if isinstance(t, ast.Name):
            out.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            todo += t.elts
        elif isinstance(t, ast.Starred):
            todo.append(t.value)
    return out


def _free_names(stmt: ast.stmt) -> set[str]:
    """The global names a statement reads (when it runs, or when a function it defines is called),
    from the symbol table: locals of nested functions, lambdas and comprehensions excluded."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return set()
    table = symtable.symtable(ast.unparse(stmt), "<cell>", "exec")
    names = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    todo = list(table.get_children())
    while todo:
        t = todo.pop()
        names |= {s.get_name() for s in t.get_symbols() if s.is_global() and s.is_referenced()}
        todo += t.get_children()
    return names


def notebook_function(path, name: str):
    """The function ``name`` defined at the top level of a notebook's code cells (the last such
    definition), as a callable, so that a test uses the notebook's own input generator or
    reference instead of a copy.

    Nothing of the notebook is run but what the function needs: the statements binding the
    global names it reads, followed back transitively. They are looked for in its own cell (an
    import, a def, a class or an assignment there; the checks and prints are skipped), then in
    the cells above it (an import, a def or class, or an assignment of a literal, such as a
    parameter); the last binding wins, as it would in the notebook. They run in that order in a
    fresh namespace. Raises ``LookupError`` naming the notebook and the function when there is
    no such def, or when a name it needs is bound nowhere that way (an import under an ``if``,
    a computed value): then the notebook should define it in the exercise cell."""
    where = os.path.basename(str(path))
    cells = _cells(path)
    home = max((i for i, c in enumerate(cells) if c is not None and any(
        isinstance(s, ast.FunctionDef) and s.name == name for s in c.body)), default=None)
    if home is None:
        raise LookupError(f"{where}: no top-level `def {name}` in its code cells")

    def usable(i: int, stmt: ast.stmt) -> bool:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
            return True
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
            return False
        if i == home:
            return True
        try:  # above the exercise cell only literals: a computed value may be a whole training
            ast.literal_eval(stmt.value)
            return True
        except ValueError:
            return False

    # (cell, position) of every usable binding, the exercise cell first, then upwards
    order = [home] + list(range(home - 1, -1, -1))
    chosen: dict[tuple[int, int], ast.stmt] = {}
    todo, seen = [name], set()
    while todo:
        want = todo.pop()
        if want in seen:
            continue
        seen.add(want)
        found = next(((i, j, s) for i in order if cells[i] is not None
                      for j, s in reversed(list(enumerate(cells[i].body)))
                      if usable(i, s) and want in _binds(s)), None)
        if found is None:
            if hasattr(builtins, want):
                continue
            raise LookupError(f"{where}: `{name}` needs `{want}`, which no import, def or literal "
                              f"assignment up to its cell binds (define it in the exercise cell)")
        i, j, stmt = found
        chosen[(i, j)] = stmt
        todo += sorted(_free_names(stmt))
    namespace: dict = {"__name__": f"notebook:{where}"}
    for (i, j), stmt in sorted(chosen.items()):
        code = compile(ast.Module(body=[stmt], type_ignores=[]), f"{where} (code cell {i})", "exec")
        exec(code, namespace)  # the project's own notebook, as nbval would run it
    return namespace[name]
