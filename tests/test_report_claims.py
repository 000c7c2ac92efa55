"""The report's treatment of claim kinds, post-hoc margins, negative controls and learning
curves."""

import csv
import io
import json
from dataclasses import asdict, replace

import pytest

from agentrl_lib.pipeline import report
from agentrl_lib.pipeline.results import (
    COLLAPSE_MARGIN, claim, curve_summary, learning_curve, positive_control, power_plan,
    write_results,
)


def result(seed, claims, metrics=None, nb="05_mixed", profile="cpu"):
    """A results.json as the report reads it (claims as dicts, as write_results stores them)."""
    return {"notebook": nb, "profile": profile, "seed": seed, "title": "Mixed", "paper": {},
            "claims": [c if isinstance(c, dict) else asdict(c) for c in claims],
            "metrics": metrics or {}}


def mixed_claims(seed):
    """Eight claims of every kind; numbers chosen so each rule's outcome is known by hand."""
    return [
        claim("beats", "ours beats the baseline", "acc", 0.8, 0.5, ">", margin=0.1, kind="paper"),
        claim("fails", "ours beats it by a lot", "acc", 0.55, 0.5, ">", margin=0.1, kind="paper"),
        # agreement without a control (claim() now refuses one; results written before the rule
        # hold it): holds, proves nothing
        replace(claim("agrees_bare", "ours agrees with the baseline", "acc", 0.52, 0.5, "~",
                      margin=0.05, kind="paper", control=0.2), control=None, control_fails=None),
        # agreement whose control (0.2, off by 0.3) fails the rule: evidence
        claim("agrees_ctl", "ours agrees with the baseline", "acc", 0.52, 0.5, "~", margin=0.05,
              kind="paper", control=0.2),
        # non-inferiority as a negative margin (ours may be up to 0.05 below), no control
        claim("noninf", "ours is not worse than the baseline", "acc", 0.47, 0.5, ">",
              margin=-0.05, kind="paper"),
        claim("equal_lib", "from scratch equals the library", "max abs diff", 1e-9, 0.0, "~",
              margin=1e-6, kind="sanity", control=0.1),
        claim("contracts", "VI contracts at rate gamma", "ratio", 0.85, 0.9, "<=", kind="theorem"),
        claim("budget", "every arm gets the same samples", "ratio", 1.0, 1.0, ">=", kind="design"),
    ]


def test_only_paper_claims_are_counted():
    rows = report.summarise([result(s, mixed_claims(s)) for s in (0, 1, 2)])
    verdict = {r["claim"]: r["verdict"] for r in rows}
    assert verdict == {"beats": "holds", "fails": "does not hold", "agrees_bare": "not evidence",
                       "agrees_ctl": "holds", "noninf": "not evidence", "equal_lib": "holds",
                       "contracts": "holds", "budget": "holds"}
    assert [r["kind"] for r in rows] == ["paper"] * 5 + ["sanity", "theorem", "design"]
    # 8 claims hold or not; 5 are paper claims; of the 4 paper claims that hold in every seed,
    # 2 are agreement / non-inferiority claims without a control
    assert report.paper_count(rows) == {
        "reproduced": 2, "paper": 5, "not_evidence": 2, "no_power": 0, "second_papers": {},
        "extension": {"reproduced": 0, "of": 0, "not_evidence": 0, "no_power": 0},
        "other": {"sanity": 1, "theorem": 1, "design": 1}}
    assert report.count_line(rows) == ("Paper claims reproduced: 2 of 5 (2 hold but are not "
                                       "evidence); not counted: 1 design, 1 sanity, 1 theorem.")
    md = report.markdown(rows)
    assert "- 05_mixed, cpu: Paper claims reproduced: 2 of 5" in md
    line = next(x for x in md.splitlines() if "VI contracts" in x)
    assert "| theorem |" in line
    html = report.render_html(rows, [], [])
    assert "<td>sanity</td>" in html and "Paper claims reproduced: 2 of 5" in html


def test_no_power_verdict_and_the_scoreboard():
    """A claim whose positive control did not move, or whose panel cannot detect its margin, reads
    'no power' whatever its numbers; one with power keeps its verdict; the count and the
    scoreboard say how many were without power."""
    small, large = power_plan(16, 3, p=0.5), power_plan(4096, 3, p=0.5)
    assert small["mdd"] > 0.05 > large["mdd"]  # 0.55 and 0.034 by the formula
    learned, flat = positive_control(0.3, 0.6, 256), positive_control(0.3, 0.32, 256)

    def seed_claims(s):
        return [claim("tiny_panel", "beats on 16 episodes", "acc", 0.9, 0.5, ">", margin=0.05,
                      kind="paper", power=small, positive_control=learned),
                claim("flat_base", "beats a baseline that never learned", "acc", 0.2, 0.5, "<",
                      margin=0.05, kind="paper", power=large, positive_control=flat),
                claim("powered", "beats with power", "acc", 0.45, 0.5, ">", margin=0.05,
                      kind="paper", power=large, positive_control=learned)]
    rows = report.summarise([result(s, seed_claims(s)) for s in (0, 1, 2)])
    got = {r["claim"]: (r["verdict"], r["why"]) for r in rows}
    assert got["tiny_panel"][0] == got["flat_base"][0] == "no power"
    assert "minimal detectable difference 0.547" in got["tiny_panel"][1]
    assert "positive control" in got["flat_base"][1]
    assert got["powered"] == ("does not hold", "")
    assert report.count_line(rows).startswith("Paper claims reproduced: 0 of 3, 2 without power")
    board = report.scoreboard(rows, {"05_mixed": {"checked_against_code": 1,
                                                 "checked_against_text_only": 2,
                                                 "unverifiable": 3, "differs": 0}})
    assert [(b["no power"], b["do not hold"], b["fidelity: code / text / unverifiable / differs"])
            for b in board] == [(2, 1, "1 / 2 / 3 / 0")]
    assert "| 05_mixed | foundations | cpu | 0,1,2 | 3 | 0 | 1 | 0 | 2 | 0 | 0 | 0/3, 3/3 | — | — |" in \
        report.scoreboard_markdown(rows)
    # one control never learned: the notebook does not count as powered
    assert "learned at every seed in 0 of the 1 notebooks" in report.scoreboard_markdown(rows)
    html = report.render_html(rows, [], [])
    assert "<a href='#05_mixed'>05_mixed</a>" in html and "<h2 id='05_mixed'>" in html
    assert html.index("Scoreboard") < html.index("<h2 id='05_mixed'>")


def test_a_failure_without_a_plan_needs_the_seeds_to_decide_it():
    """A paper or extension claim with no power plan that failed reads 'no power' unless the
    seeds' 95% t-interval of ours - baseline lies wholly on the failing side of the bar; a claim
    that holds, a decided failure and a '>=' bar keep their verdicts; one seed decides nothing."""
    diffs = {"straddles": (0.20, -0.05, 0.12), "short": (0.01, 0.0, 0.02),
             "equal": (0.0, 0.0, 0.0), "holds": (0.2, 0.25, 0.3)}

    def seed_claims(s):
        return [claim(k, k, "acc", 0.5 + d[s], 0.5, ">", margin=0.05 if k != "equal" else 0.0,
                      kind="extension" if k == "short" else "paper") for k, d in diffs.items()] + [
            claim("lower", "lower", "len", 3.0 + (0.5, -0.4, 0.3)[s], 3.0, "<", margin=0.1,
                  kind="paper"),
            claim("bar", "reaches", "acc", 0.4, 0.5, ">=", kind="paper")]
    rows = {r["claim"]: r for r in report.summarise([result(s, seed_claims(s))
                                                     for s in (0, 1, 2)])}
    assert rows["straddles"]["verdict"] == "no power"  # mixed 2/3, interval [-0.26, +0.44]
    assert "no power plan" in rows["straddles"]["why"] and "+0.05" in rows["straddles"]["why"]
    assert rows["lower"]["verdict"] == "no power"  # fails in 2 of 3 seeds, interval crosses -0.1
    assert rows["short"]["verdict"] == "does not hold"  # [-0.015, +0.035], wholly below +0.05
    assert rows["equal"]["verdict"] == "does not hold"  # exactly at the bar at every seed
    assert rows["holds"]["verdict"] == "holds" and rows["bar"]["verdict"] == "does not hold"
    assert {r["power_plan"] for r in rows.values()} == {"none"}
    one = report.summarise([result(0, seed_claims(0))])
    assert {r["claim"]: r["verdict"] for r in one}["short"] == "no power"
    assert "one seed" in next(r["why"] for r in one if r["claim"] == "short")


def test_old_tables_failures_are_rejudged(tmp_path):
    """A table from before the power_plan column: read back (and rewritten by relabel), a failure
    whose recorded interval reaches past the bar reads 'no power', keeping the old verdict in its
    reason; a decided failure stays."""
    table = tmp_path / "reproductions" / "05_mixed" / "cpu_summary.csv"
    table.parent.mkdir(parents=True)
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, report.CSV_COLUMNS[:-1], restval="")
        w.writeheader()
        for cid, verdict, ci in (("wide", "mixed 1/3", "0.5; diff +0.01 [-0.2, +0.22]"),
                                 ("short", "does not hold", "0.5; diff -0.1 [-0.15, -0.05]")):
            w.writerow({"claim": cid, "kind": "paper", "direction": ">", "margin": "0.05",
                        "seeds": "0 1 2", "verdict": verdict, "post_hoc": "False",
                        "asserted": "False", "iqm_diff_ci": ci, "confident": "no (n=3)"})
    wide, short = report.rows_from_tables(tmp_path / "reproductions", "cpu")[0]
    assert wide["verdict"] == "no power" and "the table read mixed 1/3" in wide["why"]
    assert short["verdict"] == "does not hold"
    (tmp_path / "notebooks").mkdir()
    assert report.relabel(tmp_path / "reproductions", tmp_path / "notebooks", "cpu") == [
        "05_mixed wide: mixed 1/3 -> no power"]
    with table.open() as f:
        got = {r["claim"]: (r["verdict"], r["power_plan"]) for r in csv.DictReader(f)}
    assert got == {"wide": ("no power", "not recorded"), "short": ("does not hold", "not recorded")}
    assert report.relabel(tmp_path / "reproductions", tmp_path / "notebooks", "cpu") == []


def test_control_and_evidence_rendering():
    def seed_claims(s):
        # the control passes the rule in seed 1 only (0.49 is within 0.05 of 0.5)
        ctl = {0: 0.2, 1: 0.49, 2: 0.3}[s]
        return [claim("agree", "agrees", "acc", 0.51, 0.5, "~", margin=0.05, kind="paper",
                      control=ctl),
                claim("beat", "beats", "acc", 0.9, 0.5, ">", margin=0.1, kind="paper",
                      control=0.5)]
    agree, beat = report.summarise([result(s, seed_claims(s)) for s in (0, 1, 2)])
    assert agree["verdict"] == "not evidence"
    assert agree["why"] == "holds, but its negative control passes too"
    assert agree["control"] == "0.33 ± 0.15"  # mean and std (ddof=1) of 0.2, 0.49, 0.3
    assert agree["control_verdict"] == "control passes too in 1/3 seeds"
    assert beat["verdict"] == "holds" and beat["control"] == "0.5"
    assert beat["control_verdict"] == "control fails (every seed)"
    md = report.markdown([agree, beat])
    assert "0.5 (control fails (every seed))" in md
    assert "**not evidence** (holds, but its negative control passes too)" in md
    assert report.paper_count([agree, beat])["reproduced"] == 1


def test_post_hoc_is_marked():
    rows = report.summarise([result(s, [
        claim("bar", "reaches the bar", "return", 480.0, 450.0, ">=", kind="paper", post_hoc=True),
        claim("other", "beats", "acc", 0.9, 0.5, ">", kind="paper")]) for s in (0, 1)])
    assert [r["post_hoc"] for r in rows] == [True, False]
    # flagged in every seed: no seed left to judge it, so it never counts as reproduced
    assert rows[0]["verdict"] == report.NO_UNSEEN and rows[1]["verdict"] == "holds"
    assert report.paper_count(rows)["reproduced"] == 1
    lines = report.markdown(rows).splitlines()
    note = "post hoc: judged on seeds looked at while choosing it"
    assert note in next(x for x in lines if "reaches the bar" in x)
    assert note not in next(x for x in lines if "| beats" in x)
    assert note in report.render_html(rows, [], [])


def test_post_hoc_from_looked_at_seeds(tmp_path, monkeypatch):
    """A claim judged on a seed looked at while choosing something it depends on is post hoc,
    whatever the notebook remembers; its verdict comes from the other seeds only."""
    from agentrl_lib.pipeline.results import looked_at

    runs = tmp_path / "runs"
    seen = [looked_at([0], "the margin", claims=["up"]),
            looked_at([0, 1], "adv_mode", claims=["mode"])]
    for s in (0, 1, 2):
        d = runs / "cpu" / "05_mixed" / f"seed{s}"
        d.mkdir(parents=True)
        monkeypatch.setenv("AGENTRL_RUN_DIR", str(d))
        # 'up' fails on the looked-at seed 0 only; 'mode' fails on seed 2, never looked at
        cs = [claim("up", "s", "acc", 0.4 if s == 0 else 0.9, 0.5, ">", kind="paper"),
              claim("mode", "s", "acc", 0.4 if s == 2 else 0.9, 0.5, ">", kind="paper")]
        write_results("05_mixed", {"seed": s, "profile": "cpu"}, {}, cs, looked_at=seen)
        assert [c.post_hoc for c in cs] == [s == 0, s in (0, 1)]
    saved = json.loads((runs / "cpu/05_mixed/seed0/results.json").read_text())
    assert saved["looked_at"][0] == {"seeds": [0], "what": "the margin", "claims": ["up"]}
    assert saved["claims"][0]["looked_at"] == "seeds 0 looked at while choosing the margin"
    assert saved["claims"][1]["looked_at"] == "seeds 0, 1 looked at while choosing adv_mode"
    up, mode = report.summarise(report.collect(runs))
    assert (up["verdict"], up["post_hoc"]) == ("holds", True)  # seeds 1, 2 only
    assert "verdict from the seeds never looked at" in up["why"]
    # seed 2 alone judges it: it failed there, but one seed without a power plan decides nothing
    assert mode["verdict"] == "no power" and "one seed" in mode["why"]
    assert "verdict from the seeds never looked at" in mode["why"]
    with pytest.raises(ValueError, match="do not exist"):
        write_results("05_mixed", {"seed": 0, "profile": "cpu"}, {}, [],
                      looked_at=[looked_at([0], "x", claims=["nope"])])


def test_counts_exclude_extensions_and_second_papers():
    rows = report.summarise([result(s, [
        claim("own", "beats", "acc", 0.9, 0.5, ">", kind="paper"),
        claim("aepo", "AEPO beats ARPO", "acc", 0.9, 0.5, ">", kind="paper", paper_id="aepo"),
        claim("ours", "our ablation", "acc", 0.9, 0.5, ">", kind="extension"),
        claim("ours2", "another", "acc", 0.1, 0.5, ">", kind="extension")]) for s in (0, 1)])
    c = report.paper_count(rows)
    assert (c["reproduced"], c["paper"]) == (1, 1)
    assert c["second_papers"] == {"aepo": {"reproduced": 1, "of": 1, "not_evidence": 0,
                                           "no_power": 0}}
    assert c["extension"] == {"reproduced": 1, "of": 2, "not_evidence": 0, "no_power": 0}
    assert c["other"] == {}
    assert report.count_line(rows) == (
        "Paper claims reproduced: 1 of 1; claims of aepo (another paper) reproduced: 1 of 1; "
        "extensions (our own findings, not the paper's): 1 of 2 hold.")
    assert "| paper of aepo |" in report.markdown(rows)
    # an extension whose positive control never moved is counted apart, as the paper's are
    flat = positive_control(0.3, 0.31, 256)
    rows = report.summarise([result(s, [
        claim("ours3", "an LM finding", "acc", 0.9, 0.5, ">", kind="extension",
              power=power_plan(4096, 3), positive_control=flat)]) for s in (0, 1, 2)])
    assert report.count_line(rows) == (
        "No paper claims; extensions (our own findings, not the paper's): 0 of 1 hold, "
        "1 without power.")


def test_registry_refuses_bad_claims():
    """One-line errors naming the problem: a bad kind, a tolerance agreement written '<=' (any
    kind, control or not), a counted '~' agreement without control, paper_id on another kind."""
    with pytest.raises(ValueError, match=r"^claim 'c': unknown claim kind 'papers'"):
        claim("c", "s", "m", 1, 0, kind="papers")
    for d in ("<", "<="):
        with pytest.raises(ValueError, match=r"^claim 'scratch_equals_library': an agreement "):
            claim("scratch_equals_library", "s", "max |diff|", 0.0, 1e-9, d, kind="sanity",
                  control=1.0)
    with pytest.raises(ValueError, match="needs control="):
        claim("lm_matches", "s", "acc", 0.5, 0.5, "~", margin=0.05, kind="extension")
    with pytest.raises(ValueError, match="paper_id='aepo'") as err:
        claim("c", "s", "m", 1, 0, kind="extension", paper_id="aepo")
    assert "\n" not in str(err.value)
    # allowed: exact equality; a sanity '~' (the report says 'not evidence'); a bar '<='
    claim("same_start", "s", "acc", 0.5, 0.5, "~", kind="sanity")
    claim("lib_agrees", "s", "d", 0.0, 0.0, "~", margin=1e-9, kind="theorem")
    claim("vi_contracts", "s", "ratio", 0.85, 0.9, "<=", kind="theorem")


def test_relabel_takes_kinds_from_the_notebook(tmp_path, monkeypatch):
    """relabel changes only kind and paper_id, from the notebook's claim() calls; every number
    and verdict stays; RESULTS.md is rebuilt from the tables with the new counts."""
    runs, repro, nbs = tmp_path / "runs", tmp_path / "reproductions", tmp_path / "notebooks"
    for s in (0, 1):
        d = runs / "cpu" / "05_mixed" / f"seed{s}"
        d.mkdir(parents=True)
        monkeypatch.setenv("AGENTRL_RUN_DIR", str(d))
        write_results("05_mixed", {"seed": s, "profile": "cpu"}, {}, [
            claim("own", "beats", "acc", 0.9, 0.5, ">", kind="paper"),
            claim("ablation", "ours", "acc", 0.9, 0.5, ">", kind="paper"),
            claim("aepo_arm", "AEPO", "acc", 0.9, 0.5, ">", kind="paper")])
    report.publish(runs, repro, "cpu")
    before = (repro / "05_mixed/cpu_summary.csv").read_text()
    nbs.mkdir()
    src = ('%matplotlib inline\nclaims = [claim("own", "beats", "acc", a, b, ">", kind="paper"),\n'
           '  claim("ablation", "ours", "acc", a, b, ">", kind="extension"),\n'
           '  claim("aepo_arm", "AEPO", "acc", a, b, ">", kind="paper", paper_id="aepo"),\n'
           '  claim(f"x{i}", "built", "acc", a, b, kind="design")]')
    cell = {"cell_type": "code", "source": [src], "metadata": {}, "outputs": []}
    (nbs / "05_mixed.ipynb").write_text(json.dumps({"cells": [cell]}))
    assert report.claim_kinds(nbs / "05_mixed.ipynb") == {
        "own": ("paper", ""), "ablation": ("extension", ""), "aepo_arm": ("paper", "aepo"),
        "x*": ("design", "")}  # an id built from a literal prefix matches by the prefix
    assert report.relabel(repro, nbs, "cpu") == ["05_mixed ablation: paper -> extension",
                                                 "05_mixed aepo_arm: paper -> paper of aepo"]
    with (repro / "05_mixed/cpu_summary.csv").open() as f:
        after = list(csv.DictReader(f))
    with io.StringIO(before) as f:
        old = list(csv.DictReader(f))
    for a, b in zip(after, old):
        assert {k: v for k, v in a.items() if k not in ("kind", "paper_id")} == \
            {k: v for k, v in b.items() if k not in ("kind", "paper_id")}
    assert report.relabel(repro, nbs, "cpu") == []  # nothing left to change
    md = report.rebuild_results_md(repro, "cpu").read_text()
    assert ("Paper claims reproduced: 1 of 1; claims of aepo (another paper) reproduced: 1 of 1; "
            "extensions (our own findings, not the paper's): 1 of 1 hold.") in md


def test_old_results_without_kind_stay_readable():
    """results.json written before kinds: no kind, post_hoc or control fields."""
    old = [{"notebook": "01_old", "profile": "cpu", "seed": s, "paper": {}, "claims": [
        {"id": "c", "statement": "s", "metric": "m", "ours": 2.0, "baseline": 1.0,
         "direction": ">", "margin": 0.0, "paper_value": None, "holds": True},
        {"id": "a", "statement": "agrees", "metric": "m", "ours": 1.0, "baseline": 1.0,
         "direction": "~", "margin": 0.1, "paper_value": None, "holds": True}]} for s in (0, 1)]
    c, a = report.summarise(old)
    assert c["kind"] == a["kind"] == "unknown" and not c["post_hoc"]
    assert c["verdict"] == "holds" and c["control"] == "—"
    assert c["control_verdict"] == "no control"
    assert a["verdict"] == "not evidence"  # an agreement without a control, whatever its kind
    assert report.count_line([c, a]) == ("No paper claims; 2 of unknown kind (results written "
                                         "before claims had kinds), not counted.")


def test_collapse_flag_and_peak():
    up = learning_curve([0.5, 0.7, 0.9], steps=[0, 10, 20])
    (s,) = curve_summary(up)
    assert s == {"start": 0.5, "peak": 0.9, "peak_step": 20.0, "final": 0.9, "collapsed": False}
    # ends 0.06 below its start: more than COLLAPSE_MARGIN = 0.05 of a [0, 1] range
    (s,) = curve_summary(learning_curve([0.5, 0.9, 0.44], steps=[0, 10, 20]))
    assert s["collapsed"] and s["peak"] == 0.9 and s["peak_step"] == 10.0 and s["final"] == 0.44
    # a drop from the peak (0.9 -> 0.46) is not a collapse while final stays near the start
    (s,) = curve_summary(learning_curve([0.5, 0.9, 0.46], steps=[0, 10, 20]))
    assert not s["collapsed"] and s["peak"] == 0.9
    # the margin scales with the metric's range: CartPole returns in [0, 500]
    assert COLLAPSE_MARGIN * 500 == 25.0
    cartpole = [learning_curve([100.0, 480.0, end], [0, 1, 2], scale=500) for end in (80.0, 70.0)]
    assert [curve_summary(c)[0]["collapsed"] for c in cartpole] == [False, True]
    # a loss: lower is better, the peak is the minimum, a collapse is a rise
    loss = learning_curve([[4.6, 1.0, 1.3], [4.6, 1.0, 4.9]], [0, 1, 2], scale=4.6,
                          higher_is_better=False)
    a, b = curve_summary(loss)
    assert (a["peak"], a["collapsed"]) == (1.0, False) and b["collapsed"]  # 4.9 > 4.6 + 0.23
    with pytest.raises(ValueError, match="one value per step"):
        learning_curve([0.1, 0.2], steps=[0, 1, 2])


def test_report_summarises_curves_over_seeds(tmp_path):
    res = [result(0, [], {"curve/acc": learning_curve([0.5, 0.9, 0.4], [0, 5, 10]),
                          "curve/loss": learning_curve([3.0, 2.0, 1.0], [0, 5, 10], scale=4.6,
                                                       higher_is_better=False),
                          "curve/steps": [0, 5, 10]}),  # a plain list: an x-axis, not a curve
           result(1, [], {"curve/acc": learning_curve([0.5, 0.7, 0.7], [0, 5, 10]),
                          "curve/loss": learning_curve([3.0, 2.5, 2.0], [0, 5, 10], scale=4.6,
                                                       higher_is_better=False)})]
    acc, loss = report.summarise_curves(res)
    assert (acc["curve"], acc["runs"], acc["seeds"]) == ("acc", 2, [0, 1])
    assert (acc["start"], acc["peak"], acc["final"]) == ("0.5", "0.8 ± 0.14", "0.55 ± 0.21")
    assert acc["peak_differs"] and acc["collapsed"] == 1
    assert acc["collapsed_cell"] == "collapsed 1/2"
    assert not loss["peak_differs"] and loss["collapsed"] == 0  # monotone: peak is the final value
    md = report.curves_markdown([acc, loss])
    assert ("| 05_mixed | cpu | acc | 2 | 0.5 | 0.8 ± 0.14 | 0.55 ± 0.21 | **collapsed 1/2** |"
            in md)
    assert "| 05_mixed | cpu | loss | 2 | 3 | = final | 1.5 ± 0.71 | no (0/2) |" in md


def test_publish_columns_and_curves_csv(tmp_path, monkeypatch):
    """write_results -> publish: the CSV carries kind, control and post hoc; curves get their own
    CSV; metrics.jsonl keeps every point of a learning curve with its step."""
    runs = tmp_path / "runs"
    for s in (0, 1):
        monkeypatch.setenv("AGENTRL_RUN_DIR", str(runs / "cpu" / "05_mixed" / f"seed{s}"))
        (runs / "cpu" / "05_mixed" / f"seed{s}").mkdir(parents=True)
        metrics = {"curve/acc": learning_curve([0.3, 0.6 + 0.1 * s], [0, 8])}
        claims = [claim("agree", "agrees", "acc", 0.6, 0.6, "~", margin=0.05, kind="paper",
                        control=0.3),
                  claim("bar", "reaches the bar", "acc", 0.6, 0.5, ">=", kind="paper",
                        post_hoc=True)]
        write_results("05_mixed", {"seed": s, "profile": "cpu"}, metrics, claims)
    jsonl = (runs / "cpu/05_mixed/seed1/metrics.jsonl").read_text()
    rows = [json.loads(x) for x in jsonl.splitlines()]
    assert rows[:2] == [{"series": "curve/acc", "index": 0, "step": 0.0, "value": 0.3},
                        {"series": "curve/acc", "index": 1, "step": 8.0, "value": 0.7}]
    report.publish(runs, tmp_path / "reproductions", "cpu")
    with (tmp_path / "reproductions/05_mixed/cpu_summary.csv").open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == report.CSV_COLUMNS
    assert [(t["claim"], t["kind"], t["verdict"], t["post_hoc"]) for t in table] == [
        ("agree", "paper", "holds", "False"), ("bar", "paper", report.NO_UNSEEN, "True")]
    assert table[0]["negative_control"] == "0.3"
    assert table[0]["control_verdict"] == "control fails (every seed)"
    with (tmp_path / "reproductions/05_mixed/cpu_curves.csv").open() as f:
        (curve,) = list(csv.DictReader(f))
    assert (curve["curve"], curve["runs"], curve["start"], curve["peak"], curve["final"],
            curve["collapsed_runs"]) == ("acc", "2", "0.3", "= final", "0.65 ± 0.071", "0")
    md = (tmp_path / "reproductions/RESULTS.md").read_text()
    assert "Paper claims reproduced: 1 of 2." in md and "post hoc" in md


def test_which_claims_need_a_control():
    from agentrl_lib.pipeline.report import needs_control

    def c(direction, margin, kind="paper"):
        return {"direction": direction, "margin": margin, "kind": kind}

    assert needs_control(c("~", 0.05)) and needs_control(c("~", 0.05, "sanity"))  # a tolerance
    assert not needs_control(c("~", 0.0, "sanity"))  # exact equality fails at any difference
    assert needs_control(c(">", -0.05)) and needs_control(c("<", -0.05))  # non-inferiority
    assert not needs_control(c(">", -0.05, "sanity"))  # only paper claims are judged so
    assert not needs_control(c(">", 0.0)) and not needs_control(c(">=", 0.0))


def test_publish_one_notebook_keeps_the_others_rows(tmp_path, monkeypatch):
    """RESULTS.md is rebuilt from every notebook's committed tables: the rows read back from the
    CSVs render exactly as the rows summarised from runs, and publishing the runs of one notebook
    keeps the rows (and curves) of another published earlier."""
    runs_a, runs_b = tmp_path / "runs_a", tmp_path / "runs_b"
    for runs, nb in ((runs_a, "05_mixed"), (runs_b, "06_other")):
        for s in (0, 1):
            d = runs / "cpu" / nb / f"seed{s}"
            d.mkdir(parents=True)
            monkeypatch.setenv("AGENTRL_RUN_DIR", str(d))
            metrics = {"curve/acc": learning_curve([0.3, 0.6 + 0.1 * s], [0, 8])}
            write_results(nb, {"seed": s, "profile": "cpu"}, metrics, mixed_claims(s))
    repro = tmp_path / "reproductions"
    report.publish(runs_a, repro, "cpu")
    report.publish(runs_b, repro, "cpu")  # only 06's runs: 05's rows come from its tables
    results = [r for r in report.collect(runs_a) + report.collect(runs_b)]
    rows, curves = report.summarise(results), report.summarise_curves(results)
    back_rows, back_curves = report.rows_from_tables(repro, "cpu")
    assert [r["notebook"] for r in back_rows] == [r["notebook"] for r in rows]
    assert report.markdown(back_rows, back_curves) == report.markdown(rows, curves)
    md = (repro / "RESULTS.md").read_text()
    assert md.count("| 05_mixed | cpu |") == md.count("| 06_other | cpu |") > 0
    assert report.markdown(rows, curves) in md


def test_old_tables_post_hoc_rows_need_unseen_seeds(tmp_path):
    """A post-hoc row of a table published before the looked_at column judged every seed, the
    looked-at ones too: read back, it is 'post hoc: no unseen seeds' and is not counted."""
    table = tmp_path / "05_mixed" / "cpu_summary.csv"
    table.parent.mkdir()
    old_columns = report.CSV_COLUMNS[:-3]  # no paper_id, no looked_at, no power_plan
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, old_columns, restval="")
        w.writeheader()
        for cid, post in (("bar", "True"), ("beats", "False")):
            w.writerow({"claim": cid, "kind": "paper", "margin": "0", "seeds": "0 1 2",
                        "verdict": "holds", "post_hoc": post, "asserted": "True"})
    bar, beats = report.rows_from_tables(tmp_path, "cpu")[0]
    assert bar["verdict"] == report.NO_UNSEEN and "holds" in bar["why"]
    assert beats["verdict"] == "holds"
    assert report.paper_count([bar, beats])["reproduced"] == 1


def test_notebook_claims_name_known_kinds_and_papers():
    """Every claim() call of the notebooks names a kind of the registry, and a second paper by
    its id in the catalog (../shared/papers/catalog.csv, when this checkout has it)."""
    from pathlib import Path

    from agentrl_lib.pipeline.results import KINDS

    root = Path(__file__).resolve().parents[1]
    kinds = {(nb.stem, cid): k for nb in sorted((root / "notebooks").glob("*.ipynb"))
             for cid, k in report.claim_kinds(nb).items()}
    assert len(kinds) > 300 and {k for k, _ in kinds.values()} <= set(KINDS)
    assert kinds["56_aepo", "aepo_vs_arpo"] == ("paper", "")  # its own notebook since the split
    catalog = root.parent / "shared" / "papers" / "catalog.csv"
    if catalog.is_file():
        with catalog.open(newline="") as f:
            ids = {row["id"] for row in csv.DictReader(f)}
        assert {p for _, p in kinds.values() if p} <= ids


def test_no_notebook_hard_codes_post_hoc():
    """A notebook marks a claim post hoc by recording the seeds it looked at (``looked_at``), so
    the registry can judge the claim on the others; ``claim(..., post_hoc=True)`` would mark it
    post hoc on every seed, and no run could ever judge it (28's rm_collapses read 'no unseen
    seeds' at seeds 3-5 that way)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    calls = [(nb.stem, kw) for nb in sorted((root / "notebooks").glob("*.ipynb"))
             for _, kw in report._claim_calls(nb)]
    assert len(calls) > 300
    assert [nb for nb, kw in calls if "post_hoc" in kw] == []


def test_a_decided_interval_is_evidence_whatever_the_plan():
    """A claim whose plan cannot detect its margin still gets its verdict when the seeds' interval
    (never narrower than the plan's panel noise) lies wholly beyond or short of the bar; a claim
    whose positive control did not move stays 'no power' whatever its numbers."""
    plan = power_plan(1024, 3, p=0.5)  # mdd 0.068 > the 0.05 margin below
    learned, flat = positive_control(0.3, 0.45, 1024), positive_control(0.3, 0.31, 1024)
    outcomes = [(0.19, 0.44), (0.15, 0.43), (0.15, 0.44)]  # 0.25 below: far beyond the noise

    def seed_claims(s):
        o, b = outcomes[s]
        close = (0.42 + 0.02 * (s - 1) ** 2, 0.44)  # straddles the bar
        kw = dict(margin=-0.05, kind="paper", power=plan)
        return [claim("decided", "non-inferior", "acc", o, b, ">", positive_control=learned, **kw),
                claim("close", "non-inferior", "acc", *close, ">", positive_control=learned, **kw),
                claim("flat", "non-inferior", "acc", o, b, ">", positive_control=flat, **kw)]
    rows = report.summarise([result(s, seed_claims(s)) for s in (0, 1, 2)])
    got = {r["claim"]: r["verdict"] for r in rows}
    assert got == {"decided": "does not hold", "close": "no power", "flat": "no power"}, got


def test_a_stale_table_is_marked_left_out_of_the_controls_count_and_dropped_on_republish(tmp_path):
    """reproductions/stale.csv names tables run before their notebook's method changed: RESULTS.md
    marks them, keeps them out of the controls count, and publishing the notebook again drops
    the row (the file goes with its last row); a file without the columns is an error."""
    learned = positive_control(0.3, 0.6, 256)
    rows = report.summarise([result(s, [claim("b", "beats", "acc", 0.6, 0.5, ">", margin=0.05,
                                              kind="paper", positive_control=learned)])
                             for s in (0, 1, 2)])
    assert "in 1 of the 1 notebooks" in report.scoreboard_markdown(rows)
    (tmp_path / "stale.csv").write_text("notebook,profile,reason\n"
                                        "05_mixed,cpu,the paper's arm replaced ours\n"
                                        "05_mixed,gpu,the same\n")
    stale = report.read_stale(tmp_path)
    md = report.scoreboard_markdown(rows, stale=stale)
    assert "| 05_mixed † | foundations |" in md
    assert "- 05_mixed (cpu): the paper's arm replaced ours" in md
    assert "in 0 of the 0 notebooks" in md  # its control is of the old method: not counted
    report.drop_stale(tmp_path, {"05_mixed"}, "cpu")
    assert report.read_stale(tmp_path) == {("05_mixed", "gpu"): "the same"}
    report.drop_stale(tmp_path, {"05_mixed"}, "gpu")
    assert not (tmp_path / "stale.csv").exists() and report.read_stale(tmp_path) == {}
    (tmp_path / "stale.csv").write_text("nb,why\nx,y\n")
    with pytest.raises(ValueError, match="columns must be notebook, profile, reason"):
        report.read_stale(tmp_path)


def test_a_claim_out_of_the_metrics_reach_has_no_power(tmp_path, monkeypatch):
    """A '<' claim whose baseline sits within its margin of the metric's floor (or a '>' one
    within its margin of the ceiling) could not have held: with ``power={"bound": ...}`` it reads
    'no power' even though the seeds' interval decides the failure, in a fresh summary and, once
    the notebook declares the bound, in a committed table (``relabel``); a baseline with room to
    spare keeps its verdict."""
    def seed_claims(s):
        return [claim("floor", "fewer dead groups", "share", 0.0, 0.013 + 0.001 * s, "<",
                      margin=0.05, kind="paper", power={"bound": 0.0}),
                claim("ceiling", "higher success", "acc", 0.97, 0.96 + 0.001 * s, ">",
                      margin=0.05, kind="paper", power={"bound": 1.0}),
                claim("room", "fewer dead groups", "share", 0.55, 0.58 + 0.001 * s, "<",
                      margin=0.05, kind="paper", power={"bound": 0.0})]
    rows = {r["claim"]: r for r in report.summarise([result(s, seed_claims(s)) for s in (0, 1, 2)])}
    assert rows["floor"]["verdict"] == rows["ceiling"]["verdict"] == "no power"
    assert "above the metric's floor 0: the claim could not have held" in rows["floor"]["why"]
    assert "below the metric's ceiling 1" in rows["ceiling"]["why"]
    assert rows["room"]["verdict"] == "does not hold"
    # the same claims published before the notebook declared the bound, then relabelled
    runs, repro, nbs = tmp_path / "runs", tmp_path / "reproductions", tmp_path / "notebooks"
    for s in (0, 1, 2):
        d = runs / "cpu" / "05_mixed" / f"seed{s}"
        d.mkdir(parents=True)
        monkeypatch.setenv("AGENTRL_RUN_DIR", str(d))
        write_results("05_mixed", {"seed": s, "profile": "cpu"}, {},
                      [replace(c, power=None) for c in seed_claims(s)])
    report.publish(runs, repro, "cpu")
    nbs.mkdir()
    src = ('claims = [claim("floor", "f", "share", a, b, "<", margin=m, kind="paper",\n'
           '                power={"bound": 0.0}),\n'
           '          claim("room", "r", "share", a, b, "<", margin=m, kind="paper",\n'
           '                power={"bound": 0.0})]')
    cell = {"cell_type": "code", "source": [src], "metadata": {}, "outputs": []}
    (nbs / "05_mixed.ipynb").write_text(json.dumps({"cells": [cell]}))
    assert report.claim_bounds(nbs / "05_mixed.ipynb") == {"floor": 0.0, "room": 0.0}
    assert report.relabel(repro, nbs, "cpu") == ["05_mixed floor: does not hold -> no power"]
    with (repro / "05_mixed/cpu_summary.csv").open() as f:
        got = {r["claim"]: r for r in csv.DictReader(f)}
    assert "the table read does not hold" in got["floor"]["verdict_why"]
    assert got["floor"]["power_plan"] == "metric bound 0"
    assert got["room"]["verdict"] == "does not hold"
    assert report.relabel(repro, nbs, "cpu") == []
    assert report.rows_from_tables(repro, "cpu")[0][0]["verdict"] == "no power"


def test_table_drift_names_claims_whose_direction_or_margin_changed_after_the_run(tmp_path):
    """A committed table judges the claims as they were when it ran: a notebook that rewrites a
    claim's direction or margin afterwards (01 and 70 went from '<=' a tolerance to '~' with one),
    or gives an agreement a negative control the table never measured, makes the table stale; table_drift names each such claim unless stale.csv lists the
    notebook, and leaves alone claims the table lacks and ids built at run time."""
    repro, nbs = tmp_path / "reproductions", tmp_path / "notebooks"
    (repro / "05_mixed").mkdir(parents=True)
    nbs.mkdir()
    (repro / "05_mixed" / "cpu_summary.csv").write_text(
        "claim,direction,margin,negative_control\nequal,<=,0.0,—\nbeats,>,0.05,—\nplain,>,,—\n"
        "kept,<,0.1,—\nagree,~,0.01,—\nagreed,~,0.01,0.5 ± 0.1\n")
    src = ('claims = [claim("equal", "s", "m", a, 0.0, "~", margin=1e-8, kind="theorem"),\n'
           '  claim("beats", "s", "m", a, b, ">", 0.03, kind="paper"),\n'
           '  claim("plain", "s", "m", a, b, kind="paper"),\n'
           '  claim("kept", "s", "m", a, b, direction="<", margin=0.1, kind="paper"),\n'
           '  claim("new_one", "s", "m", a, b, "<", kind="paper"),\n'
           '  claim("agree", "s", "m", a, b, "~", margin=0.01, kind="sanity", control=c),\n'
           '  claim("agreed", "s", "m", a, b, "~", margin=0.01, kind="sanity", control=c),\n'
           '  claim(f"x{i}", "s", "m", a, b, "<", kind="design")]')
    cell = {"cell_type": "code", "source": [src], "metadata": {}, "outputs": []}
    (nbs / "05_mixed.ipynb").write_text(json.dumps({"cells": [cell]}))
    assert report.claim_forms(nbs / "05_mixed.ipynb") == {
        "equal": ("~", 1e-8), "beats": (">", 0.03), "plain": (">", 0.0), "kept": ("<", 0.1),
        "new_one": ("<", 0.0), "agree": ("~", 0.01), "agreed": ("~", 0.01)}
    assert report.claim_controlled(nbs / "05_mixed.ipynb") == {"agree", "agreed"}
    assert report.table_drift(repro, nbs, "cpu") == [
        "05_mixed equal: the table has <= 0, the notebook ~ 1e-08",
        "05_mixed beats: the table has > 0.05, the notebook > 0.03",
        "05_mixed agree: the notebook gives it a negative control, the table has none"]
    assert report.table_drift(repro, nbs, "gpu") == []  # no gpu table
    (repro / "stale.csv").write_text("notebook,profile,reason\n05_mixed,cpu,rewritten\n")
    assert report.table_drift(repro, nbs, "cpu") == []


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_committed_tables_state_the_claims_their_notebooks_make(profile):
    """Every committed table not listed in stale.csv has each claim's direction and margin as
    its notebook states them now: a change to a claim means running the notebook again, or
    marking its table stale, before it lands."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    drift = report.table_drift(root / "reproductions", root / "notebooks", profile)
    assert drift == [], "\n".join(drift)
