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
- **Verdicts, from intervals only.** AtteNT against each other method of the workload but
  full_long, seed by seed: AtteNT's value minus the method's over the seeds both ran (the cost
  to the target over the seeds where both reached it). Each quantity (the final metric; the
  cost to the target) is a family: its comparisons with two paired seeds or more that are not
  apart. In a family, each comparison's paired t-test p (scipy's ``ttest_1samp`` on the
  differences) is Holm-adjusted across the family (statsmodels' ``multipletests``, ``holm``):
  "better" / "worse" (AtteNT's) where the adjusted p < 0.05; else "equivalent within ± m" where
  the paired TOST with margin m (statsmodels' ``ttost_paired``), its p Holm-adjusted across the
  family, gives p < 0.05; else "inconclusive". m is the workload's declared margin (by default
  the target's tolerance) for the final metric; no margin is declared for the cost to the
  target, whose verdicts are better, worse or inconclusive. The interval given with each verdict is
  the t-interval at the comparison's Holm step, so that it excludes 0 exactly where the verdict is
  better or worse: the j-th smallest p of m, rejected, gets the 1 − 0.05 / (m − j + 1) interval;
  those not rejected get the interval of the step where Holm stopped, 1 − 0.05 / (m − r) after
  r rejections. ``paired.csv`` adds the plain 95 % intervals and the p-values.
  Variants (``method+suffix``) are compared, seed by seed, with full data, full data at equal
  cost and at equal samples, and the method they vary: a family of their own, the same verdicts.
  Nothing in the report says more than these verdicts; means are listed in order, not ranked.
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
from attent import contract  # the names the engine logs (no engine import)
from attent.analysis.mlflow_runs import REPORT_ARTIFACTS
from attent.analysis.time_to_accuracy.data_size import build_data_size_report
from attent.analysis.time_to_accuracy.figures import workload_figures
from attent.analysis.time_to_accuracy.judge import CONTEXT, analyse
from attent.analysis.time_to_accuracy.results import WorkloadResult
from attent.analysis.time_to_accuracy.runs import CURVE_COLUMNS, WORKLOAD, load_benchmark, parent_json
from attent.analysis.time_to_accuracy.workload_tables import markdown, terminal
from mlflow import MlflowClient


def tables(results: list[WorkloadResult]) -> dict[str, pd.DataFrame]:
    """The four CSVs' frames, every workload in each."""

    def stacked(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)

    def context(r: WorkloadResult) -> dict[str, object]:
        return dict(zip(CONTEXT, (r.name, r.metric, r.lower, r.target.value, r.target.tolerance, r.margin)))

    per_run = stacked(
        [pd.concat([pd.DataFrame(context(r), index=r.per_run.index), r.per_run], axis=1) for r in results], ["workload"]
    )
    summary = stacked(
        [
            pd.concat(
                [
                    pd.DataFrame(
                        {
                            **context(r),
                            "full_final": r.target.reference,
                            "plateau_verdict": r.plateau.verdict,
                            "plateaued": r.plateau.reached,
                            "plateau_gain": r.plateau.mean,
                            "plateau_low_90": r.plateau.low,
                            "plateau_high_90": r.plateau.high,
                            "plateau_seeds": r.plateau.seeds,
                        },
                        index=r.summary.index,
                    ),
                    r.summary,
                ],
                axis=1,
            )
            for r in results
        ],
        ["workload"],
    )
    paired = stacked(
        [
            pd.DataFrame(
                [
                    {"workload": r.name, "metric": r.metric, "family": family, **p.record()}
                    for family, ps in (("attent", r.paired), ("variants", r.variant_paired))
                    for p in ps
                ]
            )
            for r in results
        ],
        ["workload", "family", "subject", "method", "quantity", "verdict"],
    )
    curves = stacked([r.curves for r in results], CURVE_COLUMNS)
    return {"per_run": per_run, "summary": summary, "paired": paired, "curves": curves}


def write_report(results: list[WorkloadResult], title: str, out: Path, figures: bool = True) -> None:
    """``time_to_accuracy.md``, the four CSVs and (with ``figures``) the figures per workload in ``out``."""
    (out / "figures").mkdir(parents=True, exist_ok=True)
    text = [
        f"# Time-to-accuracy benchmark: {title}",
        "",
        "Does a selection method reach full data's final metric (less a stated tolerance), and stay there, for "
        "less method cost (training + scoring + selection), at AtteNT's budget, where more epochs no longer help "
        "full data? Verdict-stage runs only; comparisons only between rows of matched budgets; verdicts "
        "(better, worse, equivalent within ± m, inconclusive) from Holm-adjusted intervals only. The method: "
        "`analysis/time_to_accuracy/report.py`'s docstring. CSVs beside this file: per_run.csv, summary.csv, "
        "paired.csv, curves.csv.",
        "",
    ]
    for result in results:
        text += [markdown(result), ""]
        for name, figure in (workload_figures(result) if figures else {}).items():
            figure.savefig(out / "figures" / f"{name}.png", dpi=110)
            text += [f"![{name}](figures/{name}.png)", ""]
    for name, frame in tables(results).items():
        frame.to_csv(out / f"{name}.csv", index=False)
    (out / "time_to_accuracy.md").write_text("\n".join(text) + "\n")


def build_time_to_accuracy_report(
    experiment: str,
    *,
    tracking_uri: str,
    out_dir: str | Path,
    tolerances: dict[str, float] | None = None,
    margins: dict[str, float] | None = None,
) -> Path:
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


def benchmark_report(
    experiment: str, tracking_uri: str | None, out: str | Path, margin: float | None = None, spec: dict | None = None
) -> tuple[Path, bool]:
    """The time-to-accuracy report of a benchmark from its runs as they stand (finished runs only:
    a benchmark still running, or stopped, gets the report of what it has), judged with the
    tolerances and margins its spec declared (``spec``, else the one logged on its parent run;
    ``margin`` overrides them), and the data-size view where the spec sets ``size_axis``: the one
    rule, for `attent bench` and `attent report` alike. Returns the folder and whether the
    data-size view was written (in its ``data_size/``)."""
    client = MlflowClient(tracking_uri)
    bench = load_benchmark(client, experiment)
    if spec is None:
        spec = (parent_json(client, bench.parent, contract.BENCH_SPEC_FILE) if bench.parent else None) or {}
    declared = {w["name"]: w for w in spec.get("workloads", [])}
    tolerances = {name: w["tolerance"] for name, w in declared.items() if w.get("tolerance") is not None}
    margins = {name: w["margin"] for name, w in declared.items() if w.get("margin") is not None}
    if margin is not None:
        margins = {name: margin for name in bench.runs[WORKLOAD].unique()}
    folder = build_time_to_accuracy_report(
        experiment,
        tracking_uri=client.tracking_uri,
        out_dir=Path(out) / experiment,
        tolerances=tolerances,
        margins=margins,
    )
    size_view = bool(spec.get("size_axis"))
    if size_view:
        build_data_size_report(
            experiment,
            tracking_uri=client.tracking_uri,
            out_dir=folder / "data_size",
            tolerances=tolerances,
            margins=margins,
        )
    return folder, size_view
