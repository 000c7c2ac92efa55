"""Your runs against the reference (``pipeline.reference``): the agreement rule equals Welch's
t-test, and a partial report shows every notebook: yours beside the committed table where you
ran it, the committed table otherwise, marked."""

import html
import json

import numpy as np
import pytest

from agentrl_lib.pipeline import reference, report
from agentrl_lib.pipeline.results import claim, write_results


def test_agreement_is_welchs_test_at_5_percent():
    """With unrounded reference numbers, 'agrees' is exactly Welch's two-sided p >= 0.05."""
    from scipy.stats import ttest_ind

    rng = np.random.default_rng(0)
    verdicts = set()
    for _ in range(300):
        n, n_r = rng.integers(2, 6, size=2)
        mine = rng.normal(0.5, 0.05, n)
        ref = rng.normal(0.5 + rng.choice([0.0, 0.05, 0.2]), rng.uniform(0.01, 0.1), n_r)
        got = reference.agreement(list(mine), float(ref.mean()), float(ref.std(ddof=1)), int(n_r))
        p = ttest_ind(mine, ref, equal_var=False).pvalue
        if abs(p - 0.05) > 1e-9:
            assert (got["verdict"] == "agrees") == (p >= 0.05), (mine, ref, p, got)
        verdicts.add(got["verdict"])
    assert verdicts == {"agrees", "differs"}


def test_one_seed_borrows_the_other_sides_noise():
    # one run of yours against 3 reference seeds: the interval uses the reference's std on both
    # sides, df = 2: half = t(0.975, 2) * 0.02 * sqrt(1 + 1/3) = 4.303 * 0.02309 = 0.0994
    a = reference.agreement([0.38], 0.29, 0.02, 3)  # off by 0.09
    assert a["half"] == pytest.approx(4.3027 * 0.02 * np.sqrt(4 / 3), rel=1e-4)
    assert a["verdict"] == "agrees"
    assert reference.agreement([0.39], 0.29, 0.02, 3)["verdict"] == "differs"  # off by 0.1
    assert reference.agreement([0.40], 0.29, 0.0, 1)["verdict"] == "—"


def _runs(root, nb, claims_of_seed, seeds=(0, 1, 2), monkeypatch=None):
    for s in seeds:
        d = root / "cpu" / nb / f"seed{s}"
        d.mkdir(parents=True)
        monkeypatch.setenv("AGENTRL_RUN_DIR", str(d))
        write_results(nb, {"seed": s, "profile": "cpu"}, {}, claims_of_seed(s))


def _claims(shift_a=0.0, shift_b=0.0):
    return lambda s: [
        claim("acc", "ours beats the baseline", "acc", 0.50 + 0.02 * s + shift_a, 0.30, ">",
              margin=0.1, kind="paper"),
        claim("len", "ours is shorter", "turns", 4.0 + 0.5 * s + shift_b, 6.0, "<", kind="paper")]


def test_partial_report_shows_yours_beside_the_reference_and_the_rest_marked(tmp_path,
                                                                             monkeypatch):
    ref_runs, repro = tmp_path / "ref_runs", tmp_path / "reproductions"
    _runs(ref_runs, "05_mixed", _claims(), monkeypatch=monkeypatch)
    _runs(ref_runs, "06_other", _claims(), monkeypatch=monkeypatch)
    report.publish(ref_runs, repro, "cpu")
    mine = tmp_path / "runs"
    # 05 again on "another machine": acc within noise (+0.005), len far off (+3 turns)
    _runs(mine, "05_mixed", _claims(shift_a=0.005, shift_b=3.0), monkeypatch=monkeypatch)
    _runs(mine, "07_new", _claims(), seeds=(0,), monkeypatch=monkeypatch)  # no committed table
    info = report.build_report(mine, tmp_path / "report", notebooks=False, repro_root=repro)
    rows = {(r["notebook"], r["claim"]): r for r in
            json.loads((tmp_path / "report" / "summary.json").read_text())}
    assert rows[("05_mixed", "acc")]["agreement"] == "agrees"
    assert rows[("05_mixed", "len")]["agreement"] == "differs"
    assert "ours: diff +3" in rows[("05_mixed", "len")]["agreement_why"]
    assert rows[("07_new", "acc")]["agreement"] == "no reference"
    other = rows[("06_other", "acc")]
    assert other["origin"] == "reference" and other["verdict"] == "holds"
    assert rows[("05_mixed", "acc")]["origin"] == "yours"
    page = info["html"].read_text()
    marked = html.escape(report.REFERENCE_ONLY)
    assert page.count("<h2 id='06_other'>") == 1
    assert page.count(marked) == 1  # only the notebook not run here
    assert "reference (committed): agrees?" in page
    assert "0.52 ± 0.02 (seeds 0,1,2; holds): agrees" in page
    md = info["markdown"].read_text()
    assert "## Your runs against the reference" in md
    assert "| 06_other | cpu | acc | — (not run here) | 0.52 ± 0.02 | reference only" in md
    # without reproductions/ the report is as before: no reference column, no 06
    plain = report.build_report(mine, tmp_path / "r2", notebooks=False)
    assert plain["rows"] == 4 and "06_other" not in plain["html"].read_text()
