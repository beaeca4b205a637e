"""The time-to-accuracy benchmark's report, from MLflow alone.

Per workload and method (mean ± std over seeds):
- the final value of the workload's curve metric, and every other final metric (downstream jobs);
- the method cost at which a run first reaches the final metric of the full-data run *of the same
  seed* (paired targets), or "not reached" — read off the per-epoch evaluations, so a run is
  credited at the end of the epoch whose evaluation reaches the target;
- method cost (training + scoring + selection) and wall-clock, each apart; the ideal saving
  (samples back-propagated), the realized saving (method cost) and their ratio;
- the overhead split: scoring, selection, evaluation, checkpoints, start-up, teardown.

Written as Markdown + CSV + figures (final metric against method cost; curves per method) and
logged to the benchmark's parent run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from analysis.runs import ReportError, lower_is_better, runs_frame, search_all_runs  # noqa: E402
from analysis.tables import percent_cell, ratio_cell, stat_cell  # noqa: E402
from attent import contract  # noqa: E402

WORKLOAD = f"tags.{contract.TAG_BENCH_WORKLOAD}"
METHOD = f"tags.{contract.TAG_BENCH_METHOD}"
CURVE_METRIC = f"tags.{contract.TAG_BENCH_METRIC}"
FULL, ATTENT = contract.METHOD_FULL, contract.METHOD_ATTENT  # benchmark methods named like the engine's
OVERHEADS = {"scoring": contract.time_metric("scoring"), "selection": contract.time_metric("selection"),
             "eval": contract.time_metric("eval"), "checkpoint": contract.time_metric("checkpoint"),
             "start-up": contract.TIME_STARTUP, "teardown": contract.TIME_TEARDOWN}


@dataclass
class WorkloadResult:
    name: str
    metric: str                 # the curve metric (eval_*)
    lower: bool                 # lower is better
    summary: pd.DataFrame       # one row per method
    curves: pd.DataFrame        # run_id, method, seed, step, cost, value
    verdict: list[str]


def load_benchmark(client: MlflowClient, experiment: str) -> tuple[pd.DataFrame, str | None]:
    """Finished benchmark runs of ``experiment`` and its parent run id."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ReportError(f"MLflow experiment {experiment!r} does not exist ({client.tracking_uri})")
    found_runs = search_all_runs(client, found.experiment_id)
    frame = runs_frame(found_runs)
    started = {run.info.run_id: run.info.start_time for run in found_runs}
    frame = frame.assign(start_time=frame["run_id"].map(started)).sort_values("start_time", kind="stable")
    role = frame[f"tags.{contract.TAG_ROLE}"]
    parents = frame.loc[role.eq(contract.ROLE_BENCHMARK), "run_id"].tolist()
    if WORKLOAD not in frame:
        raise ReportError(f"experiment {experiment!r} holds no benchmark runs")
    runs = frame[frame[WORKLOAD].notna() & frame["status"].eq("FINISHED")].reset_index(drop=True)
    if runs.empty:
        raise ReportError(f"experiment {experiment!r} has no finished benchmark runs")
    runs["seed"] = pd.to_numeric(runs[f"params.{contract.PARAM_SEED}"])
    return runs, (parents[0] if parents else None)


def load_curves(client: MlflowClient, runs: pd.DataFrame) -> pd.DataFrame:
    """Per run and epoch: the cumulative method cost and the curve metric's value."""
    rows = []
    for run in runs.itertuples():
        record = runs.loc[run.Index]
        values = {m.step: m.value for m in client.get_metric_history(run.run_id, record[CURVE_METRIC])}
        costs = {m.step: m.value for m in client.get_metric_history(run.run_id, contract.TIME_METHOD)}
        for step in sorted(set(values) & set(costs)):
            rows.append((run.run_id, record[METHOD], record["seed"], step, costs[step], values[step]))
    curves = pd.DataFrame(rows, columns=["run_id", "method", "seed", "step", "cost", "value"])
    return curves.drop_duplicates(["run_id", "cost", "value"])  # the final row repeats the last epoch


def time_to_target(curve: pd.DataFrame, target: float, lower: bool) -> float:
    """Method cost at the first evaluation reaching ``target``; NaN when none does."""
    reached = curve["value"] <= target if lower else curve["value"] >= target
    hits = curve.loc[reached, "cost"]
    return float(hits.min()) if not hits.empty else math.nan


def summarize(runs: pd.DataFrame, curves: pd.DataFrame, metric: str, lower: bool) -> pd.DataFrame:
    """One row per method: means and stds over seeds, paired against full data's seeds."""
    final = f"metrics.{metric}"
    full = runs[runs[METHOD].eq(FULL)].set_index("seed")
    if full.empty:
        raise ReportError("the benchmark has no finished full-data run: nothing to compare against")
    def against_full(name: str) -> pd.Series:  # the run's value over full data's of its seed
        column = f"metrics.{name}"
        return runs[column] / runs["seed"].map(full[column])
    per_run = runs.assign(target=runs["seed"].map(full[final]),
                          ideal=1 - against_full(contract.SAMPLES_BACKPROPAGATED),
                          realized=1 - against_full(contract.TIME_METHOD))
    per_run["reach"] = [time_to_target(curves[curves["run_id"].eq(r.run_id)], r.target, lower)
                        if r.target == r.target else math.nan for r in per_run.itertuples()]
    rows = []
    for method, group in per_run.groupby(METHOD, sort=False):
        row = {"method": method, "label": group[f"tags.{contract.TAG_LABEL}"].iloc[0], "seeds": len(group),
               "reached": int(group["reach"].notna().sum())}
        columns = {"final": final, "reach": "reach", "cost": f"metrics.{contract.TIME_METHOD}",
                   "wallclock": f"metrics.{contract.TIME_WALLCLOCK}", "ideal": "ideal", "realized": "realized",
                   **{name: f"metrics.{m}" for name, m in OVERHEADS.items()}}
        columns.update({c.removeprefix("metrics."): c for c in extra_finals(runs, metric)})
        for name, column in columns.items():
            row[name], row[name + "_std"] = mean_std(group[column] if column in group else pd.Series(dtype=float))
        row["efficiency"] = row["realized"] / row["ideal"] if abs(row["ideal"]) > 1e-9 else math.nan
        rows.append(row)
    order = {name: i for i, name in enumerate((FULL, ATTENT, "hard", "soft", "random", "infobatch"))}
    return pd.DataFrame(rows).sort_values("method", key=lambda s: s.map(lambda m: order.get(m, 99)),
                        kind="stable").reset_index(drop=True)


def mean_std(values: pd.Series) -> tuple[float, float]:
    """Mean and sample std (ddof=1) over the seeds that have a value; std 0 for one value."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    return values.mean(), (values.std(ddof=1) if len(values) > 1 else 0.0)


def extra_finals(runs: pd.DataFrame, metric: str) -> list[str]:
    """Other final results the runs logged: downstream jobs' first, then eval_* ones."""
    logged = [c for c in runs.columns if c.startswith("metrics.") and runs[c].notna().any()]
    downstream = sorted(c for c in logged if c.startswith(f"metrics.{contract.DOWNSTREAM_PREFIX}"))
    evals = sorted(c for c in logged if c.startswith(f"metrics.{contract.EVAL_PREFIX}") and c != f"metrics.{metric}")
    return downstream + evals


def verdict(summary: pd.DataFrame, workload: str, metric: str, lower: bool) -> list[str]:
    """Plain sentences: does AtteNT reach full data's final metric in less method time; how it
    ranks against InfoBatch and random at its budget."""
    by = summary.set_index("method")
    if ATTENT not in by.index or FULL not in by.index:
        return [f"{workload}: no AtteNT or no full-data runs, no verdict."]
    a, f = by.loc[ATTENT], by.loc[FULL]
    lines = []
    if a["reached"] == a["seeds"]:
        change = a["reach"] / f["cost"] - 1
        lines.append(f"{workload}: AtteNT reaches the full-data final {metric} in every seed, after "
                     f"{a['reach']:.1f} ± {a['reach_std']:.1f} s of method cost against full data's "
                     f"{f['cost']:.1f} ± {f['cost_std']:.1f} s in all ({change:+.1%}).")
    else:
        lines.append(f"{workload}: AtteNT does not reach the full-data final {metric} in "
                     f"{int(a['seeds'] - a['reached'])} of {int(a['seeds'])} seeds: it ends at "
                     f"{a['final']:.4f} ± {a['final_std']:.4f} against {f['final']:.4f} ± {f['final_std']:.4f}, "
                     f"for {a['cost']:.1f} s of method cost against {f['cost']:.1f} s ({a['cost'] / f['cost'] - 1:+.1%}).")
    peers = by.loc[[m for m in by.index if m != FULL]]
    ranked = peers.sort_values("final", ascending=lower)
    places = ", ".join(f"{m} {v:.4f}" for m, v in ranked["final"].items())
    lines.append(f"{workload}: final {metric} ({'lower' if lower else 'higher'} is better), best first: {places}.")
    return lines


def figures(result: WorkloadResult) -> dict[str, plt.Figure]:
    s, name = result.summary, result.name
    scatter, ax = plt.subplots(figsize=(6, 4))
    for row in s.itertuples():
        ax.errorbar(row.cost, row.final, xerr=row.cost_std, yerr=row.final_std, fmt="o", capsize=3, label=row.method)
    ax.set(xlabel="method cost (s): training + scoring + selection", ylabel=result.metric,
           title=f"{name}: final {result.metric} against method cost")
    ax.legend(fontsize=8)
    scatter.tight_layout()
    curves, ax = plt.subplots(figsize=(6, 4))
    for number, (method, group) in enumerate(result.curves.groupby("method", sort=False)):
        for i, (_, run) in enumerate(group.groupby("run_id")):
            ax.plot(run["cost"], run["value"], color=f"C{number}", alpha=0.8, lw=1,
                    label=method if i == 0 else None)
    ax.set(xlabel="cumulative method cost (s)", ylabel=result.metric, title=f"{name}: {result.metric} per epoch")
    ax.legend(fontsize=8)
    curves.tight_layout()
    return {f"{name}_final_vs_cost": scatter, f"{name}_curves": curves}


def markdown(result: WorkloadResult) -> str:
    m, places = result.metric, 4
    lines = [f"### {result.name}: {m} ({'lower' if result.lower else 'higher'} is better)", "",
             f"| method | selection | final {m} | time to full data's final (s) | method cost (s) | wall-clock (s) "
             "| ideal saving | realized saving | realized / ideal |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result.summary.itertuples():
        reach = stat_cell(r.reach, r.reach_std, 1) if r.reached == r.seeds else \
            ("not reached" if r.reached == 0 else f"{stat_cell(r.reach, r.reach_std, 1)} ({r.reached}/{r.seeds} seeds; rest not reached)")
        lines.append(f"| {r.method} | {r.label} | {stat_cell(r.final, r.final_std, places)} | {reach} | "
                     f"{stat_cell(r.cost, r.cost_std, 1)} | {stat_cell(r.wallclock, r.wallclock_std, 1)} | {percent_cell(r.ideal)} | "
                     f"{percent_cell(r.realized)} | {ratio_cell(r.efficiency)} |")
    lines += ["", "Overheads (s, mean over seeds): " + "; ".join(OVERHEADS), "",
              "| method | " + " | ".join(OVERHEADS) + " |", "|---|" + "---:|" * len(OVERHEADS)]
    for r in result.summary.to_dict("records"):
        lines.append(f"| {r['method']} | " + " | ".join(f"{r[k]:.1f}" for k in OVERHEADS) + " |")
    extras = [c for c in result.summary.columns if c.startswith((contract.DOWNSTREAM_PREFIX, contract.EVAL_PREFIX))
              and not c.endswith("_std")]
    if extras:
        lines += ["", "| method | " + " | ".join(extras) + " |", "|---|" + "---:|" * len(extras)]
        for r in result.summary.to_dict("records"):
            lines.append(f"| {r['method']} | " + " | ".join(stat_cell(r[c], r[c + '_std'], 4) for c in extras) + " |")
    return "\n".join(lines + ["", *(f"- {line}" for line in result.verdict)])


def analyse(client: MlflowClient, experiment: str) -> tuple[list[WorkloadResult], str | None]:
    runs, parent = load_benchmark(client, experiment)
    curves = load_curves(client, runs)
    results = []
    for workload, group in runs.groupby(WORKLOAD, sort=False):
        metric = str(group[CURVE_METRIC].iloc[0]).removeprefix("metrics.")
        lower = lower_is_better(metric)
        summary = summarize(group.reset_index(drop=True), curves, metric, lower)
        results.append(WorkloadResult(workload, metric, lower, summary,
                                      curves[curves["run_id"].isin(group["run_id"])],
                                      verdict(summary, workload, metric, lower)))
    return results, parent


def build_time_to_accuracy_report(experiment: str, *, tracking_uri: str, out_dir: str | Path) -> Path:
    """Markdown, CSV and figures in ``out_dir``, also logged to the parent run; returns the folder."""
    client = MlflowClient(tracking_uri)
    results, parent = analyse(client, experiment)
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    text = [f"# Time-to-accuracy benchmark: {experiment}", ""]
    for result in results:
        text += [markdown(result), ""]
        result.summary.assign(workload=result.name, metric=result.metric).to_csv(out / f"{result.name}.csv", index=False)
        for name, figure in figures(result).items():
            figure.savefig(out / "figures" / f"{name}.png", dpi=110)
            plt.close(figure)
    (out / "time_to_accuracy.md").write_text("\n".join(text))
    print("\n".join(text), flush=True)
    if parent:
        client.log_artifacts(parent, str(out), "report")
        client.set_terminated(parent, "FINISHED")
    return out
