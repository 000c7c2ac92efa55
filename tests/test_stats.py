"""Verdict statistics: IQM, bootstrap intervals, confident orderings, and the report's columns."""

import math

import numpy as np
import pytest

from agentrl_lib.pipeline.report import markdown, summarise
from agentrl_lib.pipeline.stats import bootstrap_ci, iqm, ordering_verdict, t_interval


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


def _coverage(interval, n: int, draws: int = 4000, seed: int = 0) -> float:
    """How often ``interval`` of n normal draws (mean 0.3, sd 0.1: a success rate over seeds)
    contains the true mean, over ``draws`` simulated panels of seeds."""
    x = np.random.default_rng(seed).normal(0.3, 0.1, size=(draws, n))  # (D, n)
    hits = 0
    for row in x:
        lo, hi = interval(row)
        hits += lo <= 0.3 <= hi
    return hits / draws


@pytest.mark.parametrize("n", [3, 5, 10])
def test_t_interval_covers_95_percent_at_our_seed_counts(n):
    """The verdicts' interval has its nominal coverage at 3, 5 and 10 seeds: 95% +- 2% over 4000
    simulated panels (the coverage's own standard error is 0.34%)."""
    assert abs(_coverage(t_interval, n) - 0.95) <= 0.02


def test_percentile_bootstrap_undercovers_at_three_seeds():
    """Why the t-interval replaced it: at 3 seeds the percentile bootstrap's nominal 95% covers
    about three quarters (the issue measured 76% on 400 draws)."""
    cov = _coverage(lambda r: bootstrap_ci(r, stat=np.mean, num_resamples=400), 3, draws=1000)
    assert 0.65 <= cov <= 0.85


def test_t_interval_by_hand():
    lo, hi = t_interval([0.2, 0.4])  # mean 0.3, s 0.1414, t_{1, 0.975} = 12.706
    assert (lo, hi) == pytest.approx((0.3 - 12.7062 * 0.1, 0.3 + 12.7062 * 0.1), abs=1e-4)
    assert t_interval([0.5]) == (0.5, 0.5) and all(math.isnan(v) for v in t_interval([]))


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
    # diffs 0.4, 0.2, 0.5: mean 0.367, s 0.153, t-interval 0.367 +- 4.303 * 0.0882 = [-0.013, 0.746]
    assert row["confident"] == "no (n=3)" and row["iqm"].startswith("0.8; diff +0.367 [-0.0128")
    md = markdown([row])
    assert "### Family: multiturn-credit" in md and "+12% (abstract)" in md
