"""exercises.check: a right answer passes, a wrong one fails naming the input, a stub is 'not
attempted'; outputs compared leaf by leaf (tensors, arrays, tuples, dicts)."""

import numpy as np
import pytest
import torch

from agentrl_lib import core
from agentrl_lib.exercises import ExerciseError, check


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
