"""``agentrl new NN_name --module m --family F``: the files a new paper needs, in the house layout.

Writes ``notebooks/NN_name.ipynb`` (STYLE.md's sections 0-7 as a skeleton that already runs: a
placeholder objective on a three-armed bandit, to be replaced by the paper's), the module
``agentrl_lib/algorithms/<m>.py`` (its docstring names the paper, the equations, and what was
taken from the paper, from the code, or inferred), its test ``tests/test_<m>.py``, the profiles
``reproductions/NN_name/profiles.yaml``, and regenerates the README's notebook map. It refuses to
overwrite a file that exists.
"""

from __future__ import annotations

import hashlib

import json
import re
from pathlib import Path

from agentrl_lib.pipeline.notebooks import PipelineError

PARAMETERS = '''seed: int = 0  # random seed (python, numpy, torch)
profile: str = "ci"  # which profile these values are; set by `agentrl run --profile`
num_iters: int = 30  # exact gradient steps per run
lrs: list = [0.1, 0.3, 1.0]  # the lr sweep, the same for every arm (pipeline.tuning.pick_lr)
tuning_seeds: list = [100, 101]  # seeds of the lr sweep, never a judged seed
margin: float = 0.05  # the claim's margin, written before the judging runs'''

SETUP = '''import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown

from agentrl_lib.algorithms import {m}
from agentrl_lib.exercises import check
from agentrl_lib.pipeline.results import (
    assert_claims, claim, params_from, print_claims, save_figure, verdict, write_results,
)
from agentrl_lib.pipeline.tuning import pick_lr
from agentrl_lib.utils import set_seed

NOTEBOOK = "{stem}"
set_seed(seed)
params = params_from(globals())  # every parameter, as run
print(params)'''

BACKGROUND = r'''## 2. Background
TODO: the paper in a few sentences: the problem, the idea, the baseline it beats.

> **Quick facts.** *What it is:* TODO. *On- or off-policy:* TODO. *What it needs:* TODO.
> *What the paper reports:* TODO (section, table).

The key equation (placeholder: the expected reward of a softmax policy over arms):
$$J(\theta) = \sum_a \pi_\theta(a)\, r(a), \qquad \pi_\theta = \mathrm{softmax}(\theta).$$

> **Pseudocode** (the paper's notation)
> 1. for each iteration: compute $J(\theta)$ and its gradient
> 2. $\theta \leftarrow \theta + \eta \nabla_\theta J$

**What we will check:** TODO: the paper's claim, against which baseline, at what margin.

| detail | value | taken from |
|---|---|---|
| TODO: the objective | eq. (TODO) | the paper (section TODO) |
| TODO: a default | TODO | the code (repository, file, function) |
| TODO: an unstated choice | TODO | inferred (what was searched) |'''

BUILD = '''rewards = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)  # (A,)
theta = torch.zeros(3, dtype=torch.float64)  # (A,)
probs = torch.softmax(theta, dim=0)  # (A,)
J = (probs * rewards).sum()
assert abs(J.item() - 0.5) < 1e-12  # by hand: (0 + 0.5 + 1) / 3
J'''

SAME = '''for trial in range(5):
    g = torch.Generator().manual_seed(trial)
    p = torch.softmax(torch.randn(4, generator=g, dtype=torch.float64), dim=0)
    r = torch.rand(4, generator=g, dtype=torch.float64)
    assert torch.allclose((p * r).sum(), {m}.objective(p, r)[0])
print("the from-scratch objective equals the library's")'''

TRAIN = '''ARMS = {{"ours": 1.0, "baseline": 0.1}}  # placeholder arms: a step-size multiplier each


def run(arm, lr, run_seed):
    return {m}.train(rewards, lr * ARMS[arm], num_iters, run_seed)  # J after each step


sweep = {{(arm, lr): [run(arm, lr, s)[-1] for s in tuning_seeds] for arm in ARMS for lr in lrs}}
best_lr = {{arm: pick_lr({{lr: sweep[arm, lr] for lr in lrs}}) for arm in ARMS}}
curves = {{arm: run(arm, best_lr[arm], seed) for arm in ARMS}}
control = run("ours", 0.0, seed)  # the negative control: lr = 0 learns nothing
fig, ax = plt.subplots(figsize=(5, 3))
for arm, ys in curves.items():
    ax.plot(ys, label=f"{{arm}} (lr {{best_lr[arm]:g}})")
ax.set_xlabel("update")
ax.set_ylabel("J")
ax.legend()
save_figure(fig, "curves", NOTEBOOK, seed)
best_lr'''

POWER = '''## 6. Did it work?
**Power plan** (written before the judging runs): TODO: the panel (here J is exact, no panel),
the seeds, the rollouts per arm, the positive control (the baseline must learn beyond noise), the
margin (`margin`) and the smallest difference the seeds can detect.'''

CLAIMS = '''metrics = {{"J/ours": curves["ours"][-1], "J/baseline": curves["baseline"][-1],
           "J/control": control[-1], "best_lr": best_lr}}
claims = [claim("ours_beats_baseline", "TODO: the paper's claim, in one line", "J/ours",
                curves["ours"][-1], curves["baseline"][-1], ">", margin=margin,
                paper_value="TODO", source="TODO: table or section", kind="paper",
                control=control[-1])]
print_claims(claims)
write_results(NOTEBOOK, params, metrics, claims)
assert_claims(claims)
assert all(c.control_fails for c in claims if c.control is not None), "a control passed"'''

READING = '''c = claims[0]
Markdown(f"*This run* (`{{profile}}`, seed {{seed}}): J = {{c.ours:.3f}} for ours against "
         f"{{c.baseline:.3f}} for the baseline (control {{c.control:.3f}}); the claim {{verdict(c)}}.")'''

EXERCISE = '''def my_objective(probs, rewards):
    raise NotImplementedError  # your code here: J and a metrics dict, as the library returns


check(lambda p, r: my_objective(p, r)[0], lambda p, r: {m}.objective(p, r)[0],
      lambda rng: (torch.softmax(torch.tensor(rng.normal(size=4)), dim=0),
                   torch.tensor(rng.uniform(size=4))))'''

MODULE = '''"""TODO: the paper's title (authors, year, https://arxiv.org/abs/TODO): what it does in one line.

Equations (the paper's numbering), as implemented here:
    (TODO)  J(theta) = sum_a pi_theta(a) r(a)   [placeholder: replace with the paper's objective]

Taken from the paper: TODO (section, equation).
Taken from the released code: TODO (repository, file, function).
Inferred: TODO (what the paper leaves open, and what was searched).

Shapes: A actions.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def objective(probs: Tensor, rewards: Tensor) -> tuple[Tensor, dict]:
    """J = sum_a pi(a) r(a), eq. (TODO). probs, rewards: (A,) -> (J, metrics).

    >>> objective(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0]))[0].item()
    0.5
    """
    value = (probs * rewards).sum()
    return value, {{"objective": value.item()}}


def train(rewards: Tensor, lr: float, num_iters: int, seed: int) -> list[float]:
    """Exact gradient ascent on softmax logits from a seeded random start; J after each step."""
    g = torch.Generator().manual_seed(seed)
    theta = (0.1 * torch.randn(rewards.shape[0], generator=g, dtype=rewards.dtype))
    theta.requires_grad_(True)
    out = []
    for _ in range(num_iters):
        value, _ = objective(torch.softmax(theta, dim=0), rewards)
        (grad,) = torch.autograd.grad(value, theta)
        with torch.no_grad():
            theta += lr * grad
        out.append(value.item())
    return out
'''

TEST = '''"""agentrl_lib.algorithms.{m}: hand-computed values and one training run."""

import torch

from agentrl_lib.algorithms import {m}


def test_objective_by_hand():
    value, metrics = {m}.objective(torch.tensor([0.25, 0.75]), torch.tensor([1.0, 0.0]))
    assert value.item() == 0.25 and metrics == {{"objective": 0.25}}


def test_training_increases_the_objective_and_lr_zero_does_not():
    rewards = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    ys = {m}.train(rewards, lr=1.0, num_iters=20, seed=0)
    assert ys[-1] > ys[0] + 0.1
    flat = {m}.train(rewards, lr=0.0, num_iters=5, seed=0)
    assert max(flat) == min(flat)
'''

PROFILES = '''# Overrides of notebooks/{stem}.ipynb's parameters cell (its defaults are the `ci` profile).
cpu:   # minutes on a laptop: the claim at full strength
  num_iters: 100
gpu:   # a lent GPU
  num_iters: 300
'''


def _cell(kind: str, text: str, tags: list[str] | None = None) -> dict:
    cell = {"cell_type": kind, "metadata": {"tags": tags} if tags else {},
            "source": text.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def notebook(stem: str, module: str, family: str) -> dict:
    """The notebook skeleton: STYLE.md's sections, runnable as written."""
    f = {"m": module, "stem": stem}
    md, code = (lambda t: _cell("markdown", t)), (lambda t: _cell("code", t.format(**f)))
    cells = [
        md(f"# {stem}: TODO the title\nTODO: one paragraph: what this chapter builds and checks."),
        _cell("code", PARAMETERS, ["parameters"]),
        md("## 1. Setup"), code(SETUP),
        md(BACKGROUND),
        md("## 3. Build it step by step\nThe objective by hand on three arms."), code(BUILD),
        md(f"## 4. Same as the library\nThe from-scratch piece equals\n"
           f"`agentrl_lib.algorithms.{module}` on random inputs."), code(SAME),
        md("## 5. Train\nEvery arm gets the same lr sweep on the tuning seeds, picked by the\n"
           "library's one rule (`pipeline.tuning.pick_lr`); the judged seed is never looked at\n"
           "while choosing."), code(TRAIN),
        md(POWER), code(CLAIMS),
        md("**Reading the result** (rendered from this run's numbers)."), code(READING),
        md("## 7. Exercises and references\n1. TODO: a variant to try.\n2. *Checked:* write "
           "the objective; `check` compares it with the library's on random inputs.\n\n"
           "Reference: TODO (the paper's link and its numbers)."), code(EXERCISE),
    ]
    for i, cell in enumerate(cells):  # nbformat 4.5: a unique id each, the same at every run
        cell["id"] = hashlib.sha1(f"{stem}/{i}".encode()).hexdigest()[:8]
    meta = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
            "agentrl": {"title": f"TODO: the title of {stem}", "paper": "TODO: the paper's title",
                        "url": "https://arxiv.org/abs/TODO",
                        "modules": [f"agentrl_lib.algorithms.{module}",
                                    "agentrl_lib.pipeline.tuning"],
                        "claim": "TODO: the claim checked, against which baseline",
                        "family": family}}
    return {"cells": cells, "metadata": meta, "nbformat": 4, "nbformat_minor": 5}


def new_paper(root: Path, stem: str, module: str, family: str) -> list[Path]:
    """Write the notebook, module, test and profiles of a new paper and regenerate the README
    map; return the paths written."""
    if not re.fullmatch(r"\d\d_[a-z0-9_]+", stem):
        raise PipelineError(f"notebook name {stem!r}: expected NN_short_name (e.g. 99_demo)")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", module):
        raise PipelineError(f"module name {module!r}: expected a python identifier")
    f = {"m": module, "stem": stem}
    files = {root / "notebooks" / f"{stem}.ipynb": json.dumps(notebook(stem, module, family),
                                                             indent=1, ensure_ascii=False) + "\n",
             root / "agentrl_lib" / "algorithms" / f"{module}.py": MODULE.format(**f),
             root / "tests" / f"test_{module}.py": TEST.format(**f),
             root / "reproductions" / stem / "profiles.yaml": PROFILES.format(**f)}
    there = [str(p) for p in files if p.exists()]
    if there:
        raise PipelineError(f"refusing to overwrite: {', '.join(there)}")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return [*files, write_readme_map(root)]


def write_readme_map(root: Path) -> Path:
    """Regenerate the README's generated parts (the notebook map and the library layout,
    ``pipeline/readme.py``), so the new notebook and module appear in both."""
    from agentrl_lib.pipeline.readme import fill, generated_parts

    path = root / "README.md"
    path.write_text(fill(path.read_text(), generated_parts(root)))
    return path
