"""Seeding, device choice, the one optimizer step, and the JSONL metrics logger."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import numpy as np


def progress_enabled() -> bool:
    """Whether loops show a progress bar: yes in JupyterLab and in a terminal; no when
    ``AGENTRL_QUIET`` is set (``--quiet``), in CI (``CI`` set), or in a headless run
    (``AGENTRL_HEADLESS``: papermill and nbval, whose output nobody watches live)."""
    return not any(os.environ.get(k, "").lower() not in ("", "0", "false")
                   for k in ("AGENTRL_QUIET", "CI", "AGENTRL_HEADLESS"))


def progress(iterable=None, total: int | None = None, desc: str | None = None, **kwargs):
    """``iterable`` wrapped in tqdm's notebook-aware bar (a widget in JupyterLab, text on stderr
    in a terminal), or left plain when ``progress_enabled()`` is False. The bar is removed when
    the loop ends (``leave=False``) unless asked otherwise, so a notebook keeps only its output."""
    from tqdm.auto import tqdm

    kwargs.setdefault("leave", False)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, total=total, desc=desc, disable=not progress_enabled(), **kwargs)


def set_seed(seed: int, deterministic: bool = True) -> None:
    """Seed python, numpy and torch (CPU and CUDA). With ``deterministic``, ask torch for
    deterministic kernels where it has them, so a CPU run with the same seed repeats exactly."""
    random.seed(seed)
    np.random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        # deterministic mode also fills every new tensor's memory with NaN, which changes no
        # correct result but made TRL's CPU log-prob kernel (a 512 MiB buffer per call) about 6x
        # slower (reproductions/benchmarks/grpo_vs_trl.md): turn that fill off
        torch.utils.deterministic.fill_uninitialized_memory = False


def pick_device(device: str = "auto") -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'; any other value is returned checked."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but torch sees no CUDA device")
    return device


def check_schedule(schedule, name: str = "horizon_schedule") -> None:
    """A piecewise-constant schedule ((0, v0), (i1, v1), ...): strictly ascending start iterations
    from 0 and values >= 1 (turn caps), else a ValueError naming ``name``."""
    starts = [int(s) for s, _ in schedule]
    if not starts or starts[0] != 0 or starts != sorted(set(starts)):
        raise ValueError(f"{name} must be ((0, H0), (i1, H1), ...) with strictly ascending "
                         f"iterations starting at 0, got {schedule!r}")
    if any(int(v) < 1 for _, v in schedule):
        raise ValueError(f"{name} turn caps must be >= 1, got {schedule!r}")


def scheduled(schedule, it: int, default):
    """The value of a ``check_schedule`` schedule at iteration ``it`` (0-based); ``default`` when
    there is no schedule.

    >>> scheduled(((0, 5), (10, 20)), 9, None), scheduled(((0, 5), (10, 20)), 10, None)
    (5, 20)
    """
    if schedule is None:
        return default
    return int([v for s, v in schedule if int(s) <= it][-1])


def grad_norm(parameters) -> float:
    """The L2 norm of the gradients of ``parameters`` taken together (0.0 where none has one),
    computed as ``torch.nn.utils.clip_grad_norm_`` does (the norm of the per-tensor norms)."""
    import torch

    grads = [p.grad for p in parameters if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def optimizer_step(optimizer, loss, max_grad_norm: float | None = None, clip_groups=None,
                   parameters=None) -> float:
    """One gradient step, the only one in the library: zero the gradients, backpropagate ``loss``,
    clip the gradient norm to ``max_grad_norm`` (None: no clipping), step. The clip norm is taken
    over all of the optimizer's parameters together, or over each list of parameters in
    ``clip_groups`` on its own (so that a large value gradient cannot shrink the policy's step).

    Returns the gradient norm before clipping, over ``parameters`` (default: every parameter of
    the optimizer), so a loop can log ``losses/grad_norm`` without a second pass."""
    import torch

    optimizer.zero_grad()
    loss.backward()
    every = [p for g in optimizer.param_groups for p in g["params"]]
    norm = grad_norm(every if parameters is None else list(parameters))
    if max_grad_norm is not None:
        for params in clip_groups or [every]:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return norm


def fit_pairs(parameters, pair_loss, num_pairs: int, lr: float, num_epochs: int, batch_size: int,
              seed: int = 0, weight_decay: float = 0.0, max_grad_norm: float | None = None,
              shuffle: bool = True, evaluate=None, desc: str | None = None) -> list[dict]:
    """Epochs over ``num_pairs`` pairs in mini-batches of ``batch_size`` (the last of an epoch may
    be smaller), one AdamW step at a constant ``lr`` each: the fitting loop of DPO
    (``dpo.train``) and of the Bradley-Terry reward model (``reward_model.fit``).

    pair_loss(idx (b,) long tensor on the host) -> (scalar loss with gradients, record dict).
    shuffle: a fresh permutation each epoch from a CPU generator seeded with ``seed`` (False keeps
    the pairs' order). max_grad_norm: clip over all ``parameters`` (None or <= 0: no clip).
    evaluate() -> dict is logged as ``eval/*`` before the first epoch and after every epoch.
    Returns one record per step: ``step``, ``epoch`` and pair_loss's record."""
    import torch

    params = list(parameters)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    clip = max_grad_norm if max_grad_norm and max_grad_norm > 0 else None
    history, step = [], 0
    if evaluate is not None:
        history.append({"step": 0, "epoch": 0, **{f"eval/{k}": v for k, v in evaluate().items()}})
    for epoch in progress(range(num_epochs), desc=desc):
        order = torch.randperm(num_pairs, generator=gen, device="cpu") if shuffle else \
            torch.arange(num_pairs, device="cpu")  # host-side batch indices
        for start in range(0, num_pairs, batch_size):
            loss, record = pair_loss(order[start:start + batch_size])
            optimizer_step(opt, loss, clip)
            step += 1
            history.append({"step": step, "epoch": epoch + 1, **record})
        if evaluate is not None:
            history[-1].update({f"eval/{k}": v for k, v in evaluate().items()})
    return history


class MetricsLogger:
    """Appends one JSON object per ``log`` call to ``<dir>/metrics.jsonl`` and keeps them in memory.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> log = MetricsLogger(d); log.log(step=0, loss=1.5); log.log(step=1, loss=0.5)
    >>> [r["loss"] for r in log.rows], len(open(d + "/metrics.jsonl").readlines())
    ([1.5, 0.5], 2)
    """

    def __init__(self, directory: str | Path, filename: str = "metrics.jsonl"):
        self.path = Path(directory) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self.rows: list[dict] = []
        self._t0 = time.time()

    def log(self, **metrics) -> None:
        row = {k: _plain(v) for k, v in metrics.items()}
        row.setdefault("time_s", round(time.time() - self._t0, 3))
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def column(self, key: str) -> list:
        return [r[key] for r in self.rows if key in r]


def _plain(v):
    """numpy/torch scalars -> python numbers, so rows are JSON."""
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        return v.item()
    if isinstance(v, (np.ndarray,)):
        return v.tolist()
    return v
