"""Verdict statistics: IQM, bootstrap intervals, confident orderings, and the report's columns."""

import math

import numpy as np
import pytest

from agentrl_lib.pipeline.report import markdown, summarise
from agentrl_lib.pipeline.stats import bootstrap_ci, iqm, ordering_verdict


def test_iqm_by_hand():
    assert iqm([1, 2, 3, 4]) == 2.5  # drops 1 and 4
    assert iqm([10, 0, 1, 2, 3, 4, 5, -10]) == pytest.approx(2.5)  # drops two each side
    assert iqm([7.0]) == 7.0 and math.isnan(iqm([]))


def test_bootstrap_ci():
    assert bootstrap_ci([3.0]) == (3.0, 3.0)
    lo, hi = bootstrap_ci([1.0, 1.0, 1.0])
    assert lo == hi == 1.0
    x = np.random.default_rng(0).normal(5.0, 1.0, size=200)
    lo, hi = bootstrap_ci(x, stat=np.mean)
    # the normal-theory 95% interval of the mean: +-1.96 sd/sqrt(n)
    half = 1.96 * x.std(ddof=1) / np.sqrt(len(x))
    assert abs(lo - (x.mean() - half)) < 0.05 and abs(hi - (x.mean() + half)) < 0.05
    assert bootstrap_ci(x, seed=1) == bootstrap_ci(x, seed=1)  # seeded


def test_ordering_verdict_each_direction():
    ours, base = [1.0, 1.2, 1.1], [0.0, 0.1, 0.05]
    assert ordering_verdict(ours, base, ">", margin=0.5)["confident"]
    assert not ordering_verdict(ours, base, ">", margin=1.2)["confident"]
    assert ordering_verdict(base, ours, "<", margin=0.5)["confident"]
    assert ordering_verdict(ours, base, ">=")["confident"]
    assert not ordering_verdict(ours, base, "<=")["confident"]
    assert ordering_verdict([1.0, 1.01, 0.99], [1.0, 1.0, 1.0], "~", margin=0.05)["confident"]
    assert not ordering_verdict(ours, base, "~", margin=0.05)["confident"]
    # mixed signs across seeds: no confident ordering either way
    mixed = ordering_verdict([1.0, -1.0, 0.5], [0.0, 0.0, 0.0], ">")
    assert not mixed["confident"] and mixed["diff_ci"][0] < 0 < mixed["diff_ci"][1]
    assert ordering_verdict(ours, None, ">")["confident"] is None
    with pytest.raises(ValueError, match="one value per seed"):
        ordering_verdict([1.0, 2.0], [1.0], ">")


def test_report_rows_carry_confidence_family_and_source():
    res = [{"notebook": "31_x", "profile": "cpu", "seed": s, "paper": {"title": "P"},
            "claims": [{"id": "c", "statement": "s", "metric": "m", "ours": o, "baseline": b,
                        "direction": ">", "margin": 0.0, "paper_value": "+12%",
                        "source": "abstract", "holds": o > b}]}
           for s, o, b in [(0, 0.9, 0.5), (1, 0.8, 0.6), (2, 0.7, 0.2)]]
    (row,) = summarise(res)
    assert row["family"] == "multiturn-credit" and row["point"] == ""
    assert row["confident"] == "yes (n=3)" and row["iqm"].startswith("0.8; diff +0.367")
    md = markdown([row])
    assert "### Family: multiturn-credit" in md and "+12% (abstract)" in md
