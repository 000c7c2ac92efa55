"""Learning curves with mean +- std bands across seeds."""

from __future__ import annotations

import numpy as np


def mean_std(curves) -> tuple[np.ndarray, np.ndarray]:
    """curves: (num_seeds, T) array-like (ragged rows are cut to the shortest) -> (mean, std)."""
    rows = [np.asarray(c, dtype=float) for c in curves]
    n = min(len(r) for r in rows)
    arr = np.stack([r[:n] for r in rows])  # (num_seeds, T)
    return arr.mean(0), arr.std(0)


def plot_curves(ax, curves: dict, x=None, xlabel: str = "step", ylabel: str = "", title: str = ""):
    """One line per label with a shaded mean +- std band over seeds.

    curves: {label: (num_seeds, T) values}; a single run is a list with one row.
    x: shared x values (T,), or {label: x} when labels differ.
    """
    for label, ys in curves.items():
        mean, std = mean_std(ys)
        xs = x.get(label) if isinstance(x, dict) else x
        xs = np.arange(len(mean)) if xs is None else np.asarray(xs)[: len(mean)]
        n_seeds = len(ys)
        line, = ax.plot(xs, mean, label=f"{label} (n={n_seeds})" if n_seeds > 1 else label)
        if n_seeds > 1:
            ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def headless() -> bool:
    """True when no person is at the notebook: under ``agentrl run`` (papermill) and the test suite
    (nbval), which set AGENTRL_HEADLESS=1."""
    import os

    return os.environ.get("AGENTRL_HEADLESS", "") not in ("", "0")


def interactive_view(fn, **controls):
    """Show ``ipywidgets.interactive(fn, **controls)`` when a person is at the notebook; headless,
    do nothing (the notebook draws the static figure itself). Widgets are views over the plain
    function ``fn``; under papermill their comm traffic is useless and has hung the client.
    Returns the widget, or None."""
    if headless():
        print("(headless run: the interactive view is skipped; the static figure above shows it)")
        return None
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        print("ipywidgets is not installed: the static figure above is the view")
        return None
    w = widgets.interactive(fn, **controls)
    display(w)
    return w
