"""Collect every ``results.json`` under ``runs/`` into one report: a self-contained HTML page
(figures embedded, opens from a file with no server) and a markdown table, per family and paper.

Per notebook, profile, grid point and claim: ours and the baseline as mean +- std over seeds, the
paper's number and where in the paper it comes from, and three verdicts:
- every seed: 'holds' when the claim held in every seed, 'mixed k/n' when in some, 'does not
  hold' when in none;
- on the seed mean: the claim's own rule applied to the means;
- with confidence: the mean of the paired difference ours - baseline and its 95% t-interval over
  seeds (``stats.ordering_verdict``), 'yes' when the whole interval clears the margin (tables
  published before the t-interval hold a percentile bootstrap of the IQM there).

Each row shows the claim's ``kind`` (results.json files written before kinds existed read as
'unknown', and the report says so); only ``paper`` claims count when the report says how many of a
paper's claims reproduce, the notebook's own paper's apart from a second paper's (``paper_id``);
``extension`` claims (the notebook's own findings) are counted apart and never as the paper's. A
``post_hoc`` claim (judged on a seed looked at while choosing something, ``results.looked_at``) is
marked, and its verdict comes from the seeds never looked at only ('post hoc: no unseen seeds' when
there are none; such a claim never counts as reproduced). A claim with a negative control shows the
control's value and whether it failed the claim's rule. A claim that holds in every seed is
reported as 'not evidence' instead of 'holds' when its control passes too in some seed, or when it
needs a control and has none: every agreement claim within a tolerance ('~' with a margin > 0; an
exact equality needs none) and every non-inferiority ``paper`` claim ('>' or '<' with a negative
margin, the encoding ``results.claim`` asks for). A paper claim counts as reproduced when it holds
in every seed and is evidence. A claim that records its power (``results.power_plan``,
``results.positive_control``) reads **no power** when its positive control did not move beyond
panel noise or its minimal detectable difference exceeds its margin (``results.no_power``): it is
shown apart from 'does not hold', and counted apart ("k of n reproduced, m without power").
The report opens with a **scoreboard** (``scoreboard``): one row per notebook and profile, its
own paper's claims by verdict and its fidelity counts, linked to its section.

Learning curves (``results.learning_curve`` under ``metrics["curve/<name>"]``) are summarised per
notebook: start, peak (where it differs from final) and final, mean +- std over runs and seeds, and
the runs that collapsed (``results.curve_summary``). Runs that failed before writing a result are
listed too.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
from collections import defaultdict
from pathlib import Path

import numpy as np


def _hidden(path: Path, runs_root: Path) -> bool:
    """Whether ``path`` lies in a folder the pipeline keeps aside (a name starting with '.': a
    run in progress ``.seed0.staging``, a failed re-run ``.seed0.failed`` kept beside the finished
    run it did not replace)."""
    return any(part.startswith(".") for part in path.relative_to(runs_root).parts[:-1])


def _run_files(runs_root: Path, name: str):
    return sorted(Path(runs_root).rglob(name))


def collect_all(runs_root: Path) -> tuple[list[dict], list[dict]]:
    """(every valid results.json under ``runs_root`` with its folder as ``_dir``, and every
    invalid one as {'path', 'problem'}): empty, truncated, not JSON, of the wrong shape
    (``results.read_results``), or that cannot be summarised. Folders kept aside (``_hidden``)
    and ``.tmp`` files are never read."""
    from agentrl_lib.pipeline.results import read_results

    runs_root = Path(runs_root)
    good, bad = [], []
    for path in _run_files(runs_root, "results.json"):
        if _hidden(path, runs_root):
            continue
        data, problem = read_results(path)
        if data is not None:
            data = {**data, "_dir": str(path.parent)}
            try:  # whatever the shape check missed must not kill the whole report
                summarise([data])
                summarise_curves([data])
            except Exception as e:  # noqa: BLE001
                data, problem = None, f"cannot be summarised ({type(e).__name__}: {e})"
        if data is None:
            bad.append({"path": str(path), "problem": problem})
        else:
            good.append(data)
    return good, bad


def collect(runs_root: Path) -> list[dict]:
    """Every valid results.json under ``runs_root`` (``collect_all``)."""
    return collect_all(runs_root)[0]


def failed_runs(runs_root: Path) -> list[dict]:
    """Runs that failed before writing a valid result, and re-runs that failed beside a finished
    run they did not replace (``.seed<S>.failed``), each as {'dir', 'error'}."""
    runs_root = Path(runs_root)
    out = []
    for path in _run_files(runs_root, "run.json"):
        kept_aside = path.parent.name.endswith(".failed")
        if _hidden(path, runs_root) and not kept_aside:
            continue  # a run in progress
        try:
            r = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            r = {"ok": False, "error": "run.json cannot be read"}
        if not isinstance(r, dict):
            r = {"ok": False, "error": "run.json is not a mapping"}
        if not r.get("ok") and (kept_aside or not (path.parent / "results.json").exists()):
            error = str(r.get("error", ""))
            if kept_aside:
                error += " (a re-run; the finished run beside it was kept)"
            out.append({"dir": str(path.parent), "error": error})
    return out


def _fmt(values: list) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    a = np.asarray(vals, dtype=float)
    if len(a) == 1 or np.all(a == a[0]):
        return f"{a[0]:.4g}"
    return f"{a.mean():.4g} ± {a.std(ddof=1):.2g}"


FAMILIES = {"0": "foundations", "1": "rlvr", "2": "reward", "3": "multiturn-credit",
            "4": "search-tool", "5": "exploration", "6": "multiagent"}


def family_of(result: dict) -> str:
    """The catalog family of a notebook: its metadata's ``family``, else from its number."""
    return result.get("family") or FAMILIES.get(str(result.get("notebook", "?"))[:1], "other")


UNKNOWN_KIND = "unknown"
NO_UNSEEN = "post hoc: no unseen seeds"
"""The verdict of a post-hoc claim judged only on seeds looked at while choosing it."""
NO_POWER = "no power"
"""The verdict of a claim whose positive control did not move, or whose minimal detectable
difference exceeds its margin (``results.no_power``): it could not have come out either way, so it
says nothing for or against the paper."""
"""The kind of a claim read from a results.json written before claims had kinds."""


def needs_control(c: dict) -> bool:
    """Agreement claims within a tolerance ('~' with a margin > 0), and non-inferiority paper
    (or extension) claims (a negative margin on '>' or '<'), pass for an arm that does nothing different; only a
    failing negative control makes them evidence. An exact equality ('~' with margin 0) fails at
    any difference, so it needs none."""
    if c.get("direction") == "~":
        return (c.get("margin") or 0.0) > 0
    return (c.get("kind") in ("paper", "extension") and c.get("direction") in (">", "<")
            and (c.get("margin") or 0.0) < 0)


def _control_cell(claims: list[dict]) -> tuple[str, str]:
    """(control value across seeds, whether it failed the claim's rule) for one row."""
    fails = [c.get("control_fails") for c in claims]
    if all(f is None for f in fails):
        return "—", "no control"
    value = _fmt([c.get("control") for c in claims])
    n = len(fails)
    passed = sum(f is False for f in fails)
    missing = sum(f is None for f in fails)
    if passed == 0 and missing == 0:
        return value, "control fails (every seed)"
    parts = []
    if passed:
        parts.append(f"control passes too in {passed}/{n} seeds")
    if missing:
        parts.append(f"no control in {missing}/{n} seeds")
    return value, "; ".join(parts)


def _evidence_verdict(verdict: str, claims: list[dict]) -> tuple[str, str]:
    """(verdict, why) where a claim that holds in every seed is no evidence: its control passed
    in some seed, or it needs a control (``needs_control``) and lacks one in some seed."""
    if verdict != "holds":
        return verdict, ""
    if any(c.get("control_fails") is False for c in claims):
        return "not evidence", "holds, but its negative control passes too"
    if any(needs_control(c) and c.get("control_fails") is None for c in claims):
        return "not evidence", ("holds, but an agreement or non-inferiority claim without a "
                                "negative control proves nothing")
    return verdict, ""


def _confidence(claims: list[dict]) -> dict:
    from agentrl_lib.pipeline.stats import ordering_verdict

    ours = [c["ours"] for c in claims]
    base = [c["baseline"] for c in claims]
    if any(v is None for v in ours) or any(b is None for b in base):
        return {"iqm": "—", "confident": "—"}
    v = ordering_verdict(ours, base, claims[0].get("direction", ">"), claims[0].get("margin", 0.0))
    lo, hi = v["diff_ci"]
    return {"iqm": f"{v['ours_mean']:.4g}; diff {v['diff_mean']:+.3g} [{lo:+.3g}, {hi:+.3g}]",
            "confident": f"{'yes' if v['confident'] else 'no'} (n={v['n']})"}


def _diff_ci(claims: list[dict]) -> tuple[float, float] | None:
    """The seeds' 95% t-interval of ours - baseline (None without a baseline or with one seed)."""
    from agentrl_lib.pipeline.stats import ordering_verdict

    ours = [c.get("ours") for c in claims]
    base = [c.get("baseline") for c in claims]
    if len(claims) < 2 or any(v is None for v in ours + base):
        return None
    lo, hi = ordering_verdict(ours, base, ">")["diff_ci"]  # the interval ignores the direction
    return float(lo), float(hi)


def _decided(claims: list[dict]) -> bool:
    """Whether the seeds' 95% t-interval of the mean of ours - baseline lies wholly on one side of
    the claim's bar: beyond it (the claim holds with confidence) or short of it (it fails with
    confidence). The interval's spread is the seeds' own, but never below the panel noise of the
    claim's power plan (sqrt(2) x its per-seed SE for a paired difference), so identical seeds of a
    tiny panel decide nothing. A claim whose planned minimal detectable difference exceeds its
    margin is "no power" only while this interval straddles the bar: an effect far beyond the
    panel's noise is evidence whatever the plan expected. Needs 2 seeds or more.

    >>> c = lambda o, b: {"ours": o, "baseline": b, "direction": ">", "margin": -0.05,
    ...                   "power": {"se": 0.0156}}
    >>> _decided([c(0.19, 0.44), c(0.15, 0.43), c(0.15, 0.44)])  # far below the bar
    True
    >>> _decided([c(0.40, 0.44), c(0.46, 0.43), c(0.41, 0.44)])  # straddles -0.05
    False
    """
    from scipy.stats import t

    ours = [c.get("ours") for c in claims]
    base = [c.get("baseline") for c in claims]
    direction = claims[0].get("direction", ">") if claims else ">"
    if len(claims) < 2 or any(v is None for v in ours + base) or direction not in (">", "<"):
        return False
    d = np.asarray(ours, dtype=float) - np.asarray(base, dtype=float)
    n = len(d)
    floor = math.sqrt(2) * float((claims[0].get("power") or {}).get("se", 0.0))
    half = float(t.ppf(0.975, n - 1)) * max(float(d.std(ddof=1)), floor) / math.sqrt(n)
    margin = claims[0].get("margin", 0.0) or 0.0
    bar = margin if direction == ">" else -margin
    return bool(d.mean() - half > bar or d.mean() + half < bar)


def unresolved_failure(verdict: str, kind: str, direction: str, margin: float,
                       ci: tuple[float, float] | None, n: int) -> str:
    """Why a failing paper or extension claim that records no power plan carries no power ('' when
    the seeds decide it): a claim that did not hold (or held in some seeds) reads "no power"
    unless the seeds' 95% t-interval of ours - baseline lies wholly on the failing side of the bar
    (at or below it for '>', at or above it for '<'). With one seed nothing tells a failure from
    noise. Claims that hold, claims with a plan (``results.no_power`` judges those), and '~',
    '>=' and '<=' claims (bars, not differences) are left as they are.

    >>> unresolved_failure("does not hold", "paper", ">", 0.05, (-0.08, 0.03), 3)  # decided
    ''
    >>> unresolved_failure("mixed 1/3", "paper", ">", 0.05, (-0.08, 0.12), 3)
    "no power plan, and the seeds' 95% interval of ours - baseline [-0.08, +0.12] reaches past the bar +0.05"
    >>> unresolved_failure("does not hold", "paper", ">", 0.0, (0.0, 0.0), 3)  # equal: fails
    ''
    >>> unresolved_failure("mixed 2/3", "paper", "<", 0.0, (-0.1, 0.2), 3)[-6:]
    'bar +0'
    """
    failed = verdict == "does not hold" or verdict.startswith("mixed")
    if not failed or kind not in ("paper", "extension") or direction not in (">", "<"):
        return ""
    if n < 2 or ci is None:
        return "one seed and no power plan: nothing tells this failure from noise"
    lo, hi = ci
    bar = (margin if direction == ">" else -margin) + 0.0  # + 0.0: never a "-0" bar
    if (direction == ">" and hi <= bar) or (direction == "<" and lo >= bar):
        return ""
    return (f"no power plan, and the seeds' 95% interval of ours - baseline "
            f"[{lo:+.3g}, {hi:+.3g}] reaches past the bar {bar:+.3g}")


def _plan_cell(claims: list[dict]) -> str:
    """The power plan a row's verdict rests on, for the tables: its minimal detectable difference
    and panel, and its positive control; 'none' when the claim records neither."""
    plan = next((c["power"] for c in claims if c.get("power")), None)
    pcs = [c["positive_control"] for c in claims if c.get("positive_control")]
    parts = []
    if plan and "mdd" in plan:
        parts.append(f"mdd {plan['mdd']:.3g} (panel {plan.get('panel', '?')}, "
                     f"{plan.get('seeds', '?')} seeds)")
    if plan and "bound" in plan:
        parts.append(f"metric bound {plan['bound']:.3g}")
    if pcs:
        parts.append(f"positive control moved in {sum(bool(p.get('moved')) for p in pcs)}/{len(pcs)}")
    return "; ".join(parts) or "none"


def summarise(results: list[dict]) -> list[dict]:
    """One row per (notebook, profile, grid point, claim) with the numbers across seeds."""
    from agentrl_lib.pipeline.results import UNDECIDABLE, _rule, no_power

    groups: dict[tuple, list] = defaultdict(list)
    meta = {}
    for r in results:
        for c in r.get("claims", []):
            key = (r["notebook"], r.get("profile", "?"), r.get("point", ""), c["id"])
            groups[key].append((r.get("seed"), c, r))
            meta[r["notebook"]] = r
    rows = []
    # notebooks, profiles and points sorted; claims in the order the notebook declares them
    order = sorted(groups, key=lambda k: (k[0], k[1], k[2]))  # notebook numbers follow families
    for (nb, profile, point, cid) in order:
        items = groups[(nb, profile, point, cid)]
        items.sort(key=lambda t: (t[0] is None, t[0]))
        claims = [c for _, c, _ in items]
        # a post-hoc claim is judged on the seeds never looked at while choosing it
        seen = [s for s, c, _ in items if c.get("post_hoc")]
        judged = [c for c in claims if not c.get("post_hoc")]
        verdict, why = _seed_verdict(judged)
        powerless = next((w for w in map(no_power, judged) if w), "")
        if powerless and not powerless.startswith(UNDECIDABLE) and _decided(judged):
            powerless = ""  # the seeds' interval already decides it, whatever the plan said
        planned = any(c.get("power") or c.get("positive_control") for c in judged)
        if judged and not planned and not powerless:
            ci = _diff_ci(judged)
            powerless = unresolved_failure(verdict, judged[0].get("kind") or "",
                                           judged[0].get("direction", ">"),
                                           judged[0].get("margin", 0.0) or 0.0, ci, len(judged))
        if seen and not judged:
            verdict, why = NO_UNSEEN, "its verdict must come from seeds never looked at"
        elif powerless:
            verdict, why = NO_POWER, powerless + (
                "; verdict from the seeds never looked at" if seen else "")
        elif seen:
            why = "; ".join(x for x in (why, "verdict from the seeds never looked at") if x)
        first = claims[0]
        paper = meta[nb].get("paper") or {}
        # the claim's own direction and margin applied to the means over seeds (a bar stated on
        # the mean of seeds, such as CartPole's 475, is judged here rather than seed by seed)
        ours_vals = [c["ours"] for c in claims if c["ours"] is not None]
        base_vals = [c["baseline"] for c in claims if c["baseline"] is not None]
        on_mean = None
        if ours_vals and base_vals:
            on_mean = _rule(float(np.mean(ours_vals)), float(np.mean(base_vals)),
                            first.get("direction", ">"), first.get("margin", 0.0))
        control, control_verdict = _control_cell(claims)
        rows.append({
            "family": family_of(meta[nb]), "point": point,
            "notebook": nb, "title": meta[nb].get("title") or nb, "paper": paper.get("title"),
            "url": paper.get("url"), "profile": profile, "claim": cid,
            "kind": first.get("kind") or UNKNOWN_KIND, "paper_id": first.get("paper_id") or "",
            "post_hoc": bool(seen), "looked_at": next((c["looked_at"] for c in claims
                                                       if c.get("looked_at")), ""),
            "statement": first["statement"], "metric": first["metric"],
            "direction": first.get("direction", ""), "margin": first.get("margin", 0.0),
            "asserted": first.get("asserted", True),
            "seeds": [s for s, _, _ in items], "ours": _fmt([c["ours"] for c in claims]),
            "baseline": _fmt([c["baseline"] for c in claims]),
            "paper_value": first.get("paper_value"), "source": first.get("source"),
            "verdict": verdict, "why": why, "control": control,
            "control_verdict": control_verdict, **_confidence(claims),
            "power_plan": _plan_cell(claims),
            "on_mean": {None: "—", True: "holds", False: "does not hold"}[on_mean],
            "devices": sorted({r.get("device", "?") for _, _, r in items}),
            "wall_s": _fmt([r.get("wall_s") for _, _, r in items]),
        })
    return rows


def _seed_verdict(claims: list[dict]) -> tuple[str, str]:
    """(verdict, why) over these seeds' claims: 'holds' in every one, 'does not hold' in none,
    'mixed k/n', then ``_evidence_verdict``."""
    n_hold, n = sum(bool(c["holds"]) for c in claims), len(claims)
    verdict = "holds" if n_hold == n else ("does not hold" if n_hold == 0 else
                                           f"mixed {n_hold}/{n}")
    return _evidence_verdict(verdict, claims)


def _tally(rows: list[dict]) -> dict:
    return {"reproduced": sum(r["verdict"] == "holds" for r in rows), "of": len(rows),
            "not_evidence": sum(r["verdict"] == "not evidence" for r in rows),
            "no_power": sum(r["verdict"] == NO_POWER for r in rows)}


def paper_count(rows: list[dict]) -> dict:
    """How many of the notebook's own paper's claims (kind ``paper``, no ``paper_id``) reproduce:
    hold in every (unseen) seed and are evidence; the same per second paper (``paper_id``); how
    many ``extension`` claims hold (never counted as the paper's); and how many rows of each
    other kind were left out.

    >>> paper_count([{"kind": "paper", "verdict": "holds"}, {"kind": "paper",
    ...              "verdict": "not evidence"}, {"kind": "sanity", "verdict": "holds"},
    ...              {"kind": "paper", "paper_id": "aepo", "verdict": "holds"},
    ...              {"kind": "extension", "verdict": "does not hold"},
    ...              {"kind": "paper", "verdict": "no power"}])
    ... # doctest: +NORMALIZE_WHITESPACE
    {'reproduced': 1, 'paper': 3, 'not_evidence': 1, 'no_power': 1,
     'second_papers': {'aepo': {'reproduced': 1, 'of': 1, 'not_evidence': 0, 'no_power': 0}},
     'extension': {'reproduced': 0, 'of': 1, 'not_evidence': 0, 'no_power': 0},
     'other': {'sanity': 1}}
    """
    own = [r for r in rows if r["kind"] == "paper" and not r.get("paper_id")]
    seconds: dict[str, list] = defaultdict(list)
    for r in rows:
        if r["kind"] == "paper" and r.get("paper_id"):
            seconds[r["paper_id"]].append(r)
    other: dict[str, int] = {}
    for r in rows:
        if r["kind"] not in ("paper", "extension"):
            other[r["kind"]] = other.get(r["kind"], 0) + 1
    t = _tally(own)
    return {"reproduced": t["reproduced"], "paper": t["of"], "not_evidence": t["not_evidence"],
            "no_power": t["no_power"],
            "second_papers": {k: _tally(v) for k, v in sorted(seconds.items())},
            "extension": _tally([r for r in rows if r["kind"] == "extension"]), "other": other}


def count_line(rows: list[dict]) -> str:
    """One sentence: how many of the paper's claims reproduce (the headline: the notebook's own
    paper's claims only), then a second paper's, the extensions apart, and what was not
    counted."""
    c = paper_count(rows)
    if c["paper"]:
        line = f"Paper claims reproduced: {c['reproduced']} of {c['paper']}"
        if c["no_power"]:
            line += f", {c['no_power']} without power"
        if c["not_evidence"]:
            line += f" ({c['not_evidence']} hold but are not evidence)"
    else:
        line = "No paper claims"
    def unpowered(t: dict) -> str:
        return f", {t['no_power']} without power" if t["no_power"] else ""

    for pid, t in c["second_papers"].items():
        line += (f"; claims of {pid} (another paper) reproduced: {t['reproduced']} of {t['of']}"
                 + unpowered(t))
    if c["extension"]["of"]:
        line += (f"; extensions (our own findings, not the paper's): {c['extension']['reproduced']}"
                 f" of {c['extension']['of']} hold" + unpowered(c["extension"]))
    known = {k: v for k, v in c["other"].items() if k != UNKNOWN_KIND}
    if known:
        line += "; not counted: " + ", ".join(f"{v} {k}" for k, v in sorted(known.items()))
    if c["other"].get(UNKNOWN_KIND):
        line += (f"; {c['other'][UNKNOWN_KIND]} of unknown kind (results written before claims "
                 "had kinds), not counted")
    return line + "."


def _by_group(rows: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        out[(r["notebook"], r["profile"], r.get("point", ""))].append(r)
    return out


def summarise_curves(results: list[dict]) -> list[dict]:
    """One row per (notebook, profile, grid point, curve): start, peak and final of every run
    (mean +- std over runs and seeds), whether the peak differs from the final value in any run,
    and how many runs collapsed. Only ``learning_curve`` dicts count; plain lists under
    ``curve/...`` (x-axes, older notebooks) are left alone."""
    from agentrl_lib.pipeline.results import COLLAPSE_MARGIN, curve_summary

    groups: dict[tuple, list] = defaultdict(list)
    meta = {}
    for r in results:
        for name, v in (r.get("metrics") or {}).items():
            if name.startswith("curve/") and isinstance(v, dict) and "values" in v:
                key = (r["notebook"], r.get("profile", "?"), r.get("point", ""), name)
                groups[key].append((r.get("seed"), v))
                meta[r["notebook"]] = r
    rows = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2])):
        nb, profile, point, name = key
        runs = [s for _, v in groups[key] for s in curve_summary(v)]
        first = groups[key][0][1]
        scale = float(first.get("scale", 1.0))
        n_collapsed = sum(s["collapsed"] for s in runs)
        rows.append({
            "family": family_of(meta[nb]), "notebook": nb, "profile": profile, "point": point,
            "curve": name.removeprefix("curve/"), "runs": len(runs),
            "seeds": sorted({s for s, _ in groups[key]}, key=lambda s: (s is None, s)),
            "start": _fmt([s["start"] for s in runs]), "peak": _fmt([s["peak"] for s in runs]),
            "final": _fmt([s["final"] for s in runs]),
            "peak_differs": any(not np.isclose(s["peak"], s["final"], rtol=0, atol=1e-12)
                                for s in runs),
            "higher_is_better": bool(first.get("higher_is_better", True)),
            "collapse_drop": COLLAPSE_MARGIN * scale, "collapsed": n_collapsed,
            "collapsed_cell": (f"collapsed {n_collapsed}/{len(runs)}" if n_collapsed
                               else f"no (0/{len(runs)})"),
        })
    return rows


def _curves_note() -> str:
    from agentrl_lib.pipeline.results import COLLAPSE_MARGIN

    return (f"Learning curves, per run (mean ± std over runs and seeds): peak is the best value "
            f"where it differs from the final one; a run has collapsed when its final value is "
            f"worse than its start by more than {COLLAPSE_MARGIN} × the metric's range.")


CURVES_NOTE = _curves_note()


def _peak_cell(r: dict) -> str:
    return r["peak"] if r["peak_differs"] else "= final"


def curves_markdown(curve_rows: list[dict]) -> str:
    """A table of learning curves: start, peak (where it differs from final), final, collapse."""
    if not curve_rows:
        return ""
    out = ["| notebook | profile | curve | runs | start | peak | final | collapsed |",
           "|---|---|---|---|---|---|---|---|"]
    for r in curve_rows:
        prof = r["profile"] + (f" [{r['point']}]" if r.get("point") else "")
        cell = f"**{r['collapsed_cell']}**" if r["collapsed"] else r["collapsed_cell"]
        out.append(f"| {r['notebook']} | {prof} | {r['curve']} | {r['runs']} | {r['start']} | "
                   f"{_peak_cell(r)} | {r['final']} | {cell} |")
    return "\n".join(out) + "\n"


def _paper_cell(r: dict) -> str:
    pv = "" if r["paper_value"] is None else str(r["paper_value"])
    return pv + (f" ({r['source']})" if r.get("source") and pv else "")


POST_HOC_NOTE = ("post hoc: judged on seeds looked at while choosing it; its verdict comes from "
                 "seeds never looked at")


def _post_hoc_text(r: dict) -> str:
    return POST_HOC_NOTE + (f" ({r['looked_at']})" if r.get("looked_at") else "")


def _kind_cell(r: dict) -> str:
    return r["kind"] + (f" of {r['paper_id']}" if r.get("paper_id") else "")


def _claim_cell(r: dict) -> str:
    cell = f"{r['statement']} ({r['metric']}, {r['direction']})"
    return cell + (f" — *{_post_hoc_text(r)}*" if r.get("post_hoc") else "")


def _verdict_cell(r: dict) -> str:
    note = "" if r["asserted"] else " (reported, not asserted)"
    why = f" ({r['why']})" if r.get("why") else ""
    return f"**{r['verdict']}**{why}{note}"


def _control_text(r: dict) -> str:
    return "—" if r.get("control", "—") == "—" else f"{r['control']} ({r['control_verdict']})"


def markdown(rows: list[dict], curve_rows: list[dict] | None = None) -> str:
    """One table per family, then how many paper claims reproduce per notebook (and profile and
    grid point), then the family's learning curves; the grid point follows the profile."""
    head = ("| notebook | profile | claim | kind | ours (mean ± std) | baseline | paper | "
            "negative control | seeds | verdict (every seed) | on the seed mean | "
            "ours; diff [95% CI] | with confidence |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    out = []
    curve_rows = curve_rows or []
    for fam in dict.fromkeys(r.get("family", "other") for r in rows):
        fam_rows = [r for r in rows if r.get("family", "other") == fam]
        body = []
        for r in fam_rows:
            seeds = ",".join(str(s) for s in r["seeds"])
            prof = r["profile"] + (f" [{r['point']}]" if r.get("point") else "")
            body.append(f"| {r['notebook']} | {prof} | {_claim_cell(r)} | {_kind_cell(r)} | "
                        f"{r['ours']} | {r['baseline']} | {_paper_cell(r)} | {_control_text(r)} | "
                        f"{seeds} | {_verdict_cell(r)} | {r['on_mean']} | "
                        f"{r.get('iqm', '—')} | {r.get('confident', '—')} |")
        counts = [f"- {nb}, {prof}{f' [{pt}]' if pt else ''}: {count_line(g)}"
                  for (nb, prof, pt), g in _by_group(fam_rows).items()]
        curves = curves_markdown([c for c in curve_rows if c.get("family", "other") == fam])
        out.append(f"### Family: {fam}\n\n" + head + "\n".join(body) + "\n\n" +
                   "\n".join(counts) + "\n" +
                   (f"\n{CURVES_NOTE}\n\n{curves}" if curves else ""))
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;width:100%;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;
vertical-align:top}th{background:#f3f3f3}.holds{color:#1a7f37;font-weight:600}
.mixed{color:#9a6700;font-weight:600}.no{color:#cf222e;font-weight:600}.nopower{color:#666;font-weight:600}
img{max-width:560px;margin:4px}
h2{border-bottom:1px solid #ddd;padding-bottom:4px}.small{color:#666;font-size:13px}"""


SCOREBOARD_HEAD = ["notebook", "family", "profile", "seeds", "paper claims", "reproduced",
                   "do not hold", "mixed", "no power", "not evidence", "post hoc, no unseen seeds",
                   "positive controls learned (seeds)", "minutes per seed",
                   "fidelity: code / text / unverifiable / differs"]
_MOVED = re.compile(r"positive control moved in (\d+)/(\d+)")


def _controls_cell(rows: list[dict]) -> str:
    """The distinct positive-control outcomes of a notebook's claims, worst first: '3/3' (every
    control learned at every seed), '0/3, 3/3' (one never learned), '—' (no claim carries one).

    >>> _controls_cell([{"power_plan": "mdd 0.07; positive control moved in 3/3"},
    ...                 {"power_plan": "positive control moved in 1/3"}, {"power_plan": "none"}])
    '1/3, 3/3'
    """
    got = {(int(m[1]), int(m[2])) for r in rows
           if (m := _MOVED.search(r.get("power_plan") or ""))}
    return ", ".join(f"{k}/{n}" for k, n in sorted(got, key=lambda kn: kn[0] / kn[1])) or "—"


def _wall_minutes(rows: list[dict]) -> float | None:
    """A notebook's mean wall minutes per seed from its rows' 'wall_s' cells ('554 ± 2.3e+02')."""
    for r in rows:
        m = re.match(r"\s*([0-9.]+)", str(r.get("wall_s") or ""))
        if m:
            return float(m[1]) / 60
    return None


STALE_CSV = "stale.csv"
"""``reproductions/stale.csv``: the committed tables (notebook, profile) run before a change to the
notebook's method (e.g. the paper's version made the main arm), with the reason. Their verdicts are
of the old method: RESULTS.md marks them and leaves them out of the controls count. ``publish``
drops a row when it writes that notebook's tables again."""
_STALE_FIELDS = ["notebook", "profile", "reason"]


def read_stale(repro_root: Path | str) -> dict[tuple[str, str], str]:
    """{(notebook, profile): reason} from ``reproductions/stale.csv`` ({} without one)."""
    import csv

    path = Path(repro_root) / STALE_CSV
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(_STALE_FIELDS) - set(rows[0]):
        raise ValueError(f"{path}: the columns must be {', '.join(_STALE_FIELDS)}")
    return {(r["notebook"], r["profile"]): r["reason"] for r in rows}


def drop_stale(repro_root: Path | str, notebooks, profile: str) -> None:
    """Remove the rows of ``notebooks`` at ``profile`` from ``stale.csv`` (their tables were
    written again); the file goes when no row is left."""
    import csv

    stale = read_stale(repro_root)
    keep = {k: v for k, v in stale.items() if not (k[1] == profile and k[0] in set(notebooks))}
    if keep == stale:
        return
    path = Path(repro_root) / STALE_CSV
    if not keep:
        path.unlink()
        return
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(_STALE_FIELDS)
        w.writerows([nb, prof, why] for (nb, prof), why in sorted(keep.items()))


def scoreboard(rows: list[dict], fidelity: dict[str, dict] | None = None,
               stale: dict[tuple[str, str], str] | None = None) -> list[dict]:
    """One row per (notebook, profile): how its own paper's claims came out (kind ``paper``
    without ``paper_id``; ``paper_count``'s rule), the seeds, its fidelity counts, and ``stale``:
    the reason its table predates a change to its method (``read_stale``), else "".

    >>> sb = scoreboard([{"notebook": "31_x", "family": "f", "profile": "cpu", "seeds": [0, 1],
    ...                   "kind": "paper", "verdict": "holds"},
    ...                  {"notebook": "31_x", "family": "f", "profile": "cpu", "seeds": [0, 1],
    ...                   "kind": "paper", "verdict": "no power"}])
    >>> [sb[0][k] for k in ("paper claims", "reproduced", "no power", "seeds")]
    [2, 1, 1, '0,1']
    """
    fidelity, stale = fidelity or {}, stale or {}
    groups: dict[tuple, list] = defaultdict(list)
    for r in rows:
        groups[(r["notebook"], r["profile"])].append(r)
    out = []
    for (nb, profile), g in groups.items():
        own = [r for r in g if r["kind"] == "paper" and not r.get("paper_id")]
        n = lambda v: sum(r["verdict"] == v for r in own)  # noqa: E731
        f = fidelity.get(nb)
        out.append({"notebook": nb, "family": g[0].get("family", "other"), "profile": profile,
                    "seeds": ",".join(str(x) for x in sorted({s for r in g for s in r["seeds"]
                                                               if s is not None})),
                    "paper claims": len(own), "reproduced": n("holds"),
                    "do not hold": n("does not hold"),
                    "mixed": sum(r["verdict"].startswith("mixed") for r in own),
                    "no power": n(NO_POWER), "not evidence": n("not evidence"),
                    "post hoc, no unseen seeds": n(NO_UNSEEN),
                    "positive controls learned (seeds)": _controls_cell(g),
                    "minutes per seed": "—" if (w := _wall_minutes(g)) is None else f"{w:.1f}",
                    "fidelity: code / text / unverifiable / differs": (
                        "—" if f is None else f"{f['checked_against_code']} / "
                        f"{f['checked_against_text_only']} / {f['unverifiable']} / "
                        f"{f['differs']}"),
                    "stale": stale.get((nb, profile), "")})
    return out


def scoreboard_markdown(rows: list[dict], fidelity: dict[str, dict] | None = None,
                        stale: dict[tuple[str, str], str] | None = None) -> str:
    """The scoreboard as a markdown table, one line a notebook and profile; a stale table's
    notebook is marked † and listed with its reason under the table."""
    board = scoreboard(rows, fidelity, stale)
    if not board:
        return ""
    head = "| " + " | ".join(SCOREBOARD_HEAD) + " |\n" + "|---" * len(SCOREBOARD_HEAD) + "|\n"
    cell = lambda b, k: f"{b[k]} †" if k == "notebook" and b["stale"] else str(b[k])  # noqa: E731
    marked = [b for b in board if b["stale"]]
    notes = "" if not marked else (
        "\n† Stale: the notebook's method changed after this table was run, so its verdicts are "
        "of the old method until it is run again (not counted in the controls line above):\n" +
        "\n".join(f"- {b['notebook']} ({b['profile']}): {b['stale']}" for b in marked) + "\n")
    return ("## Scoreboard\n\nEach notebook's own paper's claims (kind `paper`), by verdict; "
            "the details follow.\n\n" + scoreboard_summary(board) + "\n\n" + head +
            "\n".join("| " + " | ".join(cell(b, k) for k in SCOREBOARD_HEAD) + " |"
                      for b in board) + "\n" + notes)


def scoreboard_summary(board: list[dict], jobs: int = 2) -> str:
    """What the scoreboard adds up to: how many notebooks' positive controls learned at every
    seed (of those with one), and the time of a run of every notebook at the board's seeds with
    ``jobs`` at a time by the committed wall times (measured while other runs shared the cores: a
    rough figure), with the share spent where a control has not learned at every seed.

    >>> board = [{"positive controls learned (seeds)": "3/3", "minutes per seed": "10.0",
    ...           "seeds": "0,1,2"},
    ...          {"positive controls learned (seeds)": "0/3, 3/3", "minutes per seed": "30.0",
    ...           "seeds": "0,1,2"},
    ...          {"positive controls learned (seeds)": "—", "minutes per seed": "—", "seeds": "0"}]
    >>> scoreboard_summary(board)
    'Positive controls learned at every seed in 1 of the 2 notebooks that carry one. One run of these notebooks at their seeds, 2 at a time, takes about 1.0 h by the committed wall times (no time recorded for 1); 75% of it in notebooks whose control has not learned at every seed.'
    """
    with_pc = [b for b in board if b["positive controls learned (seeds)"] != "—"
               and not b.get("stale")]
    good = [b for b in with_pc if all(k == n for k, n in (x.split("/") for x in
                                     b["positive controls learned (seeds)"].split(", ")))]

    def minutes(b: dict) -> float:
        return float(b["minutes per seed"]) * len(b["seeds"].split(","))

    timed = [b for b in board if b["minutes per seed"] != "—"]
    total = sum(minutes(b) for b in timed)
    weak = sum(minutes(b) for b in timed if b in with_pc and b not in good)
    text = (f"Positive controls learned at every seed in {len(good)} of the {len(with_pc)} "
            f"notebooks that carry one. One run of these notebooks at their seeds, {jobs} at a "
            f"time, takes about {total / jobs / 60:.1f} h by the committed wall times")
    if len(timed) < len(board):
        text += f" (no time recorded for {len(board) - len(timed)})"
    if total:
        text += (f"; {100 * weak / total:.0f}% of it in notebooks whose control has not learned "
                 f"at every seed")
    return text + "."


def _figures(run_dirs: list[str]) -> list[tuple[str, str]]:
    """(caption, base64 PNG) for the figures of the first seed's run directory that has any."""
    for d in run_dirs:
        figs = sorted((Path(d) / "figures").glob("*.png"))
        if figs:
            return [(f"{Path(d).name}: {f.stem}", base64.b64encode(f.read_bytes()).decode())
                    for f in figs]
    return []


def render_executed(results: list[dict], out_dir: Path) -> dict[tuple, list[tuple[str, str]]]:
    """The executed notebook of every run, rendered by nbconvert into
    ``<out_dir>/notebooks/<profile>/<notebook>[/<point>]/seed<S>.html`` (outputs and figures
    embedded, so the page opens from disk with no server): the report is also the book of the
    runs it reads. A page newer than its notebook is kept, so a second report renders only what
    changed. Returns {(notebook, profile): [(label, path relative to out_dir)]}, seeds in order."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = None
    links: dict[tuple, list[tuple[str, str]]] = defaultdict(list)
    for r in sorted(results, key=lambda r: (r["notebook"], str(r.get("profile")),
                                             r.get("point") or "", str(r.get("seed")))):
        src = Path(r["_dir"]) / f"{r['notebook']}.ipynb"
        if not src.is_file():
            continue
        point = r.get("point") or ""
        rel = Path("notebooks") / str(r.get("profile", "?")) / r["notebook"]
        rel = (rel / point if point else rel) / f"{Path(r['_dir']).name}.html"
        dest = out_dir / rel
        if not dest.is_file() or dest.stat().st_mtime < src.stat().st_mtime:
            if exporter is None:
                exporter = HTMLExporter(template_name="lab")
            try:
                body, _ = exporter.from_notebook_node(nbformat.read(src, as_version=4))
            except Exception:  # noqa: BLE001 - a truncated executed notebook: no link, no crash
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dest, body)
        label = (f"{point}, " if point else "") + f"seed {r.get('seed')}"
        links[(r["notebook"], r.get("profile"))].append((label, rel.as_posix()))
    return links


def broken_links(page: Path) -> list[str]:
    """The relative links (href, src) of an HTML page that do not resolve to a file beside it;
    data URIs, fragments and absolute URLs (http, https, mailto) are not checked."""
    text = Path(page).read_text(encoding="utf-8")
    bad = []
    for target in re.findall(r"""(?:href|src)=['"]([^'"]+)['"]""", text):
        if re.match(r"^(?:[a-z][a-z0-9+.-]*:|#)", target, flags=re.I):
            continue
        if not (Path(page).parent / html.unescape(target).split("#")[0]).exists():
            bad.append(target)
    return bad


FIDELITY_HEAD = ["items", "checked against code", "against text only", "unverifiable",
                 "matches", "partly", "differs"]
"""Columns of the report's fidelity table (``reproductions/fidelity/counts.csv``)."""


def _fidelity_cells(f: dict) -> list[str]:
    return [str(f[k]) for k in ("items", "checked_against_code", "checked_against_text_only",
                                "unverifiable", "matches", "partly", "differs")]


def fidelity_line(f: dict) -> str:
    """'fidelity: checked against code 3 / text 2 / unverifiable 5 / differs 1 (of 10 items)'."""
    return (f"fidelity: checked against code {f['checked_against_code']} / text "
            f"{f['checked_against_text_only']} / unverifiable {f['unverifiable']} / differs "
            f"{f['differs']} (of {f['items']} items)")


def fidelity_markdown(fidelity: dict[str, dict]) -> str:
    """The per-notebook fidelity counts as a markdown table ('' when there are none)."""
    if not fidelity:
        return ""
    head = "| notebook | " + " | ".join(FIDELITY_HEAD) + " |\n|---" + "|---" * 7 + "|\n"
    return "### Fidelity to the papers\n\n" + head + "\n".join(
        f"| {nb} | " + " | ".join(_fidelity_cells(f)) + " |" for nb, f in fidelity.items()) + "\n"


def render_html(rows: list[dict], results: list[dict], failures: list[dict],
                curve_rows: list[dict] | None = None,
                executed: dict[tuple, list[tuple[str, str]]] | None = None,
                fidelity: dict[str, dict] | None = None,
                invalid: list[dict] | None = None) -> str:
    """The report page; ``fidelity`` ({notebook: counts.csv row}) adds a line under each
    notebook's heading and a table of every notebook's counts at the end."""
    from agentrl_lib.pipeline import reference

    e = html.escape
    curve_rows = curve_rows or []
    executed = executed or {}
    fidelity = fidelity or {}
    parts = [f"<!doctype html><meta charset='utf-8'><title>agentrl report</title><style>{_CSS}"
             "</style><h1>agentrl: reproduction report</h1>",
             f"<p class='small'>{len(results)} results from {len({r['notebook'] for r in results})}"
             " notebooks. A verdict 'holds' means the claim held in every seed listed; 'not "
             "evidence' means it held, but its negative control passed too, or it is an agreement "
             "or non-inferiority claim without a control. Only claims of kind 'paper' count "
             "towards a paper reproducing (a second paper's, 'paper of <id>', for that paper); "
             "'extension' claims, the notebook's own findings, are counted apart; a post-hoc "
             "claim's verdict comes from the seeds never looked at; 'no power' means its "
             "positive control did not learn or the smallest difference its panel and seeds "
             "could detect exceeds its margin, or, for a claim without a power plan that "
             "failed, that the seeds' 95% interval of the difference reaches past its bar, so "
             "it says nothing either way.</p>"]
    board = scoreboard(rows, fidelity)
    if board:
        parts.append("<h2>Scoreboard</h2><table><tr>" + "".join(
            f"<th>{e(h)}</th>" for h in SCOREBOARD_HEAD) + "</tr>")
        for b in board:
            cells = [f"<a href='#{e(b['notebook'])}'>{e(b['notebook'])}</a>"] + [
                e(str(b[k])) for k in SCOREBOARD_HEAD[1:]]
            parts.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    by_nb = defaultdict(list)
    for r in rows:
        by_nb[r["notebook"]].append(r)
    family = None
    for nb, nb_rows in by_nb.items():
        first = nb_rows[0]
        if first.get("family") != family:
            family = first.get("family")
            parts.append(f"<h1 class='family'>Family: {e(str(family))}</h1>")
        link = (f"<a href='{e(first['url'])}'>{e(first['paper'] or '')}</a>" if first["url"]
                else e(first["paper"] or ""))
        parts.append(f"<h2 id='{e(nb)}'>{e(first['title'])}</h2><p>{e(nb)} · paper: {link}</p>"
                     "<ul>")
        if first.get("origin") == "reference":
            parts.append(f"<li class='mixed'>{e(REFERENCE_ONLY)}</li>")
        if nb in fidelity:
            parts.append(f"<li>{e(fidelity_line(fidelity[nb]))}</li>")
        for profile in sorted({r["profile"] for r in nb_rows}):
            pages = executed.get((nb, profile), [])
            if pages:
                parts.append(f"<li>executed notebooks ({e(profile)}): " + " · ".join(
                    f"<a href='{e(href)}'>{e(label)}</a>" for label, href in pages) + "</li>")
        parts.extend(f"<li>{e(prof)}{e(f' [{pt}]' if pt else '')}: {e(count_line(g))}</li>"
                     for (_, prof, pt), g in _by_group(nb_rows).items())
        parts.append("</ul>")
        parts.append("<table><tr><th>profile</th><th>claim</th><th>kind</th><th>metric</th>"
                     "<th>ours</th><th>baseline</th><th>paper</th><th>negative control</th>"
                     "<th>seeds</th><th>device</th><th>wall s</th><th>verdict (every seed)</th>"
                     "<th>on the seed mean</th><th>ours; diff [95% CI]</th>"
                     "<th>with confidence</th>" + ("<th>reference (committed): agrees?</th>"
                                                   if "agreement" in first else "") + "</tr>")
        for r in nb_rows:
            cls = {"holds": "holds", "does not hold": "no", "not evidence": "no",
                   NO_POWER: "nopower"}.get(
                r["verdict"], "mixed")
            note = "" if r["asserted"] else "<br><span class='small'>reported, not asserted</span>"
            why = f"<br><span class='small'>{e(r['why'])}</span>" if r.get("why") else ""
            post = (f"<br><span class='mixed'>{e(_post_hoc_text(r))}</span>" if r.get("post_hoc")
                    else "")
            prof = r["profile"] + (f" [{r['point']}]" if r.get("point") else "")
            parts.append(
                f"<tr><td>{e(prof)}</td><td>{e(r['statement'])}{post}</td>"
                f"<td>{e(_kind_cell(r))}</td>"
                f"<td>{e(r['metric'])} ({e(r['direction'])})</td><td>{e(r['ours'])}</td>"
                f"<td>{e(r['baseline'])}</td><td>{e(_paper_cell(r))}</td>"
                f"<td>{e(_control_text(r))}</td>"
                f"<td>{e(','.join(map(str, r['seeds'])))}</td><td>{e('; '.join(r['devices']))}</td>"
                f"<td>{e(r['wall_s'])}</td><td class='{cls}'>{e(r['verdict'])}{why}{note}</td>"
                f"<td>{e(r['on_mean'])}</td><td>{e(r.get('iqm', '—'))}</td>"
                f"<td>{e(r.get('confident', '—'))}</td>" +
                (f"<td>{e(reference.cell(r))}</td>" if "agreement" in first else "") + "</tr>")
        parts.append("</table>")
        nb_curves = [c for c in curve_rows if c["notebook"] == nb]
        if nb_curves:
            parts.append(f"<p class='small'>{e(CURVES_NOTE)}</p><table><tr><th>profile</th>"
                         "<th>curve</th><th>runs</th><th>start</th><th>peak</th><th>final</th>"
                         "<th>collapsed</th></tr>")
            for c in nb_curves:
                prof = c["profile"] + (f" [{c['point']}]" if c.get("point") else "")
                cls = "no" if c["collapsed"] else "holds"
                parts.append(f"<tr><td>{e(prof)}</td><td>{e(c['curve'])}</td><td>{c['runs']}</td>"
                             f"<td>{e(c['start'])}</td><td>{e(_peak_cell(c))}</td>"
                             f"<td>{e(c['final'])}</td>"
                             f"<td class='{cls}'>{e(c['collapsed_cell'])}</td></tr>")
            parts.append("</table>")
        for profile in sorted({r["profile"] for r in nb_rows}):
            dirs = sorted(res["_dir"] for res in results
                          if res["notebook"] == nb and res.get("profile") == profile)
            figs = _figures(dirs)
            if figs:
                parts.append(f"<p class='small'>figures ({e(profile)} profile)</p>")
                parts.extend(f"<img alt='{e(c)}' title='{e(c)}' src='data:image/png;base64,{b}'>"
                             for c, b in figs)
    if fidelity:
        parts.append("<h2>Fidelity to the papers</h2><p class='small'>Per notebook, how many "
                     "details were checked against the paper's released code, against its "
                     "text only, or could not be checked (reproductions/fidelity/).</p><table>"
                     "<tr><th>notebook</th>" + "".join(f"<th>{h}</th>" for h in FIDELITY_HEAD)
                     + "</tr>")
        parts.extend(f"<tr><td>{e(nb)}</td>" + "".join(f"<td>{c}</td>" for c in
                                                       _fidelity_cells(f)) + "</tr>"
                     for nb, f in fidelity.items())
        parts.append("</table>")
    if failures:
        parts.append("<h2>Runs that failed before writing results</h2><ul>")
        parts.extend(f"<li>{e(f['dir'])}: {e(f['error'])}</li>" for f in failures)
        parts.append("</ul>")
    if invalid:
        parts.append("<h2>results.json files that could not be read (not counted)</h2><ul>")
        parts.extend(f"<li>{e(b['path'])} {e(b['problem'])}</li>" for b in invalid)
        parts.append("</ul>")
    return "\n".join(parts)


REFERENCE_ONLY = ("not run here: the committed reference table of this profile "
                  "(reproductions/<notebook>/<profile>_summary.csv), not your runs")


def build_report(runs_root: Path | str = "runs", out_dir: Path | str = "report",
                 notebooks: bool = True, fidelity_csv: Path | str | None = None,
                 repro_root: Path | str | None = None) -> dict:
    """report/index.html (with links to every run's executed notebook as HTML unless
    ``notebooks`` is False), summary.md, summary.json and curves.json from ``runs_root``; the
    fidelity counts of ``fidelity_csv`` (``reproductions/fidelity/counts.csv``) when given; each
    claim beside the committed tables under ``repro_root`` (``reproductions/``) when given, and
    the notebooks not run shown from those tables, marked (``pipeline.reference``)."""
    from agentrl_lib.pipeline import reference
    from agentrl_lib.pipeline.fidelity import read_counts

    fidelity = read_counts(fidelity_csv) if fidelity_csv else {}
    runs_root, out_dir = Path(runs_root), Path(out_dir)
    results, invalid = collect_all(runs_root)
    rows = reference.attach(summarise(results), results, repro_root, rows_from_tables)
    curve_rows = summarise_curves(results)
    failures = failed_runs(runs_root)
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = render_executed(results, out_dir) if notebooks else {}
    write_atomic(out_dir / "summary.md", scoreboard_markdown(rows, fidelity) + "\n" +
                 markdown(rows, curve_rows) + "\n" + fidelity_markdown(fidelity) + "\n" +
                 reference.markdown(rows) + invalid_markdown(invalid))
    write_atomic(out_dir / "index.html", render_html(rows, results, failures, curve_rows,
                                                     executed, fidelity, invalid))
    write_atomic(out_dir / "summary.json", json.dumps(rows, indent=2, default=str))
    write_atomic(out_dir / "curves.json", json.dumps(curve_rows, indent=2, default=str))
    return {"results": len(results), "rows": len(rows), "failures": len(failures),
            "html": out_dir / "index.html", "markdown": out_dir / "summary.md",
            "notebooks": sum(map(len, executed.values())), "invalid": invalid,
            "failed_runs": failures,
            "tally": claim_tally([r for r in rows if r.get("origin") != "reference"]),
            "runs": run_counts(runs_root, results, invalid)}


def run_counts(runs_root: Path, results: list[dict], invalid: list[dict]) -> dict:
    """How many run folders ``runs_root`` holds ('runs'), and of them how many failed (their
    ``run.json`` says not ok, or cannot be read; a failed re-run kept aside counts too), how
    many hold an invalid results.json, and how many completed (the rest)."""
    runs_root = Path(runs_root)
    dirs = {Path(r["_dir"]) for r in results} | {Path(b["path"]).parent for b in invalid}
    failed = {Path(f["dir"]) for f in failed_runs(runs_root)}
    for path in _run_files(runs_root, "run.json"):
        if _hidden(path, runs_root):
            continue
        dirs.add(path.parent)
        try:
            run = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            run = None
        if not isinstance(run, dict) or not run.get("ok"):
            failed.add(path.parent)
    bad = {Path(b["path"]).parent for b in invalid} - failed
    total = len(dirs | failed)
    return {"runs": total, "failed": len(failed), "invalid": len(bad),
            "completed": total - len(failed) - len(bad)}


def write_atomic(path: Path | str, text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file renamed into place: a full disk or a kill
    leaves the earlier file (or none), never a truncated one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def invalid_markdown(invalid: list[dict]) -> str:
    if not invalid:
        return ""
    return ("\n### results.json files that could not be read (not counted)\n\n" +
            "".join(f"- `{b['path']}` {b['problem']}\n" for b in invalid))


def claim_tally(rows: list[dict]) -> dict:
    """How many claim rows (one per notebook, profile, grid point and claim) held in every seed,
    had no power, and failed (did not hold, mixed, not evidence, or post hoc with no unseen
    seed)."""
    held = sum(r["verdict"] == "holds" for r in rows)
    powerless = sum(r["verdict"] == NO_POWER for r in rows)
    return {"claims": len(rows), "held": held, "no_power": powerless,
            "failed": len(rows) - held - powerless}


CSV_COLUMNS = ["claim", "kind", "point", "statement", "metric", "direction", "margin",
               "ours_mean_std", "baseline", "paper_value", "paper_source", "negative_control",
               "control_verdict", "seeds", "verdict", "verdict_why", "post_hoc", "on_seed_mean",
               "iqm_diff_ci", "confident", "asserted", "device", "wall_s", "family", "paper_id",
               "looked_at", "power_plan"]
"""Columns of ``reproductions/<notebook>/<profile>_summary.csv``, one row per claim (tables
written before ``family``, ``paper_id`` or ``looked_at`` were columns read their family from the
notebook's number, and no second paper and no reason)."""
CURVE_CSV_COLUMNS = ["curve", "point", "runs", "seeds", "start", "peak", "final",
                     "higher_is_better", "collapse_drop", "collapsed_runs"]
"""Columns of ``reproductions/<notebook>/<profile>_curves.csv``, one row per learning curve."""


def _bool(cell: str) -> bool:
    return cell.strip() == "True"


def _legacy_post_hoc(c: dict) -> dict:
    """A post-hoc row of a table published before post-hoc verdicts came from unseen seeds (no
    ``looked_at`` column): its verdict covered the looked-at seeds, so it becomes ``NO_UNSEEN``
    and the old verdict moves into the reason."""
    old = c["verdict"] + (f" ({c['verdict_why']})" if c.get("verdict_why") else "")
    return {"verdict": NO_UNSEEN, "verdict_why": f"published over seeds that include the looked-at "
                                                  f"ones: {old}; re-judge on unseen seeds"}


def _legacy_power(c: dict) -> dict:
    """A row of a table published before the ``power_plan`` column, judged by today's rule for a
    claim without a plan (``unresolved_failure``) from the interval and seed count the table
    recorded: a failure the seeds did not decide becomes ``NO_POWER``, the old verdict moving into
    the reason. {} when the row stands (or records no interval to judge it by)."""
    import re

    m = re.search(r"\[([-+0-9.e]+), ([-+0-9.e]+)\]", c.get("iqm_diff_ci") or "")
    n = re.search(r"\(n=(\d+)\)", c.get("confident") or "")
    if not (m and n) or c["verdict"] in (NO_POWER, NO_UNSEEN):
        return {}
    why = unresolved_failure(c["verdict"], c["kind"], c["direction"], float(c["margin"] or 0.0),
                             (float(m.group(1)), float(m.group(2))), int(n.group(1)))
    if not why:
        return {}
    old = c["verdict"] + (f" ({c['verdict_why']})" if c.get("verdict_why") else "")
    return {"verdict": NO_POWER, "verdict_why": f"{why}; the table read {old}",
            "power_plan": "not recorded"}


def rows_from_tables(repro_root: Path | str, profile: str) -> tuple[list[dict], list[dict]]:
    """The claim rows and curve rows of one profile read back from the committed tables
    (``reproductions/<notebook>/<profile>_summary.csv`` and ``_curves.csv``): what ``summarise``
    and ``summarise_curves`` gave when they were published, as far as ``markdown`` needs them
    (a post-hoc row of an older table reads as ``NO_UNSEEN``: ``_legacy_post_hoc``)."""
    import csv

    rows, curve_rows = [], []
    for path in sorted(Path(repro_root).glob(f"*/{profile}_summary.csv")):
        nb = path.parent.name
        with path.open(newline="") as f:
            for c in csv.DictReader(f):
                if _bool(c["post_hoc"]) and "looked_at" not in c:
                    c.update(_legacy_post_hoc(c))
                if "power_plan" not in c:
                    c.update(_legacy_power(c))
                rows.append({
                    "family": c.get("family") or family_of({"notebook": nb}), "notebook": nb,
                    "profile": profile, "point": c["point"], "claim": c["claim"],
                    "kind": c["kind"], "paper_id": c.get("paper_id") or "",
                    "post_hoc": _bool(c["post_hoc"]), "looked_at": c.get("looked_at") or "",
                    "statement": c["statement"], "metric": c["metric"],
                    "direction": c["direction"], "margin": float(c["margin"] or 0.0),
                    "asserted": _bool(c["asserted"]),
                    "seeds": [int(x) if x.lstrip("-").isdigit() else x for x in c["seeds"].split()],
                    "ours": c["ours_mean_std"], "baseline": c["baseline"],
                    "paper_value": c["paper_value"] or None, "source": c["paper_source"] or None,
                    "verdict": c["verdict"], "why": c["verdict_why"],
                    "control": c["negative_control"], "control_verdict": c["control_verdict"],
                    "iqm": c["iqm_diff_ci"], "confident": c["confident"],
                    "on_mean": c["on_seed_mean"],
                    "devices": [d for d in c["device"].split("; ") if d],
                    "wall_s": c["wall_s"], "power_plan": c.get("power_plan") or "not recorded"})
        curves = path.parent / f"{profile}_curves.csv"
        if not curves.is_file():
            continue
        family = rows[-1]["family"] if rows and rows[-1]["notebook"] == nb else \
            family_of({"notebook": nb})
        with curves.open(newline="") as f:
            for c in csv.DictReader(f):
                n, runs = int(c["collapsed_runs"]), int(c["runs"])
                curve_rows.append({
                    "family": family, "notebook": nb, "profile": profile, "point": c["point"],
                    "curve": c["curve"], "runs": runs,
                    "seeds": [int(x) if x.lstrip("-").isdigit() else x for x in c["seeds"].split()],
                    "start": c["start"], "peak": c["peak"], "final": c["final"],
                    "peak_differs": c["peak"] != "= final",
                    "higher_is_better": _bool(c["higher_is_better"]),
                    "collapse_drop": float(c["collapse_drop"]), "collapsed": n,
                    "collapsed_cell": f"collapsed {n}/{runs}" if n else f"no (0/{runs})"})
    return rows, curve_rows


def publish(runs_root: Path | str, repro_root: Path | str, profile: str) -> list[Path]:
    """Write the committed summaries of one profile: per notebook with runs under ``runs_root``,
    ``<profile>_summary.csv``, ``<profile>_curves.csv`` (when it records learning curves) and the
    lowest seed's figures; then ``reproductions/RESULTS.md`` (a section per profile) over every
    notebook with tables of that profile, so publishing a few notebooks keeps the others' rows."""
    import csv
    import shutil

    runs_root, repro_root = Path(runs_root), Path(repro_root)
    results = [r for r in collect(runs_root) if r.get("profile") == profile]
    rows = summarise(results)
    curve_rows = summarise_curves(results)
    written = []
    drop_stale(repro_root, {r["notebook"] for r in rows}, profile)
    for nb in sorted({r["notebook"] for r in rows}):
        out = repro_root / nb
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{profile}_summary.csv"
        nb_rows = [r for r in rows if r["notebook"] == nb]
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(CSV_COLUMNS)
            for r in nb_rows:
                w.writerow([r["claim"], r["kind"], r["point"], r["statement"], r["metric"],
                            r["direction"], r["margin"], r["ours"], r["baseline"],
                            r["paper_value"], r["source"], r["control"], r["control_verdict"],
                            " ".join(map(str, r["seeds"])), r["verdict"], r["why"],
                            r["post_hoc"], r["on_mean"], r["iqm"], r["confident"], r["asserted"],
                            "; ".join(r["devices"]), r["wall_s"], r["family"],
                            r.get("paper_id", ""), r.get("looked_at", ""),
                            r.get("power_plan", "")])
        written.append(path)
        nb_curves = [c for c in curve_rows if c["notebook"] == nb]
        curves_path = out / f"{profile}_curves.csv"
        if nb_curves:
            with curves_path.open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow(CURVE_CSV_COLUMNS)
                for c in nb_curves:
                    w.writerow([c["curve"], c["point"], c["runs"], " ".join(map(str, c["seeds"])),
                                c["start"], _peak_cell(c), c["final"], c["higher_is_better"],
                                f"{c['collapse_drop']:.4g}", c["collapsed"]])
            written.append(curves_path)
        else:
            curves_path.unlink(missing_ok=True)  # a stale table of curves no longer recorded
        dirs = sorted((res["_dir"] for res in results if res["notebook"] == nb),
                      key=lambda d: int(Path(d).name.removeprefix("seed") or 0))
        for d in dirs[:1]:
            for fig in sorted((Path(d) / "figures").glob("*.png")):
                (out / "figures").mkdir(exist_ok=True)
                dst = out / "figures" / f"{profile}_{Path(d).name}_{fig.name}"
                shutil.copyfile(fig, dst)
                written.append(dst)
    # the section covers every notebook with committed tables of this profile: these runs' rows,
    # and the other notebooks' rows read back from their tables (publishing one notebook keeps
    # the rest)
    fresh = {r["notebook"] for r in rows}
    kept, kept_curves = rows_from_tables(repro_root, profile)
    rows = sorted(rows + [r for r in kept if r["notebook"] not in fresh],
                  key=lambda r: (r["notebook"], r["profile"], r["point"]))
    curve_rows = sorted(curve_rows + [c for c in kept_curves if c["notebook"] not in fresh],
                        key=lambda c: (c["notebook"], c["profile"], c["point"]))
    md = repro_root / "RESULTS.md"
    old = md.read_text() if md.is_file() else "# Reproduction results\n\nGenerated by `agentrl report --publish`.\n"
    start, end = f"<!-- profile:{profile} -->", f"<!-- /profile:{profile} -->"
    devices = sorted({d for r in rows for d in r["devices"]})
    section = (f"{start}\n## Profile `{profile}`\n\nDevice: {'; '.join(devices) or '?'}. "
               f"Mean ± std over the seeds listed; verdict 'holds' means in every seed, 'not "
               f"evidence' that it held but its negative control passed too, or that it is an "
               f"agreement or non-inferiority claim without one. Only claims of kind `paper` count "
               f"towards a paper reproducing (a second paper's, `paper of <id>`, for that paper); "
               f"`extension` claims, the notebook's own findings, are counted apart; a post-hoc "
               f"claim's verdict comes from the seeds never looked at; 'no power' that its "
               f"positive control did not learn, its panel and seeds could not detect its "
               f"margin, or (a failed claim without a power plan) the seeds' 95% interval of "
               f"the difference reaches past its bar.\n\n{scoreboard_markdown(rows, _fidelity_of(repro_root), read_stale(repro_root))}\n"
               f"{markdown(rows, curve_rows)}{end}")
    if start in old:
        old = old[:old.index(start)] + section + old[old.index(end) + len(end):]
    else:
        old = old.rstrip() + "\n\n" + section + "\n"
    write_atomic(md, old)
    written.append(md)
    return written


def _claim_calls(notebook: Path | str):
    """Each ``claim(...)`` call in a notebook's code cells, as (its id node, {keyword: value
    node}, with the positional argument nodes under ``"_args"``); IPython lines (``%``, ``!``)
    are blanked before parsing."""
    import ast

    for cell in json.loads(Path(notebook).read_text())["cells"]:
        src = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
        if "claim(" not in src:
            continue
        src = "\n".join("" if x.lstrip().startswith(("%", "!")) else x for x in src.splitlines())
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "claim":
                kw = {k.arg: k.value for k in node.keywords}
                kw["_args"] = node.args
                yield (node.args[0] if node.args else kw.get("id")), kw


def claim_kinds(notebook: Path | str) -> dict[str, tuple[str, str]]:
    """{claim id: (kind, paper_id or '')} of every ``claim(...)`` call in a notebook's code cells
    whose kind is a string literal; an id built at run time from a literal prefix ("stabler_" +
    name, f"lm_{x}") is keyed 'prefix*', any other is skipped. IPython lines (``%``, ``!``) are
    blanked before parsing."""
    import ast

    out = {}
    for cid, kw in _claim_calls(notebook):
        kind, pid = kw.get("kind"), kw.get("paper_id")
        if isinstance(cid, ast.BinOp) and isinstance(cid.op, ast.Add):
            cid = cid.left
            key = f"{cid.value}*" if isinstance(cid, ast.Constant) else None
        elif isinstance(cid, ast.JoinedStr) and cid.values:
            first = cid.values[0]
            key = f"{first.value}*" if isinstance(first, ast.Constant) else None
        else:
            key = cid.value if isinstance(cid, ast.Constant) else None
        if isinstance(key, str) and isinstance(kind, ast.Constant):
            out[key] = (kind.value, pid.value if isinstance(pid, ast.Constant) else "")
    return out


def claim_bounds(notebook: Path | str) -> dict[str, float]:
    """{claim id: bound} of every ``claim(...)`` call in a notebook's code cells whose id is a
    string literal and whose ``power`` is a dict literal with a numeric ``"bound"`` (the metric's
    floor or ceiling: ``results.out_of_reach``)."""
    import ast

    out = {}
    for cid, kw in _claim_calls(notebook):
        power = kw.get("power")
        if not (isinstance(cid, ast.Constant) and isinstance(power, ast.Dict)):
            continue
        for k, v in zip(power.keys, power.values):
            if isinstance(k, ast.Constant) and k.value == "bound":
                try:
                    out[cid.value] = float(ast.literal_eval(v))
                except (ValueError, TypeError):
                    pass
    return out


def claim_forms(notebook: Path | str) -> dict[str, tuple[str, float]]:
    """{claim id: (direction, margin)} of every ``claim(...)`` call in a notebook's code cells
    whose id, direction and margin are literals, positional or by keyword (missing, they are
    ``claim``'s defaults: ">" and 0)."""
    import ast

    out = {}
    for cid, kw in _claim_calls(notebook):
        if not isinstance(cid, ast.Constant):
            continue
        args = kw["_args"]  # claim(id, statement, metric, ours, baseline, direction, margin)
        direction = kw.get("direction", args[5] if len(args) > 5 else ast.Constant(">"))
        margin = kw.get("margin", args[6] if len(args) > 6 else None)
        try:
            direction = ast.literal_eval(direction)
            margin = float(ast.literal_eval(margin)) if margin is not None else 0.0
        except (ValueError, TypeError, SyntaxError):
            continue
        if isinstance(direction, str):
            out[cid.value] = (direction, margin)
    return out


def claim_controlled(notebook: Path | str) -> set[str]:
    """The ids (string literals) of a notebook's ``claim(...)`` calls that pass ``control=``."""
    import ast

    return {cid.value for cid, kw in _claim_calls(notebook)
            if isinstance(cid, ast.Constant) and "control" in kw}


def table_drift(repro_root: Path | str, notebooks_dir: Path | str, profile: str) -> list[str]:
    """Where a committed ``<profile>_summary.csv`` no longer states what its notebook's claim
    calls state (a claim's direction or margin changed after the table was run, or the claim now
    has a negative control the table never measured), one line each: the table then judges a
    claim the notebook no longer makes, so it must be run again or be listed in ``stale.csv``
    (whose notebooks are skipped here). Claims the table lacks (a profile may not reach them) and
    ids built at run time are not compared."""
    import csv

    stale = read_stale(repro_root)
    lines = []
    for path in sorted(Path(repro_root).glob(f"*/{profile}_summary.csv")):
        nb = path.parent.name
        source = Path(notebooks_dir) / f"{nb}.ipynb"
        if (nb, profile) in stale or not source.is_file():
            continue
        with path.open(newline="") as f:
            rows = {r["claim"]: r for r in csv.DictReader(f)}
        controlled = claim_controlled(source)
        for cid, (direction, margin) in claim_forms(source).items():
            row = rows.get(cid)
            if row is None:
                continue
            was = (row["direction"], float(row["margin"] or 0.0))
            if was[0] != direction or abs(was[1] - margin) > 1e-12 * max(1.0, abs(margin)):
                lines.append(f"{nb} {cid}: the table has {was[0]} {was[1]:g}, the notebook "
                             f"{direction} {margin:g}")
            elif cid in controlled and (row.get("negative_control") or "—") == "—":
                lines.append(f"{nb} {cid}: the notebook gives it a negative control, the table "
                             f"has none")
    return lines


def _bound_power(row: dict, bound: float) -> dict:
    """A committed row under a bound its notebook now declares: NO_POWER when the baseline's seed
    mean leaves no room for the margin (then at least one seed's baseline does not either, so the
    claim could not have held at every seed); {} otherwise or when already so."""
    from agentrl_lib.pipeline.results import out_of_reach

    try:
        baseline = float((row.get("baseline") or "").split(" ")[0])
    except ValueError:
        return {}
    why = out_of_reach(bound, baseline, row["direction"], float(row["margin"] or 0.0))
    if not why or row["verdict"] == NO_POWER:
        return {}
    why = why.replace("the baseline", "the baseline's seed mean", 1)
    old = row["verdict"] + (f" ({row['verdict_why']})" if row.get("verdict_why") else "")
    plan = row.get("power_plan") or "none"
    return {"verdict": NO_POWER, "verdict_why": f"{why}; the table read {old}",
            "power_plan": f"metric bound {bound:.3g}" if plan in ("none", "not recorded")
            else f"{plan}; metric bound {bound:.3g}"}


def relabel(repro_root: Path | str, notebooks_dir: Path | str, profile: str) -> list[str]:
    """Give the committed tables of one profile (``<profile>_summary.csv``) each claim's kind and
    ``paper_id`` as its notebook's ``claim(...)`` call now writes them (``claim_kinds``), without
    rerunning anything: no other cell changes, no number; a table keeps its columns (an old
    layout gains ``paper_id`` where a row needs one). A table from before the ``power_plan``
    column gains it, and its failures the seeds did not decide read "no power" (``_legacy_power``);
    a claim whose notebook now declares its metric's bound reads "no power" where the baseline
    left no room for the margin (``claim_bounds``, ``_bound_power``).
    Returns one line per changed claim, 'notebook claim: old -> new'.
    ``agentrl report --relabel PROFILE`` runs it and then rebuilds RESULTS.md from the tables."""
    import csv

    changes = []
    for path in sorted(Path(repro_root).glob(f"*/{profile}_summary.csv")):
        nb = path.parent.name
        source = Path(notebooks_dir) / f"{nb}.ipynb"
        kinds = claim_kinds(source) if source.is_file() else {}
        bounds = claim_bounds(source) if source.is_file() else {}
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            table, columns = list(reader), list(reader.fieldnames or CSV_COLUMNS)
        changed = False
        prefixes = sorted((k for k in kinds if k.endswith("*")), key=len, reverse=True)
        for row in table:
            new = kinds.get(row["claim"]) or next(
                (kinds[k] for k in prefixes if row["claim"].startswith(k[:-1])), None)
            old = (row["kind"], row.get("paper_id") or "")
            if new is not None and new != old:
                changes.append(f"{nb} {row['claim']}: {' of '.join(filter(None, old))} -> "
                               f"{' of '.join(filter(None, new))}")
                row["kind"], row["paper_id"] = new
                changed = True
            update = _bound_power(row, bounds[row["claim"]]) if row["claim"] in bounds else {}
            if update:
                changes.append(f"{nb} {row['claim']}: {row['verdict']} -> {NO_POWER}")
                row.update(update)
                changed = True
            if "power_plan" not in columns:  # a table from before the column: today's rule
                update = _legacy_power(row)
                if update:
                    changes.append(f"{nb} {row['claim']}: {row['verdict']} -> {NO_POWER}")
                row.update(update or {"power_plan": row.get("power_plan") or "not recorded"})
                changed = True
        if changed:  # the table keeps its layout; paper_id is added where a row needs one
            if "paper_id" not in columns and any(r.get("paper_id") for r in table):
                columns.append("paper_id")
            if "power_plan" not in columns:
                columns.append("power_plan")
            with path.open("w", newline="") as f:
                w = csv.DictWriter(f, columns, restval="", extrasaction="ignore")
                w.writeheader()
                w.writerows(table)
    return changes


def _fidelity_of(repro_root: Path) -> dict:
    from agentrl_lib.pipeline.fidelity import read_counts

    path = Path(repro_root) / "fidelity" / "counts.csv"
    return read_counts(path) if path.is_file() else {}


def rebuild_results_md(repro_root: Path | str, profile: str) -> Path:
    """Rewrite the profile's section of ``reproductions/RESULTS.md`` from the committed tables
    alone (``publish`` over no runs)."""
    import tempfile

    with tempfile.TemporaryDirectory() as empty:
        publish(empty, repro_root, profile)
    return Path(repro_root) / "RESULTS.md"
