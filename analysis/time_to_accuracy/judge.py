"""A workload's result, judged: from MLflow (``analyse``: the benchmark's runs and curves, the
target from full data's) or from the tables an earlier report saved (``results_from_tables``), by
the same function (``judge_workload``): the per-method summary, the plateau control, AtteNT's
comparisons, the temperatures, the variants' comparisons and the verdict's sentences.
"""

from __future__ import annotations

import pandas as pd
from attent import contract  # the names the engine logs (no engine import)
from attent.analysis import ReportError
from attent.analysis.stats import Target, mean_std, plateau_of, target_of
from attent.analysis.time_to_accuracy.results import (
    FULL,
    WorkloadResult,
    final_metrics,
    paired_comparisons,
    per_run_table,
    summarize,
    temperature_table,
    variant_table,
)
from attent.analysis.time_to_accuracy.runs import (
    CURVE_COLUMNS,
    CURVE_METRIC,
    METHOD,
    WORKLOAD,
    load_benchmark,
    load_curves,
)
from attent.analysis.time_to_accuracy.verdict import verdict
from attent.contract import lower_is_better
from mlflow import MlflowClient


def judge_workload(
    name: str,
    metric: str,
    lower: bool,
    target: Target,
    margin: float,
    per_run: pd.DataFrame,
    curves: pd.DataFrame,
    choices: list[dict] | None = None,
) -> WorkloadResult:
    """A workload's result from its per-run table (``per_run_table``'s, or as ``per_run.csv`` saved
    it): the per-method summary, the plateau control, AtteNT's comparisons, the temperatures, the
    variants' comparisons and the verdict's sentences."""
    summary = summarize(per_run)
    variants, variant_paired = variant_table(per_run, summary, lower, margin)
    result = WorkloadResult(
        name,
        metric,
        lower,
        plateau_of(per_run, lower, target.tolerance),
        target,
        summary,
        per_run,
        curves,
        margin,
        paired_comparisons(per_run, summary, lower, margin),
        temperature_table(summary),
        variants,
        variant_paired,
        list(choices or []),
    )
    result.verdict = verdict(result)
    return result


def analyse(
    client: MlflowClient,
    experiment: str,
    tolerances: dict[str, float] | None = None,
    margins: dict[str, float] | None = None,
) -> tuple[list[WorkloadResult], str | None]:
    """One result per workload (in the order they ran) and the parent run id. ``tolerances``:
    workload -> the target's tolerance; ``margins``: workload -> the equivalence margin of the
    final metric (default: the target's tolerance)."""
    bench = load_benchmark(client, experiment)
    runs = bench.runs
    curves = load_curves(client, runs)
    results = []
    for workload, group in runs.groupby(WORKLOAD, sort=False):
        group = group.reset_index(drop=True)
        metric = str(group[CURVE_METRIC].dropna().iloc[0] if group[CURVE_METRIC].notna().any() else "")
        if not metric:
            raise ReportError(f"workload {workload!r}: its runs carry no {contract.TAG_BENCH_METRIC} tag")
        metric = metric.removeprefix("metrics.")
        lower = lower_is_better(metric)
        mine = curves[curves["run_id"].isin(group["run_id"])].reset_index(drop=True)
        is_full = group[METHOD].eq(FULL)
        if not is_full.any():
            raise ReportError(f"workload {workload!r} has no finished full-data run: nothing to compare against")
        target = target_of(final_metrics(group, mine, metric)[is_full], lower, (tolerances or {}).get(workload))
        result = judge_workload(
            workload,
            metric,
            lower,
            target,
            (margins or {}).get(workload, target.tolerance),
            per_run_table(group, mine, metric, target.value, lower),
            mine,
            [c for c in bench.choices if c.get("workload") == workload],
        )
        result.superseded = bench.superseded.get(workload, 0)
        result.selection_runs = bench.selection_runs.get(workload, 0)
        results.append(result)
    return results, bench.parent


CONTEXT = ("workload", "metric", "lower_is_better", "target", "tolerance", "margin")  # per_run.csv's first columns


def saved_target(per_run: pd.DataFrame, lower: bool) -> Target:
    """The target a saved per-run table was judged against (its ``target`` and ``tolerance``
    columns), with full data's final metric over seeds and the rule in words: the default rule's,
    where it gives that tolerance, else the tolerance the workload was given."""
    full = per_run.loc[per_run["method"].eq(FULL), "final_metric"]
    tolerance = float(per_run["tolerance"].iloc[0])
    default = target_of(full, lower)
    target = default if default.tolerance == tolerance else target_of(full, lower, tolerance)
    reference, seed_std, seeds = mean_std(full)
    return Target(float(per_run["target"].iloc[0]), tolerance, target.rule, reference, seed_std, seeds)


def results_from_tables(per_run: pd.DataFrame, curves: pd.DataFrame | None = None) -> list[WorkloadResult]:
    """The results an earlier report judged, again, from the tables it saved: ``per_run.csv``
    (and ``curves.csv``, for the figures), by the same functions as from MLflow (``judge_workload``).
    What only the parent run held (the selection stage's choices, the runs left out) is not in
    them, so the text says no choices were recorded."""
    results = []
    for workload, group in per_run.groupby("workload", sort=False):
        group = group.reset_index(drop=True)
        metric, lower = str(group["metric"].iloc[0]), bool(group["lower_is_better"].iloc[0])
        mine = (
            curves[curves["workload"].eq(workload)].reset_index(drop=True)
            if curves is not None
            else pd.DataFrame(columns=CURVE_COLUMNS)
        )
        results.append(
            judge_workload(
                workload,
                metric,
                lower,
                saved_target(group, lower),
                float(group["margin"].iloc[0]),
                group.drop(columns=list(CONTEXT)),
                mine,
            )
        )
    return results
