"""Your runs against the reference: each claim of the runs you made beside the committed result of
the same notebook, profile, grid point and claim (``reproductions/<nb>/<profile>_summary.csv``),
and whether yours agrees with it within the seeds' noise.

**The rule** (``agreement``), applied to the claim's ``ours`` and, where both sides have one, its
``baseline``: with your seeds' values x_1..x_n (mean m, std s, ddof=1) and the reference's mean
m_r, std s_r over its n_r seeds (read back from the table's "mean ± std" cell, so at the 4
significant digits it keeps), yours **agrees** when |m - m_r| <= t_{0.975, df} * se, with
se = sqrt(s^2/n + s_r^2/n_r) and df Welch-Satterthwaite's: the 95% interval of the difference of
two seed means (Welch's t-interval), i.e. the reference's mean lies within your runs' t-interval
widened by the reference's own. A side with one seed has no spread of its own: it borrows the
other side's std (a run on your machine is taken to be as noisy as the reference's seeds), so
se = s_other * sqrt(1/n + 1/n_r) with that std's n_other - 1 degrees of freedom; with one seed
on both sides nothing can be said ('—'). When
neither side varies (an exact or deterministic quantity), yours agrees when it equals the
reference at the 4 significant digits the table keeps. A claim agrees when every compared
quantity does. 'differs' is a finding to look into (another machine, library version or a
changed notebook), not a verdict on the paper.

A partial report (only some notebooks run) still shows every notebook with a committed table
(``reference_only_rows``): yours where you ran it, the reference otherwise, marked
``origin == "reference"``.
"""

from __future__ import annotations

import math
import re

import numpy as np

SIG = 4
"""significant digits of the committed tables' means (``report._fmt``)"""
_CELL = re.compile(r"^\s*([-+0-9.eEinfa]+)\s*(?:±\s*([-+0-9.eEinfa]+))?\s*$")


def parse_mean_std(cell) -> tuple[float, float] | None:
    """(mean, std) of a table cell written by ``report._fmt``; None for '—' or text.

    >>> parse_mean_std("0.29 ± 0.015"), parse_mean_std("1e-08"), parse_mean_std("—")
    ((0.29, 0.015), (1e-08, 0.0), None)
    """
    m = _CELL.match(str(cell or ""))
    if not m:
        return None
    try:
        return float(m.group(1)), float(m.group(2) or 0.0)
    except ValueError:
        return None


def _rounded(x: float) -> float:
    return float(f"{x:.{SIG}g}")


def agreement(mine: list[float], ref_mean: float, ref_std: float, ref_n: int) -> dict:
    """Whether the seed values ``mine`` agree with a reference mean +- std over ``ref_n`` seeds
    (the module docstring's rule): {'verdict': 'agrees' | 'differs' | '—', 'diff', 'half'}.

    >>> agreement([0.30, 0.33, 0.27], 0.29, 0.02, 3)["verdict"]
    'agrees'
    >>> agreement([0.50, 0.52, 0.48], 0.29, 0.02, 3)["verdict"]
    'differs'
    >>> agreement([0.31], 0.29, 0.02, 3)["verdict"], agreement([0.31], 0.29, 0.0, 1)["verdict"]
    ('agrees', '—')
    >>> exact = [agreement(x, 1e-08, 0.0, 3)["verdict"] for x in ([1e-8, 1e-8], [0.0])]
    >>> exact
    ['agrees', 'differs']
    """
    from scipy.stats import t

    x = np.asarray([v for v in mine if v is not None], dtype=float)
    n = len(x)
    if n == 0 or ref_n < 1 or not math.isfinite(ref_mean):
        return {"verdict": "—", "diff": None, "half": None}
    m = float(x.mean())
    s = float(x.std(ddof=1)) if n > 1 else None
    s_r = ref_std if ref_n > 1 else None
    if (s in (None, 0.0)) and (s_r in (None, 0.0)) and (n > 1 or ref_n > 1):
        same = _rounded(m) == _rounded(ref_mean)  # neither side varies: equal at the table's digits
        return {"verdict": "agrees" if same else "differs", "diff": m - ref_mean, "half": 0.0}
    if s is None and s_r is None:
        return {"verdict": "—", "diff": m - ref_mean, "half": None}
    if s is None or s_r is None:
        # a side with one seed borrows the other's std: one estimate, with its degrees of freedom
        s_one, df = (s_r, ref_n - 1) if s is None else (s, n - 1)
        se = s_one * math.sqrt(1 / n + 1 / ref_n)
    else:
        v, v_r = s * s / n, s_r * s_r / ref_n
        se = math.sqrt(v + v_r)
        df = (v + v_r) ** 2 / (v * v / (n - 1) + v_r * v_r / (ref_n - 1))  # Welch-Satterthwaite
    half = float(t.ppf(0.975, df)) * se
    return {"verdict": "agrees" if abs(m - ref_mean) <= half else "differs",
            "diff": m - ref_mean, "half": half}


def _key(r: dict) -> tuple:
    return (r["notebook"], r["profile"], r.get("point", ""), r["claim"])


def claim_values(results: list[dict]) -> dict[tuple, dict[str, list]]:
    """{(notebook, profile, point, claim): {'ours': [...], 'baseline': [...]}} over the seeds."""
    out: dict[tuple, dict[str, list]] = {}
    for res in results:
        for c in res.get("claims", []):
            key = (res["notebook"], res.get("profile", "?"), res.get("point", ""), c["id"])
            d = out.setdefault(key, {"ours": [], "baseline": []})
            for k in ("ours", "baseline"):
                if isinstance(c.get(k), (int, float)) and not isinstance(c.get(k), bool):
                    d[k].append(float(c[k]))
    return out


def compare_rows(rows: list[dict], results: list[dict], ref_rows: list[dict]) -> list[dict]:
    """Each of your claim rows (``report.summarise``) with ``reference`` (the committed row's
    'ours' cell, its seeds and verdict; '' when there is none) and ``agreement`` ('agrees',
    'differs', '—', or 'no reference') and ``agreement_why``; the rows are updated in place."""
    refs = {_key(r): r for r in ref_rows}
    values = claim_values(results)
    for r in rows:
        ref = refs.get(_key(r))
        if ref is None:
            r.update(reference="", agreement="no reference", agreement_why="")
            continue
        n_r = len(ref["seeds"])
        r["reference"] = (f"{ref['ours']} (seeds {','.join(map(str, ref['seeds']))}; "
                          f"{ref['verdict']})")
        mine = values.get(_key(r), {"ours": [], "baseline": []})
        parts, why = [], []
        for k in ("ours", "baseline"):
            parsed = parse_mean_std(ref["ours"] if k == "ours" else ref["baseline"])
            if parsed is None or not mine[k]:
                continue
            a = agreement(mine[k], parsed[0], parsed[1], n_r)
            parts.append(a["verdict"])
            if a["diff"] is not None:
                why.append(f"{k}: diff {a['diff']:+.3g}" + (
                    f", allowed ±{a['half']:.3g}" if a["half"] else ""))
        if not parts or "—" in parts:
            verdict = "—"
        else:
            verdict = "agrees" if all(p == "agrees" for p in parts) else "differs"
        r.update(agreement=verdict, agreement_why="; ".join(why))
    return rows


def reference_only_rows(rows: list[dict], ref_rows: list[dict]) -> list[dict]:
    """The committed rows of every notebook you did not run in that profile, marked
    ``origin='reference'`` (a partial report still shows every notebook)."""
    ran = {(r["notebook"], r["profile"]) for r in rows}
    out = []
    for ref in ref_rows:
        if (ref["notebook"], ref["profile"]) in ran:
            continue
        out.append({**ref, "origin": "reference", "title": ref["notebook"], "paper": None,
                    "url": None, "reference": "", "agreement": "reference only",
                    "agreement_why": "not run here: the committed table's row"})
    return out


def attach(rows: list[dict], results: list[dict], repro_root, read_tables,
           profiles=None) -> list[dict]:
    """``rows`` compared with the committed tables under ``repro_root`` of ``profiles`` (default:
    the profiles of ``rows``, else 'cpu'), followed by the reference-only rows; ``rows`` unchanged
    when ``repro_root`` is None or has no tables. ``read_tables(repro_root, profile)`` gives a
    profile's committed rows first (``report.rows_from_tables``, passed in: report imports this
    module)."""
    from pathlib import Path

    if repro_root is None or not Path(repro_root).is_dir():
        return rows
    profiles = profiles or sorted({r["profile"] for r in rows}) or ["cpu"]
    ref_rows = [x for p in profiles for x in read_tables(repro_root, p)[0]]
    for r in rows:
        r.setdefault("origin", "yours")
    compare_rows(rows, results, ref_rows)
    # by notebook, profile and point, each notebook's claims in their order (a stable sort)
    return sorted(rows + reference_only_rows(rows, ref_rows),
                  key=lambda r: (r["notebook"], r["profile"], r.get("point", "")))


def cell(r: dict) -> str:
    """The report's 'reference' cell of a claim row (plain text)."""
    if r.get("origin") == "reference":
        return "reference only: not run here"
    if not r.get("reference"):
        return r.get("agreement", "—") or "—"
    why = f" ({r['agreement_why']})" if r.get("agreement_why") else ""
    return f"{r['reference']}: {r['agreement']}{why}"


def markdown(rows: list[dict]) -> str:
    """A section of summary.md: each claim against the reference, one line a claim."""
    if not any("agreement" in r for r in rows):
        return ""
    lines = ["## Your runs against the reference\n",
             "Rule: Welch's 95% t-interval of the difference of seed means "
             "(agentrl_lib/pipeline/reference.py).\n",
             "| notebook | profile | claim | yours | reference (committed) | agrees? |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        prof = r["profile"] + (f" [{r['point']}]" if r.get("point") else "")
        yours = "— (not run here)" if r.get("origin") == "reference" else r["ours"]
        ref = r["ours"] if r.get("origin") == "reference" else r.get("reference", "")
        lines.append(f"| {r['notebook']} | {prof} | {r['claim']} | {yours} | {ref} | "
                     f"{r.get('agreement', '—')}"
                     f"{' (' + r['agreement_why'] + ')' if r.get('agreement_why') else ''} |")
    return "\n".join(lines) + "\n"
