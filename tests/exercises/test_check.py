"""exercises.check: a right answer passes, a wrong one fails naming the input, a stub is 'not
attempted'; outputs compared leaf by leaf (tensors, arrays, tuples, dicts). exercises.
notebook_function: a notebook's function read with what it needs, and nothing else run. Every
notebook has its exercise test file here."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl_lib import core
from agentrl_lib.exercises import ExerciseError, check, notebook_function

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def gen(rng):
    return torch.tensor(rng.normal(size=5)), float(rng.uniform(0.5, 0.99))


def test_right_wrong_and_stub_answers(capsys):
    def right(r, gamma):
        out, g = torch.zeros_like(r), 0.0
        for t in reversed(range(len(r))):
            g = r[t] + gamma * g
            out[t] = g
        return out

    def wrong(r, gamma):  # forgets the discount
        return torch.flip(torch.cumsum(torch.flip(r, [0]), 0), [0])

    def stub(r, gamma):
        raise NotImplementedError

    assert check(right, core.discounted_returns, gen) is True
    assert "correct on 20 random inputs" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="wrong differs from the reference at trial 0"):
        check(wrong, core.discounted_returns, gen)
    assert check(stub, core.discounted_returns, gen) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_structured_outputs_and_keyword_inputs():
    ref = lambda x, k=1: (x * k, {"sum": float(np.sum(x)), "n": len(x)})  # noqa: E731
    good = lambda x, k=1: (np.asarray(x) * k, {"sum": float(np.sum(x)), "n": len(x)})  # noqa: E731
    bad_shape = lambda x, k=1: (np.asarray(x)[:-1] * k, {"sum": 0.0, "n": len(x)})  # noqa: E731
    inputs = lambda rng: {"x": rng.normal(size=3), "k": int(rng.integers(1, 4))}  # noqa: E731
    assert check(good, ref, inputs)
    with pytest.raises(ExerciseError, match="largest difference: inf"):
        check(bad_shape, ref, inputs)
    # within tolerance passes, beyond it fails
    assert check(lambda x: x + 1e-9, lambda x: x, lambda rng: (rng.normal(size=4),))
    with pytest.raises(ExerciseError):
        check(lambda x: x + 1e-3, lambda x: x, lambda rng: (rng.normal(size=4),))


def _write_notebook(path, *cells):
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [],
                     "execution_count": None} for c in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))
    return path


def test_notebook_function_reads_what_the_function_needs(tmp_path):
    nb = _write_notebook(
        tmp_path / "99_demo.ipynb",
        "%matplotlib inline\nimport numpy as np\nSCALE = 3\nOFFSET = 100",
        "OFFSET = 1  # the last binding above wins\nrun = train_for_an_hour()  # never run\n",
        "import math\nfrom agentrl_lib.exercises import check\n\n\n"
        "def helper(rng):\n    return math.floor(rng.integers(10)) * SCALE\n\n\n"
        "def make_inputs(rng):\n"
        "    return (np.array([helper(rng) for _ in range(2)]) + OFFSET,)\n\n\n"
        "def my_f(x):\n    raise NotImplementedError\n\n\n"
        "check(my_f, undefined_ref, make_inputs)\n")
    make_inputs = notebook_function(nb, "make_inputs")
    rng, again = np.random.default_rng(0), np.random.default_rng(0)
    (x,) = make_inputs(rng)
    assert np.array_equal(x, np.floor(again.integers(10, size=2)) * 3 + 1)


def test_notebook_function_names_what_is_missing(tmp_path):
    nb = _write_notebook(tmp_path / "99_demo.ipynb",
                         "if True:\n    import numpy as np\nN = len('abc')",
                         "def make_inputs(rng):\n    return (np.zeros(N),)\n")
    with pytest.raises(LookupError, match=r"^99_demo.ipynb: no top-level `def gen_inputs`"):
        notebook_function(nb, "gen_inputs")
    with pytest.raises(LookupError, match=r"^99_demo.ipynb: `make_inputs` needs `np`, which no"):
        notebook_function(nb, "make_inputs")


def test_every_notebook_has_its_exercise_tests():
    here = Path(__file__).parent
    tested = {p.stem.removeprefix("test_") for p in here.glob("test_[0-9]*.py")}
    assert tested == {p.stem for p in NOTEBOOKS.glob("[0-9]*.ipynb")}
