"""Whether AtteNT's differences move with the training-set size at all (``size_trends``): the
seed-paired differences from each comparator of the size view, regressed on log10(size), with the
straight line's lack of fit and a shape-free test across the sizes, Holm across the comparators;
and the verdicts and table ``data_size``'s view writes under its heading.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from attent import contract
from attent.analysis.stats import ALPHA, INCONCLUSIVE, holm, holm_steps
from attent.analysis.time_to_accuracy.results import ATTENT, FULL
from statsmodels.regression.linear_model import OLS
from statsmodels.stats.oneway import anova_oneway
from statsmodels.tools import add_constant

# the comparators on the size axis, AtteNT's minus each one's (defined here, beneath ``data_size``'s table and
# figure, which read them too)
AGAINST = {
    "random": "Random at AtteNT's budget",
    FULL: "full data",
    contract.METHOD_FULL_EQUAL_COST: "full data at equal cost (measured)",
}
GAINS, LOSES = "AtteNT gains with size", "AtteNT loses with size"  # the trend's verdicts, besides inconclusive
# the straight line's lack-of-fit verdicts: the line is never "shown", only not rejected
CURVED, NO_DEPARTURE = "departs from a line", "no departure detected"
DIFFERS = "differs across sizes"  # Welch's one-way ANOVA, no shape assumed, besides inconclusive
TREND_HEADING = (
    "Does the difference move with the size? Each comparison's seed-paired differences at every size, "
    "regressed on log10(training images) (OLS), Holm across the comparators; whether a straight line "
    "fits is the lack-of-fit F test against one mean per size, and whether the difference moves with the size in any "
    "shape Welch's one-way ANOVA across the sizes (each Holm across the comparators):"
)


def size_trends(per_run: pd.DataFrame, sizes: dict[str, int], lower: bool) -> pd.DataFrame:
    """Whether AtteNT's difference from each comparator moves with the training-set size: its final
    metric minus the comparator's, paired by seed within each size, regressed on log10(size) by
    ordinary least squares (statsmodels' ``OLS``: a straight line in log size, one residual variance
    for all sizes). One row per comparator with paired seeds at two sizes or more: the slope per
    tenfold data, its interval at the Holm step's level across the comparators (``holm_steps``, as
    the report's other families), and the verdict: "AtteNT gains with size" (or "loses") on that
    comparator where the interval excludes 0, else "inconclusive". Each size's seeds draw their own
    images, so the points are taken as independent (where a seed's images at two sizes overlap
    and shift its points by one offset, that offset cancels from the slope but stays in the
    residuals: the slope's error is then over-, not under-stated). With three sizes or more the
    line itself is tested (``line_lack_of_fit``), Holm across the comparators: "departs from a
    line" where rejected, else "no departure detected" (the line is then an assumption the data
    did not refute, not a shape they show). With no shape assumed, ``welch_across_sizes`` asks
    whether the difference's mean differs between the sizes at all, Holm across the comparators:
    "differs across sizes" or "inconclusive"."""
    known = per_run[per_run["workload"].isin(list(sizes))] if "workload" in per_run else per_run.iloc[:0]
    if known.empty:
        return pd.DataFrame()
    finals = known.pivot_table(index=["workload", "seed"], columns="method", values="final_metric")
    fits = []
    for method, label in AGAINST.items():
        if ATTENT not in finals or method not in finals:
            continue
        difference = (finals[ATTENT] - finals[method]).dropna()
        log_size = np.log10(difference.index.get_level_values("workload").map(sizes).to_numpy(dtype=float))
        if len(set(log_size)) < 2 or len(difference) < 3:
            continue
        fits.append((method, label, OLS(difference.to_numpy(), add_constant(log_size)).fit(), log_size))
    rows = []
    for (method, label, fit, log_size), (p_holm, level) in zip(fits, holm_steps([f[2].pvalues[1] for f in fits])):
        low, high = fit.conf_int(1 - level)[1]
        slope = float(fit.params[1])
        verdict = INCONCLUSIVE if p_holm >= ALPHA else (GAINS if (slope > 0) != lower else LOSES)
        rows.append(
            {
                "comparator": method,
                "label": label,
                "sizes": len(set(log_size)),
                "points": int(fit.nobs),
                "intercept": float(fit.params[0]),
                "slope_per_decade": slope,
                "low": float(low),
                "high": float(high),
                "level": level,
                "p": float(fit.pvalues[1]),
                "p_holm": p_holm,
                "verdict": verdict,
                "lack_of_fit_p": line_lack_of_fit(fit, log_size),
                "across_sizes_p": welch_across_sizes(fit.model.endog, log_size),
            }
        )
    for column, verdicts in (("lack_of_fit", (CURVED, NO_DEPARTURE)), ("across_sizes", (DIFFERS, INCONCLUSIVE))):
        tested = [i for i, row in enumerate(rows) if not math.isnan(row[f"{column}_p"])]
        for i, p_holm in zip(tested, holm([rows[i][f"{column}_p"] for i in tested]) if tested else []):
            rows[i].update(
                {f"{column}_p_holm": p_holm, f"{column}_verdict": verdicts[0] if p_holm < ALPHA else verdicts[1]}
            )
    return pd.DataFrame(rows)


def line_lack_of_fit(line, log_size: np.ndarray) -> float:
    """The lack-of-fit F test of a straight line in log size: its residuals against those of one
    mean per size (statsmodels' ``compare_f_test``, the line nested in the per-size means), on
    sizes - 2 degrees of freedom; NaN with fewer than 3 sizes or no seed replicating a size."""
    levels = sorted(set(log_size))
    if len(levels) < 3 or len(log_size) <= len(levels):
        return math.nan
    per_size = OLS(line.model.endog, (log_size[:, None] == np.array(levels)[None, :]).astype(float)).fit()
    return float(per_size.compare_f_test(line)[1])


def welch_across_sizes(differences: np.ndarray, log_size: np.ndarray) -> float:
    """Whether the difference's mean differs between the sizes at all, with no shape assumed and
    each size its own variance (the seeds spread far wider at 600 images than at 20,000): Welch's
    one-way ANOVA (statsmodels' ``anova_oneway``, ``use_var="unequal"``); NaN where a size has
    fewer than 2 seeds."""
    levels, counts = np.unique(log_size, return_counts=True)
    if len(levels) < 2 or counts.min() < 2:
        return math.nan
    return float(anova_oneway(differences, groups=log_size, use_var="unequal").pvalue)


def trend_markdown(trends: pd.DataFrame) -> str:
    if trends.empty:
        return "No trend: AtteNT and a comparator are not paired at two sizes or more."
    lines = [
        "| AtteNT − comparator, final | sizes | paired seeds | slope per 10× images "
        "| interval (Holm step) | verdict | the line's lack of fit: Holm p, verdict "
        "| any shape (Welch ANOVA): Holm p, verdict |",
        "|---|---:|---:|---:|---|---|---|---|",
    ]

    def tested(row: dict, column: str, short: str) -> str:
        verdict = row.get(f"{column}_verdict")
        return f"{row[f'{column}_p_holm']:.3g}, {verdict}" if isinstance(verdict, str) else f"— ({short})"

    for row in trends.to_dict("records"):
        lines.append(
            f"| AtteNT − {row['label']} | {row['sizes']} | {row['points']} | {row['slope_per_decade']:+.4f} "
            f"| [{row['low']:+.4f}, {row['high']:+.4f}] ({row['level']:.1%}) | {row['verdict']} "
            f"| {tested(row, 'lack_of_fit', 'fewer than 3 sizes')} "
            f"| {tested(row, 'across_sizes', 'a size with one seed')} |"
        )
    return "\n".join(lines)
