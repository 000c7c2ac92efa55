"""What a notebook writes at its end: ``results.json``, its claims and its figures.

A notebook calls, in its "Did it work?" section::

    claims = [claim("faster", "GiGPO learns faster than GRPO", "success@200", ours, base, ">",
                    margin=0.05, paper_value="+12% ALFWorld")]
    print_claims(claims)                               # one line per claim
    write_results(NOTEBOOK, params, metrics, claims)   # first: nothing computed is lost ...
    assert_claims(claims)                              # ... then the run fails if a claim fails

where ``params = params_from(globals())`` (in the setup cell) holds every declared parameter;
the "Reading the result" prose words each claim with ``verdict(c)``. In the ``cpu`` and ``gpu``
profiles only sanity and theorem claims are asserted (``asserted_in``): a paper, extension or
design claim that fails there is a result, and ``write_results`` records it as reported.

``read_results`` reads a ``results.json`` back and says what is wrong with one that is empty,
truncated, not JSON or of the wrong shape (``results_problem``), for the report and the sweep.

A learning curve goes into ``metrics`` as ``metrics["curve/<name>"] = learning_curve(values,
steps)``; the report shows its start, peak and final and flags a collapsed run (``curve_summary``).

The run directory is ``pipeline.paths.current_run_dir``: ``$AGENTRL_RUN_DIR`` when ``agentrl run``
executes the notebook, else ``$AGENTRL_RUNS_ROOT/interactive/<notebook>/seed<S>``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from agentrl_lib.pipeline.notebooks import parameters_source, parse_parameters
from agentrl_lib.pipeline.paths import current_run_dir

_START = time.time()
DIRECTIONS = (">", "<", ">=", "<=", "~")
KINDS = ("paper", "extension", "sanity", "theorem", "design")
"""paper: the paper's claim against its baseline (the only kind counted as a paper reproducing;
with ``paper_id``, a second paper's claim, counted for that paper); extension: the notebook's own
finding or ablation (reported, never counted as the paper's); sanity: plumbing or equality
checks; theorem: true by mathematics; design: true by construction (never a training outcome)"""
COUNTED = ("paper", "extension")
"""kinds whose verdicts are read as findings: a tolerance agreement among them needs a control"""
SCALE_PROFILES = ("cpu", "gpu")
ASSERTED_AT_SCALE = ("sanity", "theorem")
"""In the ``cpu`` and ``gpu`` profiles (the published runs) only these kinds are asserted (issue
29, section 3): a paper, extension or design claim that fails there is reported, not an error that
ends the run (``make report`` exits 1 only when a run crashed). A failing ``design`` claim is a
bug, but the report shows it with its numbers and ``ci`` (where every claim written
``asserted=True`` is asserted, as the notebook says) catches it in ``make test``."""
_PROFILE: list[str] = []
"""the profile of the last ``write_results`` of this process (``assert_claims`` follows it)"""


def asserted_in(c: Claim, profile: str) -> bool:
    """Whether ``c`` is asserted in ``profile`` (``ASSERTED_AT_SCALE``).

    >>> c = claim("beats", "s", "acc", 0.4, 0.5, ">", kind="paper")
    >>> asserted_in(c, "ci"), asserted_in(c, "cpu")
    (True, False)
    >>> asserted_in(claim("eq", "s", "x", 1.0, 1.0, "~", kind="sanity"), "gpu")
    True
    """
    return bool(c.asserted) and (profile not in SCALE_PROFILES or c.kind in ASSERTED_AT_SCALE)


AGREEMENT_ID = re.compile(r"(?:^|_)(?:equal|equals|match|matches|agree|agrees|same)(?:_|$)")
"""a claim id that names an agreement ('scratch_equals_library', 'ppo_matches_grpo'): written
'~' with the tolerance as margin, never '<' or '<=' a tolerance (which dodges the control rule)"""


@dataclass
class Claim:
    """One checkable statement. ``holds`` is computed by ``claim``; ``asserted=False`` marks a
    claim the notebook reports but does not expect to reproduce at this scale (said in prose).
    ``control``: the same metric of a negative-control arm (lr = 0, shuffled rewards, ...) that
    must fail the claim's rule; ``control_fails`` records whether it did (None: no control). A
    claim whose control passes too holds but is no evidence (``evidence``)."""

    id: str
    statement: str
    metric: str
    ours: float
    baseline: float | None
    direction: str
    margin: float
    paper_value: str | float | None
    holds: bool
    asserted: bool = True
    source: str | None = None  # where in the paper paper_value comes from ("abstract", "Table 2")
    kind: str = "paper"
    """one of ``KINDS``"""
    post_hoc: bool = False
    """judged on a seed looked at while choosing something it depends on (set by
    ``mark_post_hoc`` from the notebook's ``looked_at`` records, in ``write_results``)"""
    control: float | None = None
    control_fails: bool | None = None
    paper_id: str | None = None
    """a second paper's claim: that paper's catalog id (``../shared/papers/catalog.csv``, column
    id); None: the notebook's own paper"""
    looked_at: str | None = None
    """why it is post hoc: which seeds were looked at while choosing what"""
    power: dict | None = None
    """what the verdict can see, planned before the runs (``power_plan``): panel episodes (or
    'exact'), the per-seed standard error, seeds, the minimal detectable difference ``mdd``; or
    (and) ``bound``, the floor ('<') or ceiling ('>') of the metric (``out_of_reach``)"""
    positive_control: dict | None = None
    """the baseline (or a reference arm) against its own start (``positive_control``): whether it
    moved beyond panel noise; a comparison whose baseline did not learn has no power"""

    @property
    def evidence(self) -> bool:
        """Holds, and its negative control (if any) fails the same rule."""
        return self.holds and self.control_fails is not False


def claim(id: str, statement: str, metric: str, ours: float, baseline: float | None,
          direction: str = ">", margin: float = 0.0, paper_value=None,
          asserted: bool = True, source: str | None = None, *, kind: str,
          post_hoc: bool = False, control: float | None = None,
          paper_id: str | None = None, power: dict | None = None,
          positive_control: dict | None = None) -> Claim:
    """Build a claim and decide it. ``kind`` is required (one of ``KINDS``); ``control`` is the
    metric of a negative-control arm, judged by the same rule against the same baseline (it
    should fail: then ``control_fails`` is True). ``paper_id``: the catalog id of a second
    paper whose claim this is (kind 'paper' only). ``post_hoc=True`` marks a claim post hoc on
    every seed, so no seed can ever judge it (for tests and scripts; a notebook records
    ``looked_at``, which names the seeds, and the registry sets ``post_hoc`` from it). ``power``: the
    plan written before the runs (``power_plan``); ``positive_control``: the baseline against its
    start (``positive_control``); with either, the report reads the verdict as "no power" where
    ``no_power`` says why.

    A non-inferiority claim (ours may be somewhat below the baseline) is written as a negative
    ``margin`` on '>' (or '<'), never as a baseline shifted before the call: the report can only
    see the margin, and reports such a ``paper`` claim, like every '~' claim, as "not evidence"
    unless a control fails it.

    Agreement within a tolerance has one form, whatever the sign of what is compared: '~' with
    the tolerance as ``margin`` (a difference against baseline 0, or ours against the baseline)
    and a ``control`` that must fail it. ValueError, one line naming the problem, for: an unknown
    kind or direction; ``paper_id`` on another kind; an id naming an agreement (``AGREEMENT_ID``)
    written '<' or '<=' a tolerance; a '~' claim of a counted kind (``COUNTED``) with a margin
    but no control.

    direction: '>' ours > baseline + margin; '<' ours < baseline - margin; '>=' ours >= baseline
    (a bar to reach; margin unused); '<=' ours <= baseline; '~' |ours - baseline| <= margin.

    >>> claim("c", "beats", "acc", 0.9, 0.5, ">", margin=0.1, kind="paper").holds
    True
    >>> claim("c", "similar", "acc", 0.62, 0.5, "~", margin=0.1, kind="sanity").holds
    False
    >>> c = claim("c", "agrees", "acc", 0.52, 0.5, "~", margin=0.1, kind="paper", control=0.45)
    >>> c.holds, c.control_fails, c.evidence
    (True, False, False)
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"claim {id!r}: unknown direction {direction!r}; expected one of "
                         f"{DIRECTIONS}")
    if kind not in KINDS:
        raise ValueError(f"claim {id!r}: unknown claim kind {kind!r}; expected one of {KINDS}")
    if paper_id is not None and kind != "paper":
        raise ValueError(f"claim {id!r}: paper_id={paper_id!r} names a second paper's claim, "
                         f"which is kind 'paper', not {kind!r}")
    if direction in ("<", "<=") and AGREEMENT_ID.search(id):
        raise ValueError(f"claim {id!r}: an agreement within a tolerance is written '~' with "
                         f"margin=<tolerance> and control=, not {direction!r} a tolerance")
    if direction == "~" and margin > 0 and control is None and kind in COUNTED:
        raise ValueError(f"claim {id!r}: a {kind} agreement within a tolerance needs control= "
                         f"(an arm that must fail it)")
    holds = _rule(float(ours), baseline, direction, margin)
    control_fails = None if control is None else not _rule(float(control), baseline, direction,
                                                           margin)
    return Claim(id, statement, metric, float(ours), None if baseline is None else float(baseline),
                 direction, float(margin), paper_value, holds, asserted, source, kind,
                 bool(post_hoc), None if control is None else float(control), control_fails,
                 paper_id, None, power, positive_control)


def power_plan(panel, seeds: int, p: float = 0.5, alpha: float = 0.05,
               power: float = 0.8) -> dict:
    """The power plan of a claim on a success rate, written before the judging runs.

    panel: episodes of the evaluation panel per seed, or "exact" (no sampling noise); p: the
    planned success rate (0.5 is the worst case). The per-seed standard error is
    se = sqrt(p (1 - p) / panel); the paired difference of two arms on one seed then has standard
    deviation sqrt(2) se (panel noise only: seed-to-seed training noise adds to it, so this is the
    best case), and a one-sided t-test on ``seeds`` paired differences at level alpha/2 detects,
    with probability ``power``, a true difference of

        mdd = (t_{n-1, 1-alpha/2} + t_{n-1, power}) * sqrt(2) * se / sqrt(n).

    >>> plan = power_plan(256, 3, p=0.5)  # se 0.03125; t_{2,0.975} = 4.303, t_{2,0.8} = 1.061
    >>> plan["se"], round(plan["mdd"], 4)
    (0.03125, 0.1368)
    >>> power_plan("exact", 3)["mdd"]
    0.0
    """
    from scipy.stats import t

    if seeds < 2:
        raise ValueError(f"a power plan needs at least 2 seeds, got {seeds}")
    if panel == "exact":
        return {"panel": "exact", "se": 0.0, "seeds": int(seeds), "mdd": 0.0}
    if int(panel) < 1 or not 0.0 <= p <= 1.0:
        raise ValueError(f"power_plan needs panel >= 1 episodes and p in [0, 1], got {panel}, {p}")
    se = math.sqrt(p * (1 - p) / int(panel))
    k = float(t.ppf(1 - alpha / 2, seeds - 1) + t.ppf(power, seeds - 1))
    return {"panel": int(panel), "se": se, "seeds": int(seeds),
            "mdd": k * math.sqrt(2) * se / math.sqrt(seeds)}


def positive_control(start: float, final: float, panel: int, k: float = 3.0,
                     higher_is_better: bool = True) -> dict:
    """Did the baseline move beyond panel noise from its start? ``moved`` when it improved by more
    than k * sqrt(SE_start^2 + SE_final^2), binomial SEs over ``panel`` episodes (the
    positive-control rule of ``reproductions/bases/positive_controls.py``). Both values are rates
    in [0, 1]; for a rate where lower is better (an error rate), pass ``higher_is_better=False``,
    never the negated rates (their binomial SE would read 0).

    >>> positive_control(0.50, 0.65, 256)["moved"], positive_control(0.50, 0.60, 256)["moved"]
    (True, False)
    >>> positive_control(0.50, 0.35, 256, higher_is_better=False)["moved"]
    True
    """
    se = math.hypot(math.sqrt(max(start * (1 - start), 0.0) / panel),
                    math.sqrt(max(final * (1 - final), 0.0) / panel))
    gain = final - start if higher_is_better else start - final
    return {"start": float(start), "final": float(final), "panel": int(panel), "k": float(k),
            "moved": bool(gain > k * se)}


UNDECIDABLE = ("its positive control", "the baseline")
"""How the ``no_power`` reasons that no interval can overrule begin: a control that did not learn,
a baseline that leaves no room for the margin (``report.summarise`` keeps these even when the
seeds' interval looks decided)."""


def out_of_reach(ours_bound, baseline, direction: str, margin: float) -> str:
    """Why a claim could not have held whatever the method did ('' when it could): a '<' claim
    whose baseline sits within its margin of the metric's floor (a share of dead groups that is
    already near 0), or a '>' claim whose baseline sits within its margin of the ceiling (a success
    rate near 1). ``ours_bound``: the floor (for '<') or the ceiling (for '>') of the metric.

    >>> why = out_of_reach(0.0, 0.013, "<", 0.05)
    >>> why[:61], why.endswith(": the claim could not have held")
    ('the baseline 0.013 leaves less than the margin 0.05 above the', True)
    >>> out_of_reach(0.0, 0.58, "<", 0.05), out_of_reach(1.0, 0.9, ">", 0.05)
    ('', '')
    """
    if baseline is None or ours_bound is None or direction not in (">", "<"):
        return ""
    b, m, bound = float(baseline), abs(float(margin)), float(ours_bound)
    if direction == "<" and b - m <= bound:
        side = "above the metric's floor"
    elif direction == ">" and b + m >= bound:
        side = "below the metric's ceiling"
    else:
        return ""
    return (f"the baseline {b:.3g} leaves less than the margin {m:.3g} {side} {bound:.3g}: "
            f"the claim could not have held")


def no_power(c) -> str:
    """Why a claim's verdict carries no power ('' when it does, or when it records no plan): its
    positive control did not move, its baseline leaves no room for the margin before the metric's
    bound (``power={"bound": ...}``: ``out_of_reach``), or its minimal detectable difference
    exceeds its margin (for '>', '<' and '~' claims with a margin). ``c``: a ``Claim`` or its dict
    from results.json.

    >>> no_power({"margin": 0.05, "direction": ">", "power": {"mdd": 0.14}})
    'the minimal detectable difference 0.14 exceeds the margin 0.05'
    >>> no_power({"margin": 0.05, "direction": ">", "positive_control": {"moved": False}})
    'its positive control did not move beyond panel noise'
    >>> no_power({"margin": 0.05, "direction": "<", "baseline": 0.0, "power": {"bound": 0.0}})[:31]
    'the baseline 0 leaves less than'
    """
    get = c.get if isinstance(c, dict) else lambda k, d=None: getattr(c, k, d)
    pc, plan = get("positive_control"), get("power")
    if pc is not None and not pc.get("moved"):
        return "its positive control did not move beyond panel noise"
    margin = abs(get("margin") or 0.0)
    if plan is not None and "bound" in plan:
        why = out_of_reach(plan["bound"], get("baseline"), get("direction"), margin)
        if why:
            return why
    if (plan is not None and "mdd" in plan and get("direction") in (">", "<", "~")
            and plan["mdd"] > margin):
        return (f"the minimal detectable difference {plan['mdd']:.3g} exceeds the margin "
                f"{margin:.3g}")
    return ""


@dataclass
class LookedAt:
    """Seeds looked at while choosing something (a margin, a setting, a potential, a mode, an
    lr): a claim judged on one of them is post hoc (``mark_post_hoc``)."""

    seeds: list[int]
    what: str
    claims: list[str] | None = None
    """ids of the claims the choice bears on; None: every claim of the notebook"""


def looked_at(seeds, what: str, claims=None) -> LookedAt:
    """Record that ``seeds`` were looked at while choosing ``what``; pass the records to
    ``write_results(..., looked_at=[...])``, which marks each claim judged on one of those seeds
    post hoc and saves the records in results.json. ``claims``: the ids the choice bears on
    (default every claim).

    >>> looked_at(range(2), "adv_mode", claims=["beats"])
    LookedAt(seeds=[0, 1], what='adv_mode', claims=['beats'])
    """
    seeds = [int(s) for s in ([seeds] if isinstance(seeds, int) else seeds)]
    if not seeds or not what:
        raise ValueError("looked_at needs the seeds looked at and what was chosen")
    return LookedAt(seeds, what, None if claims is None else list(claims))


def mark_post_hoc(claims: list[Claim], records: list[LookedAt], seed: int) -> list[Claim]:
    """Set ``post_hoc`` (and ``looked_at``, the reason) on every claim this run (``seed``) judges
    on a seed looked at while choosing something it depends on; the others are left as they
    are. Returns ``claims`` (changed in place).

    >>> cs = [claim("a", "s", "m", 1, 0, kind="paper"), claim("b", "s", "m", 1, 0, kind="paper")]
    >>> [c.post_hoc for c in mark_post_hoc(cs, [looked_at([0], "margin", ["a"])], seed=0)]
    [True, False]
    >>> cs[0].looked_at
    'seeds 0 looked at while choosing margin'
    """
    ids = {c.id for c in claims}
    for r in records:
        unknown = sorted(set(r.claims or ()) - ids)
        if unknown:
            raise ValueError(f"looked_at({r.what!r}) names claims that do not exist: {unknown}")
    for c in claims:
        whys = [f"seeds {', '.join(map(str, r.seeds))} looked at while choosing {r.what}"
                for r in records if int(seed) in r.seeds and (r.claims is None or c.id in r.claims)]
        if whys:
            c.post_hoc, c.looked_at = True, "; ".join(whys)
    return claims


def _rule(ours: float, baseline: float | None, direction: str, margin: float) -> bool:
    """The claim's rule: ours against baseline by direction and margin (False on a missing value)."""
    ours = float(ours)
    b = None if baseline is None else float(baseline)
    if b is None or math.isnan(ours) or math.isnan(b):
        holds = False
    elif direction == ">":
        holds = ours > b + margin
    elif direction == "<":
        holds = ours < b - margin
    elif direction == ">=":
        holds = ours >= b
    elif direction == "<=":
        holds = ours <= b
    else:
        holds = abs(ours - b) <= margin
    return bool(holds)


COLLAPSE_MARGIN = 0.05
"""A run has *collapsed* when its learning curve ends worse than it started by more than
``COLLAPSE_MARGIN * scale``, where ``scale`` is the width of the metric's range: 1 for rates and
accuracies in [0, 1] (so 0.05 absolute, five points of accuracy), 500 for CartPole's return, log V
for a next-token loss. Chosen when this convention was written, before any curve was summarised
with it: it is the smallest drop we would call a failure of training rather than evaluation noise
on a panel of a few hundred problems (the standard error of an accuracy near 0.5 on 200 problems
is 0.035). It is not tuned to any notebook's results and must not be."""


def learning_curve(values, steps, *, scale: float = 1.0, higher_is_better: bool = True) -> dict:
    """A learning curve, stored as ``metrics["curve/<name>"]`` (a dict, so that the x-axis lists
    older notebooks keep under ``curve/...`` are not mistaken for curves).

    values: one run's values at ``steps`` (a list), or several runs of one arm within this seed (a
    list of lists, each as long as ``steps``); scale: the width of the metric's range (see
    ``COLLAPSE_MARGIN``); higher_is_better: False for a loss.

    >>> learning_curve([0.1, 0.5], steps=[0, 100])
    {'steps': [0.0, 100.0], 'values': [0.1, 0.5], 'scale': 1.0, 'higher_is_better': True}
    """
    steps = [float(x) for x in steps]
    rows = [values] if _is_flat(values) else list(values)
    rows = [[float(v) for v in row] for row in rows]
    bad = [len(r) for r in rows if len(r) != len(steps)]
    if bad or not steps:
        raise ValueError(f"a curve needs one value per step: {len(steps)} steps, runs of length "
                         f"{[len(r) for r in rows]}")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    return {"steps": steps, "values": rows[0] if _is_flat(values) else rows, "scale": float(scale),
            "higher_is_better": bool(higher_is_better)}


def curve_summary(curve: dict, margin: float = COLLAPSE_MARGIN) -> list[dict]:
    """Per run of a ``learning_curve``: start (first value), peak (the best value: the largest, or
    the smallest for a loss) and its step, final (last value), and whether the run collapsed:
    final worse than start by more than ``margin * scale``.

    >>> [r["collapsed"] for r in curve_summary(learning_curve([[0.5, 0.9, 0.44], [0.5, 0.9, 0.46]],
    ...                                                       steps=[0, 1, 2]))]
    [True, False]
    >>> loss = learning_curve([4.6, 1.2, 1.5], [0, 10, 20], scale=4.6, higher_is_better=False)
    >>> curve_summary(loss)
    [{'start': 4.6, 'peak': 1.2, 'peak_step': 10.0, 'final': 1.5, 'collapsed': False}]
    """
    values = curve["values"]
    rows = [values] if _is_flat(values) else values
    sign = 1.0 if curve.get("higher_is_better", True) else -1.0
    drop = margin * float(curve.get("scale", 1.0))
    out = []
    for row in rows:
        a = sign * np.asarray(row, dtype=float)
        i = int(np.nanargmax(a))
        out.append({"start": float(row[0]), "peak": float(row[i]),
                    "peak_step": float(curve["steps"][i]), "final": float(row[-1]),
                    "collapsed": bool(a[-1] < a[0] - drop)})
    return out


def _is_flat(values) -> bool:
    return all(not isinstance(v, (list, tuple)) and getattr(v, "ndim", 0) == 0 for v in values)


def save_figure(fig, name: str, notebook: str, seed: int) -> Path:
    """Save a matplotlib figure as ``<run dir>/figures/<name>.png``."""
    out = current_run_dir(notebook, seed) / "figures"
    out.mkdir(exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def package_versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("agentrl", "torch", "numpy", "gymnasium", "transformers", "trl", "papermill"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    commit = out.stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def device_name() -> str:
    """The device a run's numbers came from. On a CPU it names torch's kernel set (AVX512, AVX2,
    ...): the same code and seed repeat bit for bit on the same kernels, but another set rounds
    gradients differently in the last bits, and RL's sampling carries that into other trajectories
    (README, "The pipeline")."""
    arch = platform.processor() or platform.machine()
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)}"
        arch += f" {torch.backends.cpu.get_cpu_capability()}"
    except ImportError:
        pass
    return f"cpu: {arch}, {os.cpu_count()} cores"


def notebook_file(notebook: str) -> Path | None:
    """The notebook's ``.ipynb``: ``$AGENTRL_NOTEBOOK`` under ``agentrl run``, else
    ``<notebook>.ipynb`` in the working directory (nbval and Jupyter run a notebook from its own
    folder) or under ``notebooks/``; None when none is found."""
    candidates = [os.environ.get("AGENTRL_NOTEBOOK", ""), f"{notebook}.ipynb",
                  f"notebooks/{notebook}.ipynb"]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def notebook_meta(notebook: str) -> dict:
    """The ``agentrl`` block of the notebook's metadata (title, paper, url, ...), if findable."""
    path = notebook_file(notebook)
    meta = {} if path is None else json.loads(path.read_text()).get("metadata", {})
    return meta.get("agentrl", {})


def declared_parameters(notebook: str) -> list[str] | None:
    """The names in the notebook's cell tagged ``parameters``, in order (the pipeline's parser,
    ``notebooks.parse_parameters``); None when the notebook file is not found. The file's
    parameters cell is read, not papermill's injected cell: the pipeline injects only names the
    notebook declares."""
    path = notebook_file(notebook)
    if path is None or Path(path).stem != notebook:
        return None
    return list(parse_parameters(parameters_source(json.loads(path.read_text()))))


def params_from(namespace: dict, notebook: str | None = None) -> dict:
    """``params`` for ``write_results``: every parameter the notebook declares, with its value in
    ``namespace`` (the notebook's ``globals()``, so a value papermill injected is the one recorded),
    in the parameters cell's order. ``notebook``: its stem, default ``namespace["NOTEBOOK"]``.
    Call it where the old hand-written dict stood: the values are read when it is called.

    Raises LookupError when the notebook file cannot be found (then nothing could be checked) or
    a declared name is not defined in ``namespace``."""
    notebook = notebook or namespace["NOTEBOOK"]
    names = declared_parameters(notebook)
    if names is None:
        raise LookupError(f"cannot find {notebook}.ipynb (nor $AGENTRL_NOTEBOOK) to read its "
                          f"parameters cell")
    missing = [n for n in names if n not in namespace]
    if missing:
        raise LookupError(f"{notebook}: declared parameters not defined: {missing}")
    return {n: namespace[n] for n in names}


def verdict(c: Claim, *, failed: str = "does not hold", note: str | None = "always",
            reported: str = "reported, not asserted") -> str:
    """A claim's verdict in the "Reading the result" prose: 'holds' or ``failed``, then whether it
    was asserted: ``note='always'`` ('holds (asserted)'), ``'unasserted'`` (only ' (reported, not
    asserted)' after an unasserted claim) or None (no note); ``reported`` words the unasserted
    case. The keywords keep each notebook's wording ('does **not** hold', '(reported)').

    A claim that carries no power (``no_power``) reads "no power" with the reason, and what the
    rule gave on this seed.

    >>> c = claim("c", "beats", "acc", 0.4, 0.5, ">", kind="paper", asserted=False)
    >>> verdict(c), verdict(c, note="unasserted", reported="reported"), verdict(c, note=None)
    ('does not hold (reported, not asserted)', 'does not hold (reported)', 'does not hold')
    >>> verdict(claim("c", "beats", "acc", 0.6, 0.5, ">", margin=0.05, kind="paper",
    ...               power={"mdd": 0.14}), note=None)
    'no power (the minimal detectable difference 0.14 exceeds the margin 0.05; on this seed: holds)'
    """
    text = "holds" if c.holds else failed
    why = no_power(c)
    if why:
        text = f"no power ({why}; on this seed: {text})"
    if note == "always":
        return f"{text} ({'asserted' if c.asserted else reported})"
    if note == "unasserted":
        return text + ("" if c.asserted else f" ({reported})")
    if note is None:
        return text
    raise ValueError(f"note must be 'always', 'unasserted' or None, got {note!r}")


def claim_line(c: Claim) -> str:
    """One line per claim: verdict, asserted or reported, kind (and post hoc), id, metric, the
    rule with its numbers, and the control's outcome.

    >>> claim_line(claim("up", "s", "acc", 0.9, 0.5, ">", margin=0.1, kind="paper"))
    '[HOLDS] (asserted, paper) up: acc: ours=0.9 > baseline=0.5 (margin 0.1)'
    """
    flag = "asserted" if c.asserted else "reported"
    kind = c.kind + (f" of {c.paper_id}" if c.paper_id else "") + (", post hoc" if c.post_hoc
                                                                     else "")
    base = "None" if c.baseline is None else f"{c.baseline:.4g}"
    fails = "fails, as it must" if c.control_fails else "PASSES: no evidence"
    ctrl = "" if c.control is None else f"; control={c.control:.4g} ({fails})"
    return (f"[{'HOLDS' if c.holds else 'fails'}] ({flag}, {kind}) {c.id}: {c.metric}: "
            f"ours={c.ours:.4g} {c.direction} baseline={base} (margin {c.margin:.4g}){ctrl}")


def print_claims(claims: list[Claim]) -> None:
    """Print ``claim_line`` of each claim (the registry at a glance, before the asserts)."""
    for c in claims:
        print(claim_line(c))


def write_results(notebook: str, params: dict, metrics: dict, claims: list[Claim],
                  extra: dict | None = None, panel_hash=None,
                  looked_at: list[LookedAt] | None = None) -> Path:
    """Write ``results.json`` atomically (a temp file renamed into place) and return its path.

    ``looked_at``: the notebook's records of seeds looked at while choosing anything
    (``looked_at``); the claims judged on them are marked post hoc (``mark_post_hoc``, in place)
    and the records are saved under ``looked_at``.

    ``panel_hash``: the hash of the fixed evaluation panel (a string, or a dict of them), recorded
    as ``eval_panel_hash``; when not given, a ``panel_hash``/``panel_hashes`` metric is used, and
    notebooks evaluated exactly (tabular oracles, no sampled panel) record None.

    A parameter the notebook declares but ``params`` lacks raises ValueError once the file is
    written (``params_from`` builds a complete ``params``)."""
    seed = int(params.get("seed", 0))
    profile = str(params.get("profile", "ci"))
    for c in claims:  # what this profile will assert (asserted_in), as the file will say
        c.asserted = asserted_in(c, profile)
    _PROFILE[:] = [profile]
    mark_post_hoc(claims, looked_at or [], seed)
    meta = notebook_meta(notebook)
    payload = {
        "notebook": notebook,
        "title": meta.get("title"),
        "family": meta.get("family"),
        "paper": {"title": meta.get("paper"), "url": meta.get("url")},
        "profile": params.get("profile", "ci"),
        "point": os.environ.get("AGENTRL_POINT", ""),  # the sweep's grid point ("" if none)
        "seed": seed,
        "params": params,
        "metrics": metrics,
        "claims": [asdict(c) for c in claims],
        "looked_at": [asdict(r) for r in looked_at or []],
        "versions": package_versions(),
        "device": device_name(),
        "wall_s": round(time.time() - _START, 2),
        "git_commit": git_commit(),
        "argv": sys.argv[:1],
    }
    if extra:
        payload.update(extra)
    if panel_hash is None:
        panel_hash = payload.get("eval_panel_hash") or metrics.get("panel_hash") or \
            metrics.get("panel_hashes")
    payload["eval_panel_hash"] = panel_hash
    write_metrics_jsonl(current_run_dir(notebook, seed), metrics)
    path = current_run_dir(notebook, seed) / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=_default))
    os.replace(tmp, path)
    # after writing, so that a long run's numbers are kept; the run still fails
    dropped = [n for n in declared_parameters(notebook) or [] if n not in params]
    if dropped:
        raise ValueError(f"{notebook}: params lacks declared parameters {dropped}; build it with "
                         f"params_from(globals())")
    return path


def _is_num(v, none_ok: bool = False) -> bool:
    return (v is None and none_ok) or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _claim_problem(i: int, c) -> str:
    if not isinstance(c, dict):
        return f"claims[{i}] is {type(c).__name__}, not a mapping"
    cid = c.get("id")
    where = f"claim {cid!r}" if isinstance(cid, str) and cid else f"claims[{i}]"
    if not isinstance(cid, str) or not cid:
        return f"{where} has no string 'id'"
    for key in ("statement", "metric"):
        if not isinstance(c.get(key), str):
            return f"{where}: {key!r} is {c.get(key)!r}, not a string"
    if not isinstance(c.get("holds"), bool):
        return f"{where}: 'holds' is {c.get('holds')!r}, not true or false"
    for key in ("ours", "baseline", "control"):
        if not _is_num(c.get(key), none_ok=True):
            return f"{where}: {key!r} is {c.get(key)!r}, not a number"
    if "margin" in c and not _is_num(c["margin"]):
        return f"{where}: 'margin' is {c['margin']!r}, not a number"
    if "direction" in c and c["direction"] not in DIRECTIONS:
        return f"{where}: 'direction' is {c['direction']!r}, not one of {DIRECTIONS}"
    for key in ("power", "positive_control"):
        if c.get(key) is not None and not isinstance(c[key], dict):
            return f"{where}: {key!r} is {c[key]!r}, not a mapping"
    plan = c.get("power")
    if isinstance(plan, dict) and not (_is_num(plan.get("mdd")) or _is_num(plan.get("bound"))):
        return f"{where}: 'power' has neither a numeric 'mdd' nor a numeric 'bound'"
    return ""


def results_problem(data) -> str:
    """What is wrong with the parsed contents of a ``results.json`` ('' when nothing): the shape
    the report and the sweep rely on (a mapping with a notebook name, a list of claims each with
    an id, its words, 'holds' and numbers, learning curves that are curves).

    >>> results_problem([])
    'not a mapping (a list)'
    >>> results_problem({"notebook": "x", "claims": "x"})
    "'claims' is 'x', not a list"
    >>> results_problem({"notebook": "x", "claims": [{"id": "a", "statement": "s", "metric": "m",
    ...                  "holds": True, "ours": "abc", "baseline": 0}]})
    "claim 'a': 'ours' is 'abc', not a number"
    """
    if not isinstance(data, dict):
        desc = {list: "a list", str: "a string", type(None): "null", bool: "a boolean"}
        return f"not a mapping ({desc.get(type(data), 'a number')})"
    if not isinstance(data.get("notebook"), str) or not data["notebook"]:
        return f"'notebook' is {data.get('notebook')!r}, not a notebook name"
    for key in ("profile", "point"):
        if key in data and not isinstance(data[key], str):
            return f"{key!r} is {data[key]!r}, not a string"
    if data.get("seed") is not None and not (isinstance(data["seed"], int)
                                             and not isinstance(data["seed"], bool)):
        return f"'seed' is {data['seed']!r}, not an integer"
    for key in ("paper", "metrics", "params"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            return f"{key!r} is {data[key]!r}, not a mapping"
    if not isinstance(data.get("claims"), list):
        return f"'claims' is {data.get('claims')!r}, not a list"
    for i, c in enumerate(data["claims"]):
        problem = _claim_problem(i, c)
        if problem:
            return problem
    for name, v in (data.get("metrics") or {}).items():
        if str(name).startswith("curve/") and isinstance(v, dict) and "values" in v:
            try:
                curve_summary(v)
            except Exception as e:  # noqa: BLE001 - any malformed curve is reported, not raised
                return f"metrics[{name!r}] is not a learning curve ({type(e).__name__}: {e})"
    return ""


def read_results(path: Path | str) -> tuple[dict | None, str]:
    """(the parsed ``results.json``, '') or (None, what is wrong with it): unreadable, empty,
    not UTF-8, truncated or not JSON, or of the wrong shape (``results_problem``)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    if not raw.strip():
        return None, "is empty"
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return None, f"is not UTF-8 text (byte {e.start})"
    except json.JSONDecodeError as e:
        return None, f"is not valid JSON (line {e.lineno} column {e.colno}: {e.msg}; truncated?)"
    except RecursionError:
        return None, "is not valid JSON (nested too deeply)"
    problem = results_problem(data)
    return (None, f"has the wrong shape: {problem}") if problem else (data, "")


def write_metrics_jsonl(directory: Path, metrics: dict) -> Path:
    """``metrics.jsonl`` of the run: every list-valued metric (a curve) as rows
    ``{"series", "index", "value"}`` (a ``learning_curve`` adds ``"step"``, and ``"run"`` when it
    holds several runs), then one row ``{"final": {...scalars}}``. When the notebook already
    logged step by step with ``utils.MetricsLogger`` (same file), only the final row is
    appended."""
    path = Path(directory) / "metrics.jsonl"
    scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) or
               (hasattr(v, "item") and getattr(v, "ndim", 1) == 0)}
    lines = []
    if not path.exists():
        for name, values in metrics.items():
            if isinstance(values, (list, tuple)) and all(
                    isinstance(x, (int, float)) for x in values):
                lines += [json.dumps({"series": name, "index": i, "value": x})
                          for i, x in enumerate(values)]
            elif isinstance(values, dict) and "values" in values and "steps" in values:
                runs = values["values"]
                runs = [(None, runs)] if _is_flat(runs) else list(enumerate(runs))
                for r, row in runs:
                    lines += [json.dumps({"series": name, **({} if r is None else {"run": r}),
                                          "index": i, "step": s, "value": x}, default=_default)
                              for i, (s, x) in enumerate(zip(values["steps"], row))]
    lines.append(json.dumps({"final": scalars}, default=_default))
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")
    return path


def assert_claims(claims: list[Claim], profile: str | None = None) -> None:
    """Fail (AssertionError naming each claim and its numbers) if a claim asserted in ``profile``
    does not hold (``asserted_in``: in ``cpu`` and ``gpu`` only sanity and theorem claims).
    ``profile`` defaults to that of this process's last ``write_results``, else 'ci'."""
    profile = profile or (_PROFILE[0] if _PROFILE else "ci")
    failed = [c for c in claims if asserted_in(c, profile) and not c.holds]
    if failed:
        lines = [f"{c.id}: {c.statement} -- {c.metric}: ours={c.ours:.4g} {c.direction} "
                 f"baseline={c.baseline} (margin {c.margin})" for c in failed]
        raise AssertionError("claims that did not hold:\n" + "\n".join(lines))


def assert_controls(claims: list[Claim], why: str = "a negative control passed",
                    profile: str | None = None) -> None:
    """Fail (AssertionError: ``why`` and the claims) if a claim's negative control passed where
    that is an error: in ``ci`` every claim with a control (the notebook's checks run on its
    ``ci`` numbers), in ``cpu`` and ``gpu`` only the kinds of ``ASSERTED_AT_SCALE``. Elsewhere a
    control that passes is a result: the report reads the claim 'not evidence'.

    >>> c = claim("beats", "s", "acc", 0.6, 0.5, ">", kind="paper", control=0.7)
    >>> assert_controls([c], profile="cpu")  # a paper claim's control passing is reported
    >>> assert_controls([c], profile="ci")
    Traceback (most recent call last):
    ...
    AssertionError: a negative control passed: beats (control 0.7)
    """
    profile = profile or (_PROFILE[0] if _PROFILE else "ci")
    passed = [c for c in claims if c.control is not None and not c.control_fails
              and (profile not in SCALE_PROFILES or c.kind in ASSERTED_AT_SCALE)]
    if passed:
        raise AssertionError(f"{why}: " + ", ".join(f"{c.id} (control {c.control:.4g})"
                                                    for c in passed))


def _default(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
