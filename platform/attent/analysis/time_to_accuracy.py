"""The time-to-accuracy benchmark's report, from MLflow alone: does a selection method reach full
data's accuracy for less method cost, in the regime where that claim applies? This docstring is
the report's methods section.

- **Runs.** Only verdict-stage runs are read (tag ``attent.benchmark.stage`` = ``verdict``, or
  no stage tag, as older benchmarks logged them); the latest finished run of each workload,
  method and seed counts. Selection-stage runs chose knobs on the validation split: they are
  counted and left out. What the selection stage chose (``choices.json`` on the benchmark's
  parent run: the knob, the value chosen, the validation metric and its mean per candidate
  value) is listed per workload.
- **The target** is full data's final metric (mean over seeds) less a tolerance (plus it, for a
  lower-is-better metric): the larger of a floor (0.005 absolute for a higher-is-better metric,
  1 % of the value for a lower-is-better one, or the tolerance given for the workload) and the
  seed standard deviation of full data's final value.
- **The regime, by a control.** ``full_long`` trains full data for 2E epochs, its learning-rate
  schedule spanning them. Per seed, d = full_long's final metric − full data's, signed so that
  positive is an improvement. From the two-sided 90 % paired t-interval of d (each end a
  one-sided 95 % bound): "plateaued" when its upper end lies below the tolerance (E more epochs
  gain less than the tolerance, or lose: full data that overfits has plateaued too); "still
  improving" when its lower end lies above the tolerance (the comparison then measures the
  budget, not the selection); "undetermined" otherwise, and with no full_long run or fewer than
  2 paired seeds.
- **Per method** (mean ± std over seeds; "± std" only where n >= 2): the final metric; the
  sustained cost to the target, the method cost (training + scoring + selection) at the first
  evaluation from which the metric stays past the target through the last evaluation (a curve
  that crosses and falls back has not reached the target at that crossing), over the seeds that
  reach it; the method cost and wall-clock in all; the optimiser steps; the ideal saving (1 −
  samples back-propagated / full data's of the same seed); the realized saving (1 − method cost
  / full data's of the same seed) and realized / ideal saving (the ratio per seed), each with a
  95 % t-interval over seeds; the budget (samples back-propagated / full data's; the mean
  selected ratio where those are missing) and how hard its picks were (mean over epochs of
  ``selection_hardness``: 0 for uniform picks, 1 for the k highest scores).
- **Budgets.** Rows whose budget lies within 2 % (relative) of AtteNT's are matched; so are, by
  construction, full data at equal cost (measured: the epochs whose measured method cost matches
  the same seed's AtteNT run) and full data at equal samples (round(AtteNT's mean planned ratio ×
  E) epochs). Other rows stand apart, labelled with their budget, and are not judged. Full data
  is the reference the target comes from; full_long is the plateau control, not compared.
- **Words, from intervals only.** AtteNT against each other method of the workload but
  full_long, seed by seed: AtteNT's value minus the method's over the seeds both ran (the cost
  to the target over the seeds where both reached it). Each quantity (the final metric; the
  cost to the target) is a family: its comparisons with two paired seeds or more that are not
  apart. In a family, each comparison's paired t-test p (scipy's ``ttest_1samp`` on the
  differences) is Holm-adjusted across the family (statsmodels' ``multipletests``, ``holm``):
  "better" / "worse" (AtteNT's) where the adjusted p < 0.05; else "equivalent within ± m" where
  the paired TOST with margin m (statsmodels' ``ttost_paired``), its p Holm-adjusted across the
  family, gives p < 0.05; else "inconclusive". m is the workload's declared margin (by default
  the target's tolerance) for the final metric; no margin is declared for the cost to the
  target, whose words are better, worse or inconclusive. The interval given with each word is
  the t-interval at the comparison's Holm step, so that it excludes 0 exactly where the word is
  better or worse: the j-th smallest p of m, rejected, gets the 1 − 0.05 / (m − j + 1) interval;
  those not rejected get the interval of the step where Holm stopped, 1 − 0.05 / (m − r) after
  r rejections. ``paired.csv`` adds the plain 95 % intervals and the p-values.
  Variants (``method+suffix``) are compared, seed by seed, with full data, full data at equal
  cost and at equal samples, and the method they vary: a family of their own, the same words.
  Nothing in the report says more than these words; means are listed in order, not ranked.
- **Temperatures.** Soft and AtteNT rows that differ in ``selection.temperature`` (e.g. methods
  ``soft+T0.1``, ``soft+T1``): temperature, hardness and final metric side by side.

Written as ``time_to_accuracy.md``, four CSVs (``per_run.csv``, ``summary.csv``, ``paired.csv``,
``curves.csv``; every workload in each, a ``workload`` column tells them apart) and figures per
workload (the metric against cumulative method cost, the final metric against method cost, and
the hardness of the picks), all logged to the benchmark's parent run under ``report/``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
from mlflow import MlflowClient

from attent import contract  # the names the engine logs (no engine import)
from attent.analysis.figures import workload_figures
from attent.analysis.runs import REPORT_ARTIFACTS, ReportError
from attent.analysis.stats import mean_std, plateau_of
from attent.analysis.tta_results import (FULL, Target, WorkloadResult, final_metrics, paired_comparisons, per_run_table, summarize,
                                         target_of, temperature_table, variant_table)
from attent.analysis.tta_runs import CURVE_COLUMNS, CURVE_METRIC, METHOD, WORKLOAD, load_benchmark, load_curves
from attent.analysis.tta_text import markdown, terminal, verdict
from attent.contract import lower_is_better


# --- the report --------------------------------------------------------------------------------------

def judge_workload(name: str, metric: str, lower: bool, target: Target, margin: float, per_run: pd.DataFrame,
                   curves: pd.DataFrame, choices: list[dict] | None = None) -> WorkloadResult:
    """A workload's result from its per-run table (``per_run_table``'s, or as ``per_run.csv`` saved
    it): the per-method summary, the plateau control, AtteNT's comparisons, the temperatures, the
    variants' comparisons and the verdict's sentences."""
    summary = summarize(per_run)
    variants, variant_paired = variant_table(per_run, summary, lower, margin)
    result = WorkloadResult(name, metric, lower, plateau_of(per_run, lower, target.tolerance), target, summary,
                            per_run, curves, margin, paired_comparisons(per_run, summary, lower, margin),
                            temperature_table(summary), variants, variant_paired, list(choices or []))
    result.verdict = verdict(result)
    return result


def analyse(client: MlflowClient, experiment: str, tolerances: dict[str, float] | None = None,
            margins: dict[str, float] | None = None) -> tuple[list[WorkloadResult], str | None]:
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
        result = judge_workload(workload, metric, lower, target, (margins or {}).get(workload, target.tolerance),
                                per_run_table(group, mine, metric, target.value, lower), mine,
                                [c for c in bench.choices if c.get("workload") == workload])
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
        mine = (curves[curves["workload"].eq(workload)].reset_index(drop=True) if curves is not None
                else pd.DataFrame(columns=CURVE_COLUMNS))
        results.append(judge_workload(workload, metric, lower, saved_target(group, lower),
                                      float(group["margin"].iloc[0]), group.drop(columns=list(CONTEXT)), mine))
    return results


def tables(results: list[WorkloadResult]) -> dict[str, pd.DataFrame]:
    """The four CSVs' frames, every workload in each."""
    def stacked(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)

    def context(r: WorkloadResult) -> dict[str, object]:
        return dict(zip(CONTEXT, (r.name, r.metric, r.lower, r.target.value, r.target.tolerance, r.margin)))
    per_run = stacked([pd.concat([pd.DataFrame(context(r), index=r.per_run.index), r.per_run], axis=1)
                       for r in results], ["workload"])
    summary = stacked([pd.concat([pd.DataFrame({**context(r), "full_final": r.target.reference,
                                                "plateau_verdict": r.plateau.verdict, "plateaued": r.plateau.reached,
                                                "plateau_gain": r.plateau.mean, "plateau_low_90": r.plateau.low,
                                                "plateau_high_90": r.plateau.high,
                                                "plateau_seeds": r.plateau.seeds}, index=r.summary.index),
                                  r.summary], axis=1) for r in results], ["workload"])
    paired = stacked([pd.DataFrame([{"workload": r.name, "metric": r.metric, "family": family, **p.record()}
                                    for family, ps in (("attent", r.paired), ("variants", r.variant_paired))
                                    for p in ps]) for r in results],
                     ["workload", "family", "subject", "method", "quantity", "verdict"])
    curves = stacked([r.curves for r in results], CURVE_COLUMNS)
    return {"per_run": per_run, "summary": summary, "paired": paired, "curves": curves}


def write_report(results: list[WorkloadResult], title: str, out: Path, figures: bool = True) -> None:
    """``time_to_accuracy.md``, the four CSVs and (with ``figures``) the figures per workload in ``out``."""
    (out / "figures").mkdir(parents=True, exist_ok=True)
    text = [f"# Time-to-accuracy benchmark: {title}", "",
            "Does a selection method reach full data's final metric (less a stated tolerance), and stay there, for "
            "less method cost (training + scoring + selection), at AtteNT's budget, where more epochs no longer help "
            "full data? Verdict-stage runs only; comparisons only between rows of matched budgets; words "
            "(better, worse, equivalent within ± m, inconclusive) from Holm-adjusted intervals only. The method: "
            "`attent/analysis/time_to_accuracy.py`'s docstring. CSVs beside this file: per_run.csv, summary.csv, "
            "paired.csv, curves.csv.", ""]
    for result in results:
        text += [markdown(result), ""]
        for name, figure in (workload_figures(result) if figures else {}).items():
            figure.savefig(out / "figures" / f"{name}.png", dpi=110)
            text += [f"![{name}](figures/{name}.png)", ""]
    for name, frame in tables(results).items():
        frame.to_csv(out / f"{name}.csv", index=False)
    (out / "time_to_accuracy.md").write_text("\n".join(text) + "\n")


def build_time_to_accuracy_report(experiment: str, *, tracking_uri: str, out_dir: str | Path,
                                  tolerances: dict[str, float] | None = None,
                                  margins: dict[str, float] | None = None) -> Path:
    """Markdown, CSVs and figures in ``out_dir``, also logged to the parent run (under
    ``report/``, which is then marked FINISHED); returns the folder. ``tolerances``: workload ->
    the target's tolerance, instead of the defaults; ``margins``: workload -> the equivalence
    margin of the final metric (default: the target's tolerance)."""
    client = MlflowClient(tracking_uri)
    results, parent = analyse(client, experiment, tolerances, margins)
    out = Path(out_dir)
    write_report(results, experiment, out)
    width = min(120, shutil.get_terminal_size().columns)
    print("\n\n".join(terminal(result, width) for result in results), flush=True)
    if parent:
        client.log_artifacts(parent, str(out), REPORT_ARTIFACTS)
        client.set_terminated(parent, "FINISHED")
    return out
