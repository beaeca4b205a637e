"""The statistics every report reaches its verdicts with, and nothing above them: the target rule
(``target_of``), paired t-intervals, Holm's adjustment and the interval at each comparison's Holm
step, equivalence by paired TOST, the verdicts a comparison may earn (``judge_family``), and the
plateau rule (``plateau_of``). It imports neither report: the paper tables' verdicts
(``paper_tables.verdicts``) and the time-to-accuracy report (``time_to_accuracy.results``, the
data-size view, the joined benchmarks) all judge through it, so that they reach the same verdicts
by the same rules.
"""

from __future__ import annotations

import gc
import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from attent import contract  # the method names (no engine import)
from attent.analysis import ReportError
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import ttost_paired

CONFIDENCE = 0.95  # intervals on savings and costs, unadjusted
PLATEAU_CONFIDENCE = 0.90  # two-sided, so each end is a one-sided 95 % bound
ALPHA = 0.05  # the family-wise error rate of the verdicts (Holm) and the TOST level
ACCURACY_TOLERANCE = 0.005  # the target's absolute tolerance for a higher-is-better metric
LOSS_TOLERANCE = 0.01  # the target's relative tolerance for a lower-is-better metric
FINAL, COST_TO_TARGET = "final metric", "cost to target (s)"  # the quantities compared (``Paired.quantity``)

# A row's budget match, its relation to AtteNT's budget: the reference (full data), the plateau
# control (full_long), matched to AtteNT's budget, or apart from it (then not judged).
REFERENCE, CONTROL, MATCHED, APART = "reference", "control", "matched", "apart"
# The verdicts a comparison may earn (the subject's: AtteNT's, or a variant's), and nothing stronger.
BETTER, WORSE, INCONCLUSIVE = "better", "worse", "inconclusive"
PLATEAUED, STILL_RISING, UNDETERMINED = "plateaued", "still improving", "undetermined"


def equivalent(margin: float) -> str:
    return f"equivalent within ± {margin:.4g}"


# --- columns ------------------------------------------------------------------------------------------


def numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column as floats; all NaN where nobody logged it."""
    if column not in frame:
        return pd.Series(math.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)


def mean_std(values: pd.Series) -> tuple[float, float, int]:
    """Mean, sample std (ddof=1; NaN for fewer than 2 values) and count of the values present."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return math.nan, math.nan, 0
    return float(values.mean()), (float(values.std(ddof=1)) if len(values) > 1 else math.nan), len(values)


def seed_pair(mine: pd.DataFrame, other: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """Two methods' values of ``column`` over the seeds where both have one (frames by seed)."""
    both = pd.concat([mine[column].rename("mine"), other[column].rename("other")], axis=1, join="inner").dropna()
    return both["mine"].to_numpy(float), both["other"].to_numpy(float)


# --- the target ---------------------------------------------------------------------------------------


@dataclass
class Target:
    value: float
    tolerance: float
    rule: str  # how the tolerance was chosen, in words
    reference: float  # full data's final metric, mean over seeds
    seed_std: float  # its std over seeds (NaN for one seed)
    seeds: int


def target_of(full_finals: pd.Series, lower: bool, tolerance: float | None = None) -> Target:
    """Full data's final metric (mean over seeds) less the tolerance (plus it, for a
    lower-is-better metric): the larger of the floor (0.005 absolute; 1 % of the value for a
    lower-is-better metric; or the ``tolerance`` given) and the seed std of the final value."""
    reference, seed_std, seeds = mean_std(full_finals)
    if seeds == 0:
        raise ReportError("full data logged no final value of the curve metric")
    spread = 0.0 if math.isnan(seed_std) else seed_std
    if tolerance is not None:
        floor, floor_words = tolerance, f"the tolerance given for this workload, {tolerance:.4g}"
    elif lower:
        floor = LOSS_TOLERANCE * abs(reference)
        floor_words = f"{LOSS_TOLERANCE:.0%} of full data's final value, {floor:.4f}"
    else:
        floor, floor_words = ACCURACY_TOLERANCE, f"{ACCURACY_TOLERANCE} absolute"
    slack = max(floor, spread)
    spread_words = (
        "no seed std (one seed)" if math.isnan(seed_std) else f"the seed std of full data's final value, {seed_std:.4f}"
    )
    return Target(
        reference + slack if lower else reference - slack,
        slack,
        f"the larger of {floor_words} and {spread_words}",
        reference,
        seed_std,
        seeds,
    )


# --- intervals and Holm ----------------------------------------------------------------------------


@dataclass
class TTest:
    """A one-sample t-test of paired differences against 0, and its interval at ``confidence``."""

    mean: float
    low: float
    high: float
    p: float  # two-sided; NaN for fewer than 2 values
    n: int


def t_test(differences, confidence: float = CONFIDENCE) -> TTest:
    """scipy's one-sample t-test of the differences (NaN dropped) and its t-interval. Differences
    that are all equal have no spread: the interval is the point, and p is 0 (1 where they are
    all 0), which is what the t statistic's limit says; scipy warns about them, needlessly."""
    d = pd.to_numeric(pd.Series(differences, dtype=float), errors="coerce").dropna().to_numpy()
    if len(d) < 2:
        return TTest(float(d.mean()) if len(d) else math.nan, math.nan, math.nan, math.nan, len(d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "precision loss": identical differences
        result = stats.ttest_1samp(d, 0.0)
        low, high = result.confidence_interval(confidence)
    p = float(result.pvalue)
    return TTest(float(d.mean()), float(low), float(high), 1.0 if math.isnan(p) else p, len(d))


def holm(pvalues: list[float]) -> np.ndarray:
    """Holm-adjusted p-values (statsmodels' ``multipletests``). Its Holm branch ends in a full
    ``gc.collect()``, which in a process holding torch, MLflow and pandas took 0.18 s a call here
    (a report makes dozens): the objects that exist before the call are frozen out of it."""
    gc.freeze()
    try:
        return multipletests(pvalues, alpha=ALPHA, method="holm")[1]
    finally:
        gc.unfreeze()


def holm_steps(pvalues: list[float]) -> list[tuple[float, float]]:
    """Each p's Holm-adjusted p and the confidence of the interval that agrees with its verdict
    (``judge_family``): 1 − ALPHA / (m − j + 1) for the j-th smallest p where Holm rejects it,
    1 − ALPHA / (m − r) after r rejections for the rest."""
    adjusted = holm(pvalues)
    m, rejected = len(pvalues), int(sum(a < ALPHA for a in adjusted))
    levels = [math.nan] * m
    for rank, index in enumerate(sorted(range(m), key=lambda i: pvalues[i])):  # stable: ties keep the order
        levels[index] = 1 - ALPHA / (m - min(rank, rejected))
    return [(float(a), level) for a, level in zip(adjusted, levels)]


# --- paired comparisons and their verdicts ------------------------------------------------------------


@dataclass
class Paired:
    """One comparison, seed by seed: the subject's values (AtteNT's, or a variant's) minus the
    method's, over the seeds where both have one; filled in by ``judge_family``."""

    subject: str
    method: str
    budget_match: str  # against AtteNT's budget: the method's (the variant's, for a variant)
    quantity: str  # what is compared, e.g. "final metric" or "cost to target (s)"
    subject_values: np.ndarray
    method_values: np.ndarray
    better_when: str  # "higher" or "lower": the sign of the difference that favours the subject
    note: str = ""  # why there is no verdict, or the seeds that reached the target
    margin: float = math.nan  # the equivalence margin (NaN: none declared)
    p: float = math.nan  # two-sided paired t-test
    p_holm: float = math.nan  # Holm-adjusted across the family
    p_tost: float = math.nan  # TOST's (equivalence within ± margin)
    p_tost_holm: float = math.nan
    level: float = math.nan  # the confidence of the interval at this comparison's Holm step
    low: float = math.nan  # that interval
    high: float = math.nan

    @property
    def seeds(self) -> int:
        return len(self.subject_values)

    @property
    def differences(self) -> np.ndarray:
        return self.subject_values - self.method_values

    @property
    def mean(self) -> float:
        return float(self.differences.mean()) if self.seeds else math.nan

    @property
    def unadjusted(self) -> TTest:
        """The plain 95 % t-interval, for the CSV beside the Holm one."""
        return t_test(self.differences, CONFIDENCE)

    @property
    def verdict(self) -> str:
        if self.budget_match == APART:
            return f"not judged: {self.note}"
        if self.seeds == 0:
            return f"no paired seeds{'; ' + self.note if self.note else ''}"
        if self.seeds < 2 or math.isnan(self.p_holm):
            return f"no interval: 1 paired seed{'; ' + self.note if self.note else ''}"
        if self.p_holm < ALPHA:
            return BETTER if (self.mean > 0) == (self.better_when == "higher") else WORSE
        return equivalent(self.margin) if self.p_tost_holm < ALPHA else INCONCLUSIVE

    @property
    def judged(self) -> bool:
        """Whether the verdict is one of the four (better, worse, equivalent, inconclusive), not a
        reason for having none."""
        return self.budget_match != APART and not math.isnan(self.p_holm)

    @property
    def places(self) -> int:
        """Decimals to show: seconds to 0.1 s, the metric to 4."""
        return 1 if self.quantity.endswith("(s)") else 4

    def record(self) -> dict[str, object]:
        plain = self.unadjusted
        return {
            "subject": self.subject,
            "method": self.method,
            "budget_match": self.budget_match,
            "quantity": self.quantity,
            "paired_seeds": self.seeds,
            "difference": self.mean,
            "low_95": plain.low,
            "high_95": plain.high,
            "p": self.p,
            "p_holm": self.p_holm,
            "holm_level": self.level,
            "holm_low": self.low,
            "holm_high": self.high,
            "margin": self.margin,
            "p_tost": self.p_tost,
            "p_tost_holm": self.p_tost_holm,
            "better_when": self.better_when,
            "verdict": self.verdict,
        }


def judge_family(family: list[Paired], margin: float | None) -> list[Paired]:
    """Verdicts for a family of comparisons, from intervals only. Among the comparisons with two
    paired seeds or more (m of them): each one's paired t-test p and, with a ``margin``, its TOST
    p (``ttost_paired``, equivalence within ± margin), each set Holm-adjusted across the family
    (``multipletests(..., method="holm")``). "better" / "worse" where the adjusted t-test p <
    ALPHA; else "equivalent within ± margin" where the adjusted TOST p < ALPHA; else
    "inconclusive". The interval reported agrees with the verdict: a comparison Holm rejects at its
    step j (the j-th smallest p of m) gets the 1 − ALPHA / (m − j + 1) t-interval, which excludes
    0; every comparison it does not reject gets the interval at the step where Holm stopped,
    1 − ALPHA / (m − r) after r rejections, which contains 0 (Holm stops at its first
    non-rejection, so a later comparison's own-step interval could exclude 0 with no verdict).
    Returns the family, filled in."""
    tested = [p for p in family if p.seeds >= 2 and p.budget_match != APART]
    if not tested:
        return family
    for p in tested:
        p.p = t_test(p.differences).p
        if margin is not None and not math.isnan(margin):
            p.margin = margin
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # identical differences: a 0 std divides
                tost = float(ttost_paired(p.subject_values, p.method_values, -margin, margin)[0])
            p.p_tost = 1.0 if math.isnan(tost) else tost
    for p, (adjusted, level) in zip(tested, holm_steps([p.p for p in tested])):
        p.p_holm, p.level = adjusted, level
        interval = t_test(p.differences, level)
        p.low, p.high = interval.low, interval.high
    if not math.isnan(tested[0].p_tost):
        for p, adjusted in zip(tested, holm([p.p_tost for p in tested])):
            p.p_tost_holm = float(adjusted)
    return family


# --- the plateau rule ---------------------------------------------------------------------------------


@dataclass
class Plateau:
    """The plateau control: full data for 2E epochs (full_long) against full data for E, seed by
    seed. ``mean``, ``low``, ``high``: the improvement full_long's final metric makes on full
    data's (positive = better, whichever way the metric runs) and its 90 % t-interval."""

    seeds: int  # paired seeds (0 without a control)
    mean: float
    low: float
    high: float
    tolerance: float  # the target's
    control: bool  # whether the workload has full_long runs
    control_name: str = contract.METHOD_FULL_LONG  # what the verdict calls the control (the paper tables: "2E")

    @property
    def verdict(self) -> str:
        """``plateaued`` when the interval's upper end lies below the tolerance (more epochs gain
        less than it, or lose: an overfitting run has plateaued too); ``still improving`` when its
        lower end lies above it; ``undetermined`` otherwise, with the reason where it is not the
        interval's."""
        if not self.control:
            return f"{UNDETERMINED}: no {self.control_name} control"
        if self.seeds < 2 or math.isnan(self.low):
            return f"{UNDETERMINED}: fewer than 2 paired seeds"
        if self.high < self.tolerance:
            return PLATEAUED
        return STILL_RISING if self.low > self.tolerance else UNDETERMINED

    @property
    def reached(self) -> bool | None:
        """True: plateaued; False: still improving; None: undetermined."""
        return {PLATEAUED: True, STILL_RISING: False}.get(self.verdict)


def plateau_of(
    per_run: pd.DataFrame, lower: bool, tolerance: float, control_name: str = contract.METHOD_FULL_LONG
) -> Plateau:
    """full_long's final metric minus full data's, seed by seed, signed so that positive is an
    improvement, and its 90 % t-interval, against the tolerance (``Plateau.verdict``).
    ``per_run``: ``method`` (full or full_long), ``seed``, ``final_metric``; ``control_name``: what
    the verdict calls the control."""

    def finals(method: str) -> pd.Series:
        return per_run[per_run["method"].eq(method)].set_index("seed")["final_metric"].dropna()

    full, long = finals(contract.METHOD_FULL), finals(contract.METHOD_FULL_LONG)
    if long.empty:
        return Plateau(0, math.nan, math.nan, math.nan, tolerance, control=False, control_name=control_name)
    seeds = full.index.intersection(long.index)
    gain = (long[seeds] - full[seeds]) * (-1 if lower else 1)
    test = t_test(gain, PLATEAU_CONFIDENCE)
    return Plateau(test.n, test.mean, test.low, test.high, tolerance, control=True, control_name=control_name)
