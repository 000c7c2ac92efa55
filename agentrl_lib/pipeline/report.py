"""Collect every ``results.json`` under ``runs/`` into one report: a self-contained HTML page
(figures embedded, opens from a file with no server) and a markdown table, per family and paper.

Per notebook, profile, grid point and claim: ours and the baseline as mean +- std over seeds, the
paper's number and where in the paper it comes from, and three verdicts:
- every seed: 'holds' when the claim held in every seed, 'mixed k/n' when in some, 'does not
  hold' when in none;
- on the seed mean: the claim's own rule applied to the means;
- with confidence: the IQM of the paired difference ours - baseline and its 95% bootstrap CI
  (``stats.ordering_verdict``), 'yes' when the whole interval clears the margin.
Runs that failed before writing a result are listed too.
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def _readable(runs_root: Path, name: str):
    """(path, parsed JSON) of every readable ``name`` file under ``runs_root``, sorted."""
    for path in sorted(Path(runs_root).rglob(name)):
        try:
            yield path, json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue


def collect(runs_root: Path) -> list[dict]:
    """Every readable results.json under ``runs_root`` (``.tmp`` files are never read)."""
    return [{**r, "_dir": str(path.parent)} for path, r in _readable(runs_root, "results.json")]


def failed_runs(runs_root: Path) -> list[dict]:
    out = []
    for path, r in _readable(runs_root, "run.json"):
        if not r.get("ok") and not (path.parent / "results.json").exists():
            out.append({"dir": str(path.parent), "error": r.get("error", "")})
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


def _confidence(claims: list[dict]) -> dict:
    from agentrl_lib.pipeline.stats import ordering_verdict

    ours = [c["ours"] for c in claims]
    base = [c["baseline"] for c in claims]
    if any(v is None for v in ours) or any(b is None for b in base):
        return {"iqm": "—", "confident": "—"}
    v = ordering_verdict(ours, base, claims[0].get("direction", ">"), claims[0].get("margin", 0.0))
    lo, hi = v["diff_ci"]
    return {"iqm": f"{v['ours_iqm']:.4g}; diff {v['diff_iqm']:+.3g} [{lo:+.3g}, {hi:+.3g}]",
            "confident": f"{'yes' if v['confident'] else 'no'} (n={v['n']})"}


def summarise(results: list[dict]) -> list[dict]:
    """One row per (notebook, profile, grid point, claim) with the numbers across seeds."""
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
        n_hold = sum(bool(c["holds"]) for c in claims)
        n = len(claims)
        verdict = "holds" if n_hold == n else ("does not hold" if n_hold == 0 else
                                               f"mixed {n_hold}/{n}")
        first = claims[0]
        paper = meta[nb].get("paper") or {}
        # the claim's own direction and margin applied to the means over seeds (a bar stated on
        # the mean of seeds, such as CartPole's 475, is judged here rather than seed by seed)
        from agentrl_lib.pipeline.results import claim as _claim

        ours_vals = [c["ours"] for c in claims if c["ours"] is not None]
        base_vals = [c["baseline"] for c in claims if c["baseline"] is not None]
        on_mean = None
        if ours_vals and base_vals:
            on_mean = _claim(cid, "", "", float(np.mean(ours_vals)), float(np.mean(base_vals)),
                             first.get("direction", ">"), first.get("margin", 0.0)).holds
        rows.append({
            "family": family_of(meta[nb]), "point": point,
            "notebook": nb, "title": meta[nb].get("title") or nb, "paper": paper.get("title"),
            "url": paper.get("url"), "profile": profile, "claim": cid,
            "statement": first["statement"], "metric": first["metric"],
            "direction": first.get("direction", ""), "asserted": first.get("asserted", True),
            "seeds": [s for s, _, _ in items], "ours": _fmt([c["ours"] for c in claims]),
            "baseline": _fmt([c["baseline"] for c in claims]),
            "paper_value": first.get("paper_value"), "source": first.get("source"),
            "verdict": verdict, **_confidence(claims),
            "on_mean": {None: "—", True: "holds", False: "does not hold"}[on_mean],
            "devices": sorted({r.get("device", "?") for _, _, r in items}),
            "wall_s": _fmt([r.get("wall_s") for _, _, r in items]),
        })
    return rows


def _paper_cell(r: dict) -> str:
    pv = "" if r["paper_value"] is None else str(r["paper_value"])
    return pv + (f" ({r['source']})" if r.get("source") and pv else "")


def markdown(rows: list[dict]) -> str:
    """One table per family; the grid point, when there is one, follows the profile."""
    head = ("| notebook | profile | claim | ours (mean ± std) | baseline | paper | seeds | verdict "
            "(every seed) | on the seed mean | IQM; diff [95% CI] | with confidence |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    out = []
    for fam in dict.fromkeys(r.get("family", "other") for r in rows):
        body = []
        for r in (r for r in rows if r.get("family", "other") == fam):
            seeds = ",".join(str(s) for s in r["seeds"])
            note = "" if r["asserted"] else " (reported, not asserted)"
            prof = r["profile"] + (f" [{r['point']}]" if r.get("point") else "")
            body.append(f"| {r['notebook']} | {prof} | {r['statement']} ({r['metric']}, "
                        f"{r['direction']}) | {r['ours']} | {r['baseline']} | {_paper_cell(r)} | "
                        f"{seeds} | **{r['verdict']}**{note} | {r['on_mean']} | "
                        f"{r.get('iqm', '—')} | {r.get('confident', '—')} |")
        out.append(f"### Family: {fam}\n\n" + head + "\n".join(body) + "\n")
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;width:100%;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;
vertical-align:top}th{background:#f3f3f3}.holds{color:#1a7f37;font-weight:600}
.mixed{color:#9a6700;font-weight:600}.no{color:#cf222e;font-weight:600}img{max-width:560px;margin:4px}
h2{border-bottom:1px solid #ddd;padding-bottom:4px}.small{color:#666;font-size:13px}"""


def _figures(run_dirs: list[str]) -> list[tuple[str, str]]:
    """(caption, base64 PNG) for the figures of the first seed's run directory that has any."""
    for d in run_dirs:
        figs = sorted((Path(d) / "figures").glob("*.png"))
        if figs:
            return [(f"{Path(d).name}: {f.stem}", base64.b64encode(f.read_bytes()).decode())
                    for f in figs]
    return []


def render_html(rows: list[dict], results: list[dict], failures: list[dict]) -> str:
    e = html.escape
    parts = [f"<!doctype html><meta charset='utf-8'><title>agentrl report</title><style>{_CSS}"
             "</style><h1>agentrl: reproduction report</h1>",
             f"<p class='small'>{len(results)} results from {len({r['notebook'] for r in results})}"
             " notebooks. A verdict 'holds' means the claim held in every seed listed.</p>"]
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
        parts.append(f"<h2>{e(first['title'])}</h2><p>{e(nb)} · paper: {link}</p>")
        parts.append("<table><tr><th>profile</th><th>claim</th><th>metric</th><th>ours</th>"
                     "<th>baseline</th><th>paper</th><th>seeds</th><th>device</th>"
                     "<th>wall s</th><th>verdict (every seed)</th><th>on the seed mean</th>"
                     "<th>IQM; diff [95% CI]</th><th>with confidence</th></tr>")
        for r in nb_rows:
            cls = {"holds": "holds", "does not hold": "no"}.get(r["verdict"], "mixed")
            note = "" if r["asserted"] else "<br><span class='small'>reported, not asserted</span>"
            prof = r["profile"] + (f" [{r['point']}]" if r.get("point") else "")
            parts.append(
                f"<tr><td>{e(prof)}</td><td>{e(r['statement'])}</td>"
                f"<td>{e(r['metric'])} ({e(r['direction'])})</td><td>{e(r['ours'])}</td>"
                f"<td>{e(r['baseline'])}</td><td>{e(_paper_cell(r))}</td>"
                f"<td>{e(','.join(map(str, r['seeds'])))}</td><td>{e('; '.join(r['devices']))}</td>"
                f"<td>{e(r['wall_s'])}</td><td class='{cls}'>{e(r['verdict'])}{note}</td>"
                f"<td>{e(r['on_mean'])}</td><td>{e(r.get('iqm', '—'))}</td>"
                f"<td>{e(r.get('confident', '—'))}</td></tr>")
        parts.append("</table>")
        for profile in sorted({r["profile"] for r in nb_rows}):
            dirs = sorted(res["_dir"] for res in results
                          if res["notebook"] == nb and res.get("profile") == profile)
            figs = _figures(dirs)
            if figs:
                parts.append(f"<p class='small'>figures ({e(profile)} profile)</p>")
                parts.extend(f"<img alt='{e(c)}' title='{e(c)}' src='data:image/png;base64,{b}'>"
                             for c, b in figs)
    if failures:
        parts.append("<h2>Runs that failed before writing results</h2><ul>")
        parts.extend(f"<li>{e(f['dir'])}: {e(f['error'])}</li>" for f in failures)
        parts.append("</ul>")
    return "\n".join(parts)


def build_report(runs_root: Path | str = "runs", out_dir: Path | str = "report") -> dict:
    runs_root, out_dir = Path(runs_root), Path(out_dir)
    results = collect(runs_root)
    rows = summarise(results)
    failures = failed_runs(runs_root)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.md").write_text(markdown(rows))
    (out_dir / "index.html").write_text(render_html(rows, results, failures))
    (out_dir / "summary.json").write_text(json.dumps(rows, indent=2, default=str))
    return {"results": len(results), "rows": len(rows), "failures": len(failures),
            "html": out_dir / "index.html", "markdown": out_dir / "summary.md"}


def publish(runs_root: Path | str, repro_root: Path | str, profile: str) -> list[Path]:
    """Write the committed summaries of one profile: ``reproductions/RESULTS.md`` (a section per
    profile), and per notebook ``<profile>_summary.csv`` and the lowest seed's figures."""
    import csv
    import shutil

    runs_root, repro_root = Path(runs_root), Path(repro_root)
    results = [r for r in collect(runs_root) if r.get("profile") == profile]
    rows = summarise(results)
    written = []
    for nb in sorted({r["notebook"] for r in rows}):
        out = repro_root / nb
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{profile}_summary.csv"
        nb_rows = [r for r in rows if r["notebook"] == nb]
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["claim", "point", "statement", "metric", "direction", "ours_mean_std",
                        "baseline", "paper_value", "paper_source", "seeds", "verdict",
                        "on_seed_mean", "iqm_diff_ci", "confident", "asserted", "device",
                        "wall_s"])
            for r in nb_rows:
                w.writerow([r["claim"], r["point"], r["statement"], r["metric"], r["direction"],
                            r["ours"], r["baseline"], r["paper_value"], r["source"],
                            " ".join(map(str, r["seeds"])), r["verdict"], r["on_mean"], r["iqm"],
                            r["confident"], r["asserted"], "; ".join(r["devices"]), r["wall_s"]])
        written.append(path)
        dirs = sorted((res["_dir"] for res in results if res["notebook"] == nb),
                      key=lambda d: int(Path(d).name.removeprefix("seed") or 0))
        for d in dirs[:1]:
            for fig in sorted((Path(d) / "figures").glob("*.png")):
                (out / "figures").mkdir(exist_ok=True)
                dst = out / "figures" / f"{profile}_{Path(d).name}_{fig.name}"
                shutil.copyfile(fig, dst)
                written.append(dst)
    md = repro_root / "RESULTS.md"
    old = md.read_text() if md.is_file() else "# Reproduction results\n\nGenerated by `agentrl report --publish`.\n"
    start, end = f"<!-- profile:{profile} -->", f"<!-- /profile:{profile} -->"
    devices = sorted({d for r in rows for d in r["devices"]})
    section = (f"{start}\n## Profile `{profile}`\n\nDevice: {'; '.join(devices) or '?'}. "
               f"Mean ± std over the seeds listed; verdict 'holds' means in every seed.\n\n"
               f"{markdown(rows)}{end}")
    if start in old:
        old = old[:old.index(start)] + section + old[old.index(end) + len(end):]
    else:
        old = old.rstrip() + "\n\n" + section + "\n"
    md.write_text(old)
    written.append(md)
    return written
