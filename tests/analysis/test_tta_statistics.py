"""The time-to-accuracy statistics from per-run values: the plateau rule, Holm's and TOST's verdicts and intervals, targets."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats


def test_the_plateau_verdicts_from_the_interval():
    """Straight from per-run finals: flat differences plateau, a 3-point gain still improves, a
    gain as large as the tolerance is undetermined, and so are no control and one seed. For a loss,
    a lower full_long is the improvement; one that overfits (higher loss) has plateaued."""
    from attent.analysis.stats import plateau_of

    def runs(full, long, method="full_long"):
        return pd.DataFrame(
            {
                "method": ["full"] * len(full) + [method] * len(long),
                "seed": list(range(len(full))) + list(range(len(long))),
                "final_metric": list(full) + list(long),
            }
        )

    full = [0.80, 0.81, 0.79, 0.80]
    assert plateau_of(runs(full, [0.801, 0.809, 0.791, 0.8]), False, 0.005).verdict == "plateaued"
    assert plateau_of(runs(full, [0.83, 0.841, 0.819, 0.8305]), False, 0.005).verdict == "still improving"
    assert plateau_of(runs(full, [0.805, 0.82, 0.79, 0.805]), False, 0.005).verdict == "undetermined"
    assert plateau_of(runs(full, full, method="random"), False, 0.005).verdict == "undetermined: no full_long control"
    assert plateau_of(runs(full, [0.9]), False, 0.005).verdict == "undetermined: fewer than 2 paired seeds"
    losses = [1.00, 1.02, 0.99]
    assert plateau_of(runs(losses, [0.95, 0.96, 0.94]), True, 0.01).verdict == "still improving"
    assert plateau_of(runs(losses, [1.10, 1.13, 1.08]), True, 0.01).verdict == "plateaued"  # overfits


def judged_shifted_up(base: np.ndarray, quantity: str, better_when: str, margin: float | None):
    """AtteNT's ``base`` judged alone against a comparator 0.05 above it in every seed (a little
    noise), ``better_when`` saying which way is better for ``quantity``."""
    from attent.analysis.stats import Paired, judge_family

    shifted = base + 0.05 + np.array([0.001, -0.001, 0.002, 0.0])
    return judge_family([Paired("attent", "x", "matched", quantity, base, shifted, better_when)], margin=margin)[0]


def test_verdicts_follow_holm_and_tost_as_statsmodels_computes_them():
    """Three comparisons of four seeds: one clearly positive, one positive at p = 0.03 unadjusted
    (but 0.06 after Holm: inconclusive, not better), one within ± 0.01 (equivalent). The
    adjusted p-values are statsmodels' own, the intervals scipy's at each Holm step."""
    from attent.analysis.stats import Paired, judge_family
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.weightstats import ttost_paired

    base = np.array([0.80, 0.82, 0.79, 0.81])
    others = {
        "clear": base - np.array([0.05, 0.052, 0.049, 0.051]),
        "borderline": base - np.array([0.01, 0.03, 0.012, 0.028]),
        "close": base - np.array([0.001, -0.002, 0.0015, -0.0005]),
    }
    family = judge_family(
        [Paired("attent", name, "matched", "final metric", base, values, "higher") for name, values in others.items()],
        margin=0.01,
    )
    raw = [stats.ttest_rel(base, values).pvalue for values in others.values()]
    tost = [ttost_paired(base, values, -0.01, 0.01)[0] for values in others.values()]
    holm, tost_holm = (multipletests(p, alpha=0.05, method="holm")[1] for p in (raw, tost))
    assert [p.p for p in family] == pytest.approx(raw)
    assert [p.p_holm for p in family] == pytest.approx(list(holm))
    assert [p.p_tost for p in family] == pytest.approx(tost)
    assert [p.p_tost_holm for p in family] == pytest.approx(list(tost_holm))
    clear, borderline, close = family
    assert borderline.p < 0.05 < borderline.p_holm  # "better" unadjusted, not after Holm
    assert [p.verdict for p in family] == ["better", "inconclusive", "equivalent within ± 0.01"]
    # rejected at step j of m = 3: 1 - 0.05 / (3 - j + 1); Holm stops at step 2 (1 rejection), so
    # the comparisons it does not reject get that step's interval, 1 - 0.05 / 2
    for p, level in ((clear, 1 - 0.05 / 3), (borderline, 1 - 0.05 / 2), (close, 1 - 0.05 / 2)):
        expected = stats.ttest_rel(base, others[p.method]).confidence_interval(level)
        assert p.level == pytest.approx(level) and (p.low, p.high) == pytest.approx((expected.low, expected.high))
    assert borderline.low < 0 < borderline.high
    worse = judged_shifted_up(base, "final metric", "higher", margin=0.01)
    assert worse.verdict == "worse" and worse.level == pytest.approx(0.95)
    lower = judged_shifted_up(base, "cost to target (s)", "lower", margin=None)
    assert lower.verdict == "better" and math.isnan(lower.p_tost)  # lower cost is better; no margin, no TOST


def test_an_interval_excludes_zero_only_where_holm_gives_a_verdict():
    """Holm stops at its first non-rejection. Here the smallest p (0.0148, above 0.05 / 4) is not
    rejected, so no comparison is; the second's own-step interval (1 - 0.05 / 3) would exclude 0
    all the same (its p, 0.0154, is below 0.05 / 3), as the 20,000-image verdict had it. Every
    interval is then the stopping step's, 1 - 0.05 / 4, and each contains 0."""
    from attent.analysis.stats import Paired, judge_family
    from statsmodels.stats.multitest import multipletests

    base = np.array([0.80, 0.82, 0.79])
    others = {
        "first": base - np.array([0.037, 0.047, 0.057]),
        "second": base - np.array([0.036, 0.046, 0.056]),
        "third": base - np.array([-0.01, 0.01, 0.03]),
        "fourth": base - np.array([-0.02, 0.0, 0.02]),
    }
    family = judge_family(
        [Paired("attent", name, "matched", "final metric", base, values, "higher") for name, values in others.items()],
        margin=None,
    )
    raw = [stats.ttest_rel(base, values).pvalue for values in others.values()]
    first, second = family[:2]
    assert 0.05 / 4 < first.p < second.p < 0.05 / 3  # the second's own step would reject
    assert not multipletests(raw, alpha=0.05, method="holm")[0].any()
    assert stats.ttest_rel(base, others["second"]).confidence_interval(1 - 0.05 / 3).low > 0
    for p in family:
        assert p.verdict == "inconclusive" and p.level == pytest.approx(1 - 0.05 / 4)
        assert p.low < 0 < p.high


def test_lower_is_better_target():
    """A loss: the target is full data's final value plus the larger of 1 % of it and the seed std."""
    from attent.analysis.stats import target_of

    target = target_of(pd.Series([1.0, 1.02]), lower=True)  # the seed std beats 1 % of 1.01
    assert target.reference == pytest.approx(1.01) and target.seed_std == pytest.approx(0.02 / math.sqrt(2))
    assert target.tolerance == pytest.approx(0.02 / math.sqrt(2)) and target.value == pytest.approx(
        1.01 + target.tolerance
    )
    assert "the larger of 1% of full data's final value, 0.0101 and the seed std" in target.rule
    assert target_of(pd.Series([1.0, 1.02]), lower=True, tolerance=0.05).value == pytest.approx(1.06)
    from attent.analysis.time_to_accuracy.results import time_to_target

    curve = pd.DataFrame({"method_cost_s": [1.0, 2.0, 3.0, 4.0], "value": [3.0, float("nan"), 1.005, 0.9]})
    assert time_to_target(curve, target.value, lower=True) == 3.0
    assert math.isnan(time_to_target(curve, 0.5, lower=True))
