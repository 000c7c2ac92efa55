"""Every notebook's checked exercises are answerable: `test_NN_name.py` holds, for each exercise of
`notebooks/NN_name.ipynb`, a right solution written here (loops / numpy, independently of the
library's code) that passes `check` against the notebook's reference, and a plausible wrong one
that raises ExerciseError, both on the notebook's own input generator, read from the notebook
(`exercises.notebook_function`) rather than copied, so that the two cannot drift apart."""

from pathlib import Path

import numpy as np
import pytest

from agentrl_lib.exercises import ExerciseError, check, notebook_function

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.fixture
def notebook(request):
    """name -> that function of the test file's notebook (test_NN_name.py reads NN_name.ipynb)."""
    path = NOTEBOOKS / (request.path.stem.removeprefix("test_") + ".ipynb")
    return lambda name: notebook_function(path, name)


def _answerable(right, wrong, reference, make_inputs, **kw):
    assert check(right, reference, make_inputs, **kw) is True
    with pytest.raises(ExerciseError):
        check(wrong, reference, make_inputs, **kw)


@pytest.fixture
def answerable():
    """(right, wrong, reference, make_inputs, **check_kwargs): the right answer passes `check`,
    the wrong one raises ExerciseError."""
    return _answerable


def _normalise(x, norm_adv=True, eps=1e-4):
    """Group normalisation by hand: 0 for one value or equal values, else centred and divided by
    the std (ddof 1) + eps when norm_adv (the library's convention)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2 or np.all(x == x[0]):
        return np.zeros(len(x))
    return (x - x.mean()) / (x.std(ddof=1) + eps) if norm_adv else x - x.mean()


@pytest.fixture
def normalise():
    """_normalise: (x, norm_adv=True, eps=1e-4) -> the group-normalised x."""
    return _normalise


@pytest.fixture
def pooled():
    """(values, keys) -> each value normalised within the pool of samples sharing its key."""
    def pool(values, keys):
        out = np.zeros(len(values))
        for key in set(keys):
            idx = [i for i, k in enumerate(keys) if k == key]
            out[idx] = _normalise(np.asarray(values, dtype=float)[idx])
        return out

    return pool
