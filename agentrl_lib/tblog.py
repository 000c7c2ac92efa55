"""TensorBoard logs of the training loops (``report_to="tensorboard"``, as TRL users write it).

``metrics.jsonl`` (``utils.MetricsLogger``) stays the source of truth; TensorBoard gets a copy to
look at. ``loop.run(..., report_to="tensorboard")`` opens a ``Writer`` and hands it every row:
each number of the row becomes a scalar under its own name (``eval/success``, ``losses/policy``,
...) at step ``iter`` (updates done); at each row that carries an evaluation, the first
``num_episodes`` episodes of the batch that update trained on go to the text tab, turn by turn
(``episodes_markdown``: observation, action, reward, valid), under ``rollouts/turns`` (stored
as ``rollouts/turns/text_summary``).

``report_to=None`` (the configs' default) reads ``$AGENTRL_REPORT_TO`` (``agentrl run
--report-to tensorboard`` sets it for the notebook it runs), else "none". The folder: the
config's ``logging_dir``, else ``$AGENTRL_RUN_DIR/tensorboard`` in a pipeline run, else
``runs/tensorboard``; each training run inside it gets its own subfolder ``<desc>_<n>`` (a
notebook trains several arms). ``tensorboard`` is the optional extra ``agentrl[tensorboard]``,
imported only when asked for.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

REPORT_TO = ("none", "tensorboard")


def resolve_report_to(report_to: str | None) -> str:
    value = report_to if report_to is not None else os.environ.get("AGENTRL_REPORT_TO") or "none"
    if value not in REPORT_TO:
        raise ValueError(f"report_to must be one of {REPORT_TO} (or None), got {value!r}")
    return value


def resolve_logging_dir(logging_dir: str | None, desc: str) -> Path:
    """A fresh subfolder ``<desc>_<n>`` of the base folder (module docstring)."""
    run_dir = os.environ.get("AGENTRL_RUN_DIR")
    base = Path(logging_dir or (Path(run_dir) / "tensorboard" if run_dir else "runs/tensorboard"))
    n = 0
    while (base / f"{desc}_{n}").exists():
        n += 1
    return base / f"{desc}_{n}"


def _cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ⏎ ")


def episodes_markdown(episodes, num_episodes: int = 4) -> str:
    """A markdown table per episode, one line per turn (what TensorBoard's text tab shows).

    >>> from agentrl_lib.rollout import Episode
    >>> ep = Episode.of(["s0", "s1"], [0.0, 1.0], actions=["left", "up"], observations=["a", "b|c"])
    >>> print(episodes_markdown([ep]))
    **episode 0** (group 0, return 1, 2 turns, ended by the task)
    <BLANKLINE>
    | turn | observation | action | reward | valid |
    | --- | --- | --- | --- | --- |
    | 0 | a | left | 0 | True |
    | 1 | b\\|c | up | 1 | True |
    """
    parts = []
    for i, ep in enumerate(episodes[:num_episodes]):
        end = "truncated" if ep.truncated else "ended by the task"
        lines = [f"**episode {i}** (group {ep.group_id}, return {sum(ep.rewards):.4g}, "
                 f"{len(ep)} turns, {end})", "",
                 "| turn | observation | action | reward | valid |",
                 "| --- | --- | --- | --- | --- |"]
        lines += [f"| {t} | {_cell(o)} | {_cell(a)} | {r:.4g} | {v} |" for t, (o, a, r, v) in
                  enumerate(zip(ep.observations, ep.actions, ep.rewards, ep.valid))]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def scalars(row: dict) -> dict:
    """The row's numbers (bools as 0/1) other than ``iter``; NaN and lists are left out."""
    out = {}
    for k, v in row.items():
        if k == "iter" or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            continue
        out[k] = float(v)
    return out


class Writer:
    """``torch.utils.tensorboard.SummaryWriter`` over one training run's folder."""

    def __init__(self, log_dir: str | Path, num_episodes: int = 4):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch imports it only when tensorboard is installed
            raise ImportError("report_to='tensorboard' needs the tensorboard package: "
                              "pip install 'agentrl[tensorboard]'") from e
        self.log_dir = Path(log_dir)
        self.num_episodes = num_episodes
        self._w = SummaryWriter(log_dir=str(self.log_dir))

    def log_row(self, row: dict, batch=None) -> None:
        step = int(row.get("iter", 0))
        for k, v in scalars(row).items():
            self._w.add_scalar(k, v, step)
        episodes = getattr(batch, "episodes", None)
        if episodes and any(k.startswith("eval/") for k in row):
            self._w.add_text("rollouts/turns", episodes_markdown(episodes, self.num_episodes),
                             step)

    def close(self) -> None:
        self._w.close()
