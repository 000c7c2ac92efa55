"""Checked exercises, in the manner of Spinning Up's: the learner writes a function, and ``check``
compares it with the library's implementation on random inputs, saying where they first differ.

    def my_returns(r_t, gamma):
        raise NotImplementedError  # your code here

    check(my_returns, core.discounted_returns,
          lambda rng: (torch.tensor(rng.normal(size=6)), float(rng.uniform(0.5, 1.0))))

A function left as ``raise NotImplementedError`` is reported as not attempted (the notebook still
runs, in CI too); a wrong answer raises ``ExerciseError`` with the input, both outputs and the
largest difference; a right one prints how many random inputs agreed.
"""

from __future__ import annotations

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
