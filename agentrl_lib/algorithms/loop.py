"""The one training-loop frame of the library: every trainer, tabular or language model, is a
sampling function and an update function handed to ``run``.

    rows = run(model, sample, update, num_iters, evaluate=..., eval_every=...)

- ``sample(model, it) -> batch``: play or generate one batch at the policy after ``it`` updates;
  ``batch.metrics`` (a dict) goes into the row;
- ``update(batch, it) -> dict``: advantages, loss and gradient step(s) on that batch; its dict
  goes into the row after the batch's (so it may replace one, e.g. a shaped reward);
- ``evaluate(model) -> dict``: under ``eval/`` at iteration 0 (the start), every ``eval_every``
  updates and after the last; ``initial_eval`` (a dict) is used instead of calling it at 0 when
  the start was already evaluated (the SFT base's panel, measured once for every arm);
- ``stop(row) -> bool``: end early after this row (a budget of tool calls, say); the row that
  stops is evaluated like the last;
- ``logger`` (``utils.MetricsLogger``) gets every row; ``on_step(row)`` is called after each;
- ``report_to="tensorboard"`` copies every row to TensorBoard under ``logging_dir``, with the
  batch's episodes turn by turn at each evaluation (``tblog``; None reads ``$AGENTRL_REPORT_TO``).

Rows: one at ``iter`` 0 with the start's evaluation (only when ``evaluate`` is given; ``start``
adds the trainer's counters at zero, e.g. ``{'episodes': 0}``), then one
per update, ``iter`` = updates done (1..num_iters): the batch's metrics (sampled at ``iter - 1``
updates), the update's, ``time/step_s`` (sample + update) and, when due, ``eval/*`` after that
update with ``time/eval_s``. So ``iter`` always counts the updates behind an evaluation.

This is CleanRL's single loop made reusable: no hooks beyond these, no classes to inherit.
"""

from __future__ import annotations

import time

from agentrl_lib import tblog
from agentrl_lib.utils import progress


def run(model, sample, update, num_iters: int, *, evaluate=None, eval_every: int = 1,
        initial_eval: dict | None = None, start: dict | None = None, stop=None, logger=None,
        on_step=None, desc: str = "updates", report_to: str | None = None,
        logging_dir: str | None = None) -> list[dict]:
    """Train for ``num_iters`` updates (fewer if ``stop`` says so); returns the rows (see the
    module docstring)."""
    if num_iters < 0 or eval_every < 1:
        raise ValueError(f"num_iters must be >= 0 and eval_every >= 1, got {num_iters}, "
                         f"{eval_every}")
    rows: list[dict] = []
    board = None
    if tblog.resolve_report_to(report_to) == "tensorboard":
        board = tblog.Writer(tblog.resolve_logging_dir(logging_dir, desc))

    def emit(row, batch=None):
        rows.append(row)
        if logger is not None:
            logger.log(**row)
        if board is not None:
            board.log_row(row, batch)

    def add_eval(row):
        t0 = time.perf_counter()
        row.update({f"eval/{k}": v for k, v in evaluate(model).items()})
        row["time/eval_s"] = time.perf_counter() - t0

    try:
        if evaluate is not None:
            row = {"iter": 0, **(start or {})}
            if initial_eval is not None:
                row.update({f"eval/{k}": v for k, v in initial_eval.items()})
            else:
                add_eval(row)
            emit(row)
        for it in progress(range(num_iters), desc=desc):
            t0 = time.time()
            batch = sample(model, it)
            row = {"iter": it + 1, **getattr(batch, "metrics", {})}
            row.update(update(batch, it))
            row["time/step_s"] = time.time() - t0
            last = it + 1 == num_iters or (stop is not None and bool(stop(row)))
            if evaluate is not None and (last or (it + 1) % eval_every == 0):
                add_eval(row)
            emit(row, batch)
            if on_step is not None:
                on_step(row)
            if last:
                break
    finally:
        if board is not None:
            board.close()
    if hasattr(model, "eval"):
        model.eval()
    return rows


def eval_rows(rows: list[dict], key: str | None = None) -> list[dict]:
    """The rows that carry an evaluation (``key``, e.g. 'eval/success', or any ``eval/*``)."""
    return [r for r in rows if (key in r if key else any(k.startswith("eval/") for k in r))]
