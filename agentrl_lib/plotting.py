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
