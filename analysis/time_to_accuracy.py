"""The time-to-accuracy benchmark's report, from MLflow alone: does a selection method reach full
data's accuracy for less method cost, in the regime where that claim applies?

Per workload:

- **The regime.** Full data must have plateaued: over the last quarter of its epochs its curve
  metric (mean over seeds) moves in the direction of improvement by less than the seed standard
  deviation of its final value. Otherwise the report says plainly that full data was still
  improving, and that the comparison measures the budget, not the selection.
- **The target** is full data's plateau (the mean over seeds of its last-quarter evaluations)
  less a stated tolerance: for a higher-is-better metric the larger of 0.005 (half a point of
  accuracy) and that seed standard deviation; for a lower-is-better one the larger of 1 % of the
  plateau and the seed standard deviation (it is then added, not taken off).
- **Per method** (mean ± std over seeds; "± std" only where n >= 2): the final metric, the method
  cost (training + scoring + selection) at its first evaluation that reaches the target, the
  method cost and wall-clock in all, the ideal saving (1 − samples back-propagated / full data's
  of the same seed), the realized saving (1 − method cost / full data's of the same seed), their
  ratio, the budget (samples back-propagated / full data's; the mean selected ratio where those
  are missing) and how hard its picks were (mean over epochs of ``selection_hardness``: 0 for
  uniform picks, 1 for the k highest scores).
- **Budgets.** Rows whose budget lies within 2 % (relative) of AtteNT's are matched; full data at
  equal cost is matched by construction (its epochs are AtteNT's mean selected ratio × E).
  Rankings and "better" are said only among matched rows; other rows stand apart, labelled with
  their budget. Full data is the reference the target comes from.
- **Paired verdicts.** Each method against AtteNT, over the seeds both ran: the mean difference
  (AtteNT's minus the method's) of the final metric and of the method cost to reach the target,
  with a 95 % Student-t interval, and "AtteNT better", "AtteNT worse" or "indistinguishable at
  95 %" (no interval for one paired seed).
- **Temperatures.** Soft and AtteNT rows that differ in ``selection.temperature`` (e.g. methods
  ``soft+T0.1``, ``soft+T1``): temperature, hardness and final metric side by side.

Written as ``time_to_accuracy.md``, four CSVs (``per_run.csv``, ``summary.csv``, ``paired.csv``,
``curves.csv``; every workload in each, a ``workload`` column tells them apart) and figures per
workload (the metric against cumulative method cost, the final metric against method cost, and
the hardness of the picks), all logged to the benchmark's parent run under ``report/``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from mlflow import MlflowClient

from analysis.render import percent_cell, ratio_cell, stat_cell
from analysis.runs import ReportError, lower_is_better
from analysis.tta_results import (APART, ATTENT, BUDGET_TOLERANCE, FULL, MATCHED, OVERHEADS, Paired, Plateau,
                                  Target, paired_comparisons, per_run_table, plateau_of, summarize, target_of,
                                  temperature_table, variant_table)
from analysis.tta_runs import CURVE_COLUMNS, CURVE_METRIC, EPOCHS, METHOD, WORKLOAD, load_benchmark, load_curves
from attent import contract  # the names the engine logs (no engine import)

STILL_IMPROVING = "full data was still improving: this measures the budget, not the selection"


@dataclass
class WorkloadResult:
    name: str
    metric: str                 # the curve metric (eval_*)
    lower: bool                 # lower is better
    plateau: Plateau
    target: Target
    summary: pd.DataFrame       # one row per method
    per_run: pd.DataFrame       # one row per run
    curves: pd.DataFrame        # one row per run and epoch (CURVE_COLUMNS)
    paired: list[Paired] = field(default_factory=list)
    temperatures: pd.DataFrame = field(default_factory=pd.DataFrame)
    variants: pd.DataFrame = field(default_factory=pd.DataFrame)  # methods with a "+": against full data
    verdict: list[str] = field(default_factory=list)
    superseded: int = 0         # older finished runs of the same method and seed, left out


# --- words -------------------------------------------------------------------------------------------

def plateau_sentence(result: WorkloadResult) -> str:
    p, m = result.plateau, result.metric
    a, b = p.epochs
    quarter = f"epoch {b}" if a == b else f"epochs {a}–{b}"
    moved = (f"over its last quarter ({quarter}; measured from epoch {p.since} to {b}) its mean {m} "
             f"moved by {p.movement:+.4f} in the direction of improvement")
    if p.reached is None:
        return f"Full data: {moved}; one seed, so no seed spread to judge a plateau by."
    if p.reached:
        return f"Full data had plateaued: {moved}, less than the seed std of its final value, {p.seed_std:.4f}."
    return (f"**{STILL_IMPROVING[0].upper()}{STILL_IMPROVING[1:]}.** {moved[0].upper()}{moved[1:]}, not less than "
            f"the seed std of its final value, {p.seed_std:.4f}.")


def target_sentence(result: WorkloadResult) -> str:
    t, sign = result.target, "+" if result.lower else "−"
    return (f"Target: {result.metric} {'≤' if result.lower else '≥'} {t.value:.4f} = full data's plateau "
            f"{result.plateau.value:.4f} (mean over seeds of its last-quarter evaluations) {sign} a tolerance of "
            f"{t.tolerance:.4f}, {t.rule}.")


def verdict(result: WorkloadResult) -> list[str]:
    s = result.summary.set_index("method")
    lines = [plateau_sentence(result), target_sentence(result)]
    if ATTENT not in s.index:
        return lines + ["No AtteNT runs: no budget to match, no rankings, no paired verdicts."]
    a = s.loc[ATTENT]
    reached = f"AtteNT reaches the target in {a['reached']} of {a['seeds']} seeds"
    if a["reached"]:
        reached += f", after {a['cost_to_target_s']:.1f} s of method cost (mean over those seeds)"
    if FULL in s.index and s.loc[FULL, "reached"]:
        reached += f"; full data after {s.loc[FULL, 'cost_to_target_s']:.1f} s"
    lines.append(f"{reached}. Its budget: {percent_cell(a['budget'])} of full data's samples back-propagated.")
    matched = s[s["standing"].eq(MATCHED)]
    if len(matched) > 1:
        ranked = matched.sort_values("final_metric", ascending=result.lower)
        lines.append(f"At AtteNT's budget, final {result.metric}, best first: "
                     + ", ".join(f"{m} {v:.4f}" for m, v in ranked["final_metric"].items()) + ".")
        every = matched[matched["reached"].eq(matched["seeds"])].sort_values("cost_to_target_s")
        if len(every):
            lines.append("At AtteNT's budget, method cost to the target (rows reaching it in every seed), "
                         "cheapest first: " + ", ".join(f"{m} {v:.1f} s" for m, v in every["cost_to_target_s"].items())
                         + ".")
    for method, row in s[s["standing"].eq(APART)].iterrows():
        lines.append(f"{method} trained on another budget ({percent_cell(row['budget'])} of full data's samples, "
                     f"AtteNT {percent_cell(a['budget'])}): shown apart, not ranked.")
    judged = [p for p in result.paired if p.standing != APART and p.verdict in ("AtteNT better", "AtteNT worse")]
    for p in judged:
        d = p.places
        lines.append(f"AtteNT against {p.method}, {p.quantity}: {p.verdict} at 95 % "
                     f"(difference {p.mean:+.{d}f}, [{p.low:+.{d}f}, {p.high:+.{d}f}], {p.seeds} seeds).")
    return lines


def cell(mean: float, std: float, n: int, places: int) -> str:
    """``mean ± std`` where there are two values or more, the mean alone for one, — for none."""
    return stat_cell(mean, std if n >= 2 else math.nan, places)


def percent_stat(mean: float, std: float, n: int) -> str:
    if n >= 2 and not math.isnan(std) and not math.isnan(mean):
        return f"{mean:.1%} ± {std:.1%}"
    return percent_cell(mean)


def reach_cell(row: dict) -> str:
    if row["reached"] == 0:
        return "not reached"
    value = cell(row["cost_to_target_s"], row["cost_to_target_s_std"], row["cost_to_target_s_n"], 1)
    if row["reached"] == row["seeds"]:
        return value
    return f"{value} ({row['reached']}/{row['seeds']} seeds; rest not reached)"


def vs_cell(row: dict, key: str, places: int) -> str:
    mean, low, high = row.get(f"vs_{key}"), row.get(f"vs_{key}_low"), row.get(f"vs_{key}_high")
    if mean is None or mean != mean:
        return "—"
    interval = "" if low != low else f" [{low:+.{places}f}, {high:+.{places}f}]"
    return f"{mean:+.{places}f}{interval} {row[f'vs_{key}_verdict']}"


def standing_cell(row: dict) -> str:
    if row["standing"] == APART:
        return f"apart (budget {percent_cell(row['budget'])})"
    return row["standing"]


def markdown(result: WorkloadResult) -> str:
    m = result.metric
    q = lambda r, name, places: cell(r[name], r[name + "_std"], r[name + "_n"], places)  # noqa: E731
    lines = [f"## {result.name}: {m} ({'lower' if result.lower else 'higher'} is better)", "",
             *(f"- {line}" for line in result.verdict), "",
             f"| method | selection | standing | budget | final {m} | method cost to target (s) | method cost (s) "
             "| wall-clock (s) | ideal saving | realized saving | realized / ideal | hardness |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result.summary.to_dict("records"):
        lines.append(f"| {r['method']} | {r['label']} | {standing_cell(r)} "
                     f"| {percent_stat(r['budget'], r['budget_std'], r['budget_n'])} | {q(r, 'final_metric', 4)} "
                     f"| {reach_cell(r)} | {q(r, 'method_cost_s', 1)} | {q(r, 'wallclock_s', 1)} "
                     f"| {percent_stat(r['ideal_saving'], r['ideal_saving_std'], r['ideal_saving_n'])} "
                     f"| {percent_stat(r['realized_saving'], r['realized_saving_std'], r['realized_saving_n'])} "
                     f"| {ratio_cell(r['realized_over_ideal'])} | {q(r, 'hardness', 2)} |")
    seeds = int(result.summary["seeds"].max())
    lines += ["", f"Up to {seeds} seed{'s' if seeds != 1 else ''} per method; mean ± std over seeds (± std only "
              "where n ≥ 2). Budget: samples back-propagated (padding excluded) over full data's; matched: within "
              f"{BUDGET_TOLERANCE:.0%} of AtteNT's (full data at equal cost by construction). Savings against full "
              "data of the same seed; realized / ideal is the ratio of the two means. Hardness: mean over epochs of "
              "the pick's hardness (0 uniform, 1 the top-k)."
              + (f" {result.superseded} older finished run(s) of the same method and seed left out: the latest "
                 "of each counts." if result.superseded else "")]
    if result.paired:
        lines += ["", "Paired against AtteNT (AtteNT's minus the method's over the seeds both ran; the cost to the "
                  "target over the seeds where both reached it), 95 % Student-t interval:", "",
                  "| method | standing | quantity | paired seeds | AtteNT − method | 95 % interval | verdict |",
                  "|---|---|---|---:|---:|---|---|"]
        for p in result.paired:
            places = p.places
            interval = "—" if math.isnan(p.low) else f"[{p.low:+.{places}f}, {p.high:+.{places}f}]"
            mean = "—" if math.isnan(p.mean) else f"{p.mean:+.{places}f}"
            lines.append(f"| {p.method} | {p.standing} | {p.quantity} | {p.seeds} | {mean} | {interval} "
                         f"| {p.verdict} |")
    if not result.temperatures.empty:
        lines += ["", "Temperatures (soft and AtteNT rows):", "",
                  f"| method | temperature | hardness | final {m} | standing |", "|---|---:|---:|---:|---|"]
        for r in result.temperatures.to_dict("records"):
            lines.append(f"| {r['method']} | {r['temperature']:g} | {q(r, 'hardness', 2)} "
                         f"| {q(r, 'final_metric', 4)} | {standing_cell(r)} |")
    if not result.variants.empty:
        lines += ["", "Variants (a method's name + what it changes): the saving they realize, the share of the ideal "
                  "saving their scoring spent, and their final metric paired seed by seed against full data, full "
                  "data at equal cost and the method they vary (difference, 95 % t interval, verdict):", "",
                  "| variant | budget | realized / ideal | scoring / ideal saving | score agreement "
                  f"| final {m} | − full data | − full data at equal cost | − its method |",
                  "|---|---:|---:|---:|---:|---:|---|---|---|"]
        for r in result.variants.to_dict("records"):
            vs = [vs_cell(r, key, 4) for key in ("full", "full_equal_cost", "base")]
            lines.append(f"| {r['method']} | {percent_cell(r['budget'])} | {ratio_cell(r['realized_over_ideal'])} "
                         f"| {percent_stat(r['scoring_share'], r['scoring_share_std'], r['scoring_share_n'])} "
                         f"| {q(r, 'agreement', 2)} | {q(r, 'final_metric', 4)} | " + " | ".join(vs) + " |")
    lines += ["", "Overheads (s, mean over seeds; not in the method cost except scoring and selection); the "
              "share of the ideal saving (in full data's method cost) that scoring spent; the rank correlation "
              "of training-forward and scoring-pass losses of the samples re-scored after training:", "",
              "| method | " + " | ".join(name.removesuffix("_s") for name in OVERHEADS)
              + " | scoring / ideal saving | score agreement |",
              "|---|" + "---:|" * (len(OVERHEADS) + 2)]
    for r in result.summary.to_dict("records"):
        lines.append(f"| {r['method']} | " + " | ".join(cell(r[k], math.nan, 1, 1) for k in OVERHEADS)
                     + f" | {percent_stat(r['scoring_share'], r['scoring_share_std'], r['scoring_share_n'])} "
                     f"| {q(r, 'agreement', 2)} |")
    return "\n".join(lines)


# --- figures -----------------------------------------------------------------------------------------

def terminal(result: WorkloadResult, width: int = 100) -> str:
    """The workload's verdict and its main table, for a terminal: the sentences wrapped to
    ``width``, the table with the columns a reader compares (the Markdown file has them all)."""
    import textwrap

    from tabulate import tabulate
    m = result.metric
    rows = [[r["method"], r["standing"], percent_cell(r["budget"]),
             cell(r["final_metric"], r["final_metric_std"], r["final_metric_n"], 4),
             cell(r["method_cost_s"], r["method_cost_s_std"], r["method_cost_s_n"], 1),
             ratio_cell(r["realized_over_ideal"])] for r in result.summary.to_dict("records")]
    table = tabulate(rows, headers=["method", "standing", "budget", "final (mean ± std)", "method cost (s)",
                                    "realized / ideal"], tablefmt="simple", disable_numparse=True)
    sentences = [textwrap.fill(line, width, initial_indent="- ", subsequent_indent="  ") for line in result.verdict]
    return "\n".join([f"{result.name}: {m} ({'lower' if result.lower else 'higher'} is better)", *sentences, "",
                      table])


def figures(result: WorkloadResult) -> dict[str, Figure]:
    """Per workload: the metric against cumulative method cost (mean over seeds per method), the
    final metric against method cost, and, where picks have a hardness, hardness per epoch and
    the final metric against hardness."""
    s = result.summary
    apart = set(s.loc[s["standing"].eq(APART), "method"])
    label = lambda method: f"{method} (apart)" if method in apart else method  # noqa: E731
    out = {f"{result.name}_curves": curves_figure(result, apart, label),
           f"{result.name}_final_vs_cost": final_vs_cost_figure(result, apart, label)}
    if result.curves["hardness"].notna().any():
        out[f"{result.name}_hardness"] = hardness_figure(result, label)
    return out


def curves_figure(result: WorkloadResult, apart: set[str], label) -> Figure:
    figure = Figure(figsize=(7, 4.5))
    ax = figure.subplots()
    evaluated = result.curves[result.curves["value"].notna()]
    for number, method in enumerate(result.summary["method"]):
        mine = evaluated[evaluated["method"].eq(method)]
        if mine.empty:
            continue
        mean = mine.groupby("epoch")[["method_cost_s", "value"]].mean()
        ax.plot(mean["method_cost_s"], mean["value"], marker="o", ms=3, lw=1.2, color=f"C{number % 10}",
                ls=":" if method in apart else "-", label=label(method))
    ax.axhline(result.target.value, color="grey", ls="--", lw=1, label=f"target {result.target.value:.4f}")
    ax.set(xlabel="cumulative method cost (s): training + scoring + selection", ylabel=result.metric,
           title=f"{result.name}: {result.metric} against cumulative method cost (mean over seeds)")
    ax.legend(fontsize=7)
    figure.tight_layout()
    return figure


def final_vs_cost_figure(result: WorkloadResult, apart: set[str], label) -> Figure:
    figure = Figure(figsize=(7, 4.5))
    ax = figure.subplots()
    for number, row in enumerate(result.summary.to_dict("records")):
        ax.errorbar(row["method_cost_s"], row["final_metric"], xerr=error(row["method_cost_s_std"]),
                    yerr=error(row["final_metric_std"]), fmt="o", mfc="none" if row["method"] in apart else None,
                    capsize=3, color=f"C{number % 10}", label=label(row["method"]))
    ax.axhline(result.target.value, color="grey", ls="--", lw=1, label=f"target {result.target.value:.4f}")
    ax.set(xlabel="method cost (s): training + scoring + selection", ylabel=f"final {result.metric}",
           title=f"{result.name}: final {result.metric} against method cost (mean ± std over seeds)")
    ax.legend(fontsize=7)
    figure.tight_layout()
    return figure


def hardness_figure(result: WorkloadResult, label) -> Figure:
    s, m = result.summary, result.metric
    hardness = result.curves[result.curves["hardness"].notna()]
    figure = Figure(figsize=(12, 4.5))
    left, right = figure.subplots(1, 2)
    for number, method in enumerate(s["method"]):
        mine = hardness[hardness["method"].eq(method)]
        if mine.empty:
            continue
        per_epoch = mine.groupby("epoch")["hardness"].mean()
        left.plot(per_epoch.index, per_epoch.values, marker="o", ms=3, lw=1.2, color=f"C{number % 10}",
                  label=label(method))
        row = s[s["method"].eq(method)].iloc[0]
        right.errorbar(row["hardness"], row["final_metric"], xerr=error(row["hardness_std"]),
                       yerr=error(row["final_metric_std"]), fmt="o", capsize=3, color=f"C{number % 10}",
                       label=label(method))
    left.set(xlabel="epoch", ylabel="selection hardness (0 uniform, 1 top-k)", ylim=(-0.05, 1.05),
             title=f"{result.name}: selection hardness per epoch (mean over seeds)")
    right.set(xlabel="selection hardness, mean over epochs (0 uniform, 1 top-k)", ylabel=f"final {m}",
              title=f"{result.name}: final {m} against selection hardness")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    figure.tight_layout()
    return figure


def error(std: float) -> float | None:
    return None if std != std else std


# --- the report --------------------------------------------------------------------------------------

def analyse(client: MlflowClient, experiment: str, tolerances: dict[str, float] | None = None
            ) -> tuple[list[WorkloadResult], str | None]:
    """One result per workload (in the order they ran) and the parent run id."""
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
        full = mine[mine["method"].eq(FULL)]
        if full.empty:
            raise ReportError(f"workload {workload!r} has no finished full-data run: nothing to compare against")
        epochs = pd.to_numeric(group.loc[group[METHOD].eq(FULL), EPOCHS], errors="coerce").max() \
            if EPOCHS in group else math.nan
        plateau = plateau_of(full, lower, int(epochs) if epochs == epochs else None)
        target = target_of(plateau, lower, (tolerances or {}).get(workload))
        per_run = per_run_table(group, mine, metric, target.value, lower)
        summary = summarize(per_run)
        result = WorkloadResult(workload, metric, lower, plateau, target, summary, per_run, mine,
                                paired_comparisons(per_run, summary, lower), temperature_table(summary),
                                variant_table(per_run, summary, lower))
        result.verdict = verdict(result)
        result.superseded = bench.superseded.get(workload, 0)
        results.append(result)
    return results, bench.parent


def tables(results: list[WorkloadResult]) -> dict[str, pd.DataFrame]:
    """The four CSVs' frames, every workload in each."""
    def stacked(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)

    def context(r: WorkloadResult) -> dict[str, object]:
        return {"workload": r.name, "metric": r.metric, "lower_is_better": r.lower, "target": r.target.value,
                "tolerance": r.target.tolerance}
    per_run = stacked([pd.concat([pd.DataFrame(context(r), index=r.per_run.index), r.per_run], axis=1)
                       for r in results], ["workload"])
    summary = stacked([pd.concat([pd.DataFrame({**context(r), "plateau": r.plateau.value,
                                                "plateau_movement": r.plateau.movement,
                                                "plateau_seed_std": r.plateau.seed_std,
                                                "plateaued": r.plateau.reached}, index=r.summary.index),
                                  r.summary], axis=1) for r in results], ["workload"])
    paired = stacked([pd.DataFrame([{"workload": r.name, "metric": r.metric, **p.record()} for p in r.paired])
                      for r in results], ["workload", "method", "quantity", "verdict"])
    curves = stacked([r.curves for r in results], CURVE_COLUMNS)
    return {"per_run": per_run, "summary": summary, "paired": paired, "curves": curves}


def build_time_to_accuracy_report(experiment: str, *, tracking_uri: str, out_dir: str | Path,
                                  tolerances: dict[str, float] | None = None) -> Path:
    """Markdown, CSVs and figures in ``out_dir``, also logged to the parent run (under
    ``report/``, which is then marked FINISHED); returns the folder. ``tolerances``: workload ->
    the target's tolerance, instead of the defaults."""
    client = MlflowClient(tracking_uri)
    results, parent = analyse(client, experiment, tolerances)
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    text = [f"# Time-to-accuracy benchmark: {experiment}", "",
            "Does a selection method reach full data's plateau (less a stated tolerance) for less method "
            "cost (training + scoring + selection), at AtteNT's budget? Rankings and verdicts only between "
            "rows of matched budgets. CSVs beside this file: per_run.csv, summary.csv, paired.csv, curves.csv.", ""]
    for result in results:
        text += [markdown(result), ""]
        for name, figure in figures(result).items():
            figure.savefig(out / "figures" / f"{name}.png", dpi=110)
            text += [f"![{name}](figures/{name}.png)", ""]
    for name, frame in tables(results).items():
        frame.to_csv(out / f"{name}.csv", index=False)
    (out / "time_to_accuracy.md").write_text("\n".join(text) + "\n")
    import shutil
    width = min(120, shutil.get_terminal_size().columns)
    print("\n\n".join(terminal(result, width) for result in results), flush=True)
    if parent:
        client.log_artifacts(parent, str(out), "report")
        client.set_terminated(parent, "FINISHED")
    return out
