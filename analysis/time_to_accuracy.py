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

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from mlflow import MlflowClient

from analysis.render import percent_cell, ratio_cell, stat_cell
from analysis.runs import ReportError
from attent.contract import lower_is_better
from analysis.tta_results import (ALPHA, APART, ATTENT, BETTER, BUDGET_TOLERANCE, COMPARATOR_LABELS, CONTROL,
                                  COST_TO_TARGET, EQUAL_COST, EQUAL_SAMPLES, FINAL, FULL, FULL_LONG,
                                  INCONCLUSIVE, MATCHED, OVERHEADS, PLATEAU_CONFIDENCE, PLATEAUED, STILL_RISING,
                                  WORSE, Paired, Plateau, Target, final_metrics, paired_comparisons, per_run_table,
                                  plateau_of, summarize, target_of, temperature_table, variant_table)
from analysis.tta_runs import CURVE_COLUMNS, CURVE_METRIC, METHOD, WORKLOAD, load_benchmark, load_curves
from attent import contract  # the names the engine logs (no engine import)

STILL_IMPROVING = "full data was still improving: this measures the budget, not the selection"
VARIANT_COLUMNS = {"full": "full data", "full_equal_cost": COMPARATOR_LABELS[EQUAL_COST],
                   "full_equal_samples": COMPARATOR_LABELS[EQUAL_SAMPLES], "base": "its method"}


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
    margin: float = math.nan    # the equivalence margin of the final metric
    paired: list[Paired] = field(default_factory=list)  # AtteNT against each method: two families
    temperatures: pd.DataFrame = field(default_factory=pd.DataFrame)
    variants: pd.DataFrame = field(default_factory=pd.DataFrame)  # methods with a "+": their comparisons
    variant_paired: list[Paired] = field(default_factory=list)    # those comparisons: their own family
    choices: list[dict] = field(default_factory=list)   # what the selection stage chose (choices.json)
    verdict: list[str] = field(default_factory=list)
    superseded: int = 0         # older finished runs of the same method and seed, left out
    selection_runs: int = 0     # selection-stage runs, left out


# --- words -------------------------------------------------------------------------------------------

def named(method: str) -> str:
    """The full-data comparators by what they are, other methods by name."""
    return COMPARATOR_LABELS.get(method, method)


def choice_lines(result: WorkloadResult) -> list[str]:
    """One line per choice the selection stage made on validation, in the order it made them."""
    if not result.choices:
        return ["No choices recorded on the parent run (no selection stage ran, or an older benchmark): "
                "nothing in this workload was chosen on validation by `attent bench`."]
    lines = []
    for c in result.choices:
        scores = ", ".join(f"{value}: {score:.4f}" for value, score in c.get("scores", {}).items())
        seeds = f", seeds {c['seeds']}" if c.get("seeds") else ""
        lines.append(f"{c['key']} = {c['value']} for {c['method']}, by the mean final {c['metric']} over the "
                     f"selection runs{seeds} (per value: {scores})."
                     + (" It is an end of the candidates tried: a value beyond it may do better."
                        if c.get("at_edge") else ""))
    return lines


def plateau_sentence(result: WorkloadResult) -> str:
    p, m = result.plateau, result.metric
    if not p.control:
        return (f"Plateau: {p.verdict} (full data for 2E epochs), so nothing shows that full data had "
                "plateaued at E.")
    if p.reached is None and math.isnan(p.low):
        return f"Plateau: {p.verdict} of {FULL_LONG} and full data (gain {p.mean:+.4f})."
    interval = (f"Plateau control: {FULL_LONG} (2E epochs) − full data, final {m}, signed so that positive is an "
                f"improvement: {p.mean:+.4f}, {PLATEAU_CONFIDENCE:.0%} paired interval [{p.low:+.4f}, "
                f"{p.high:+.4f}] over {p.seeds} seeds, against the tolerance {p.tolerance:.4f}: ")
    if p.verdict == PLATEAUED:
        return interval + "plateaued (its upper end lies below the tolerance)."
    if p.verdict == STILL_RISING:
        return interval + f"**still improving** (its lower end lies above the tolerance): {STILL_IMPROVING}."
    return interval + f"{p.verdict} (the interval contains the tolerance)."


def target_sentence(result: WorkloadResult) -> str:
    t, sign = result.target, "+" if result.lower else "−"
    return (f"Target: {result.metric} {'≤' if result.lower else '≥'} {t.value:.4f} = full data's final value "
            f"{t.reference:.4f} (mean over {t.seeds} seed{'s' if t.seeds != 1 else ''}) {sign} a tolerance of "
            f"{t.tolerance:.4f}, {t.rule}.")


def judged_sentences(paired: list[Paired], subject: str = "AtteNT") -> list[str]:
    """A sentence per comparison that earned better, worse or equivalent; one per quantity
    naming those that are inconclusive."""
    lines, inconclusive = [], {}
    for p in paired:
        if not p.judged:
            continue
        if p.verdict == INCONCLUSIVE:
            inconclusive.setdefault(p.quantity, []).append(named(p.method))
            continue
        d = p.places
        tost = f", TOST p (Holm) = {p.p_tost_holm:.3g}" if p.verdict not in (BETTER, WORSE) else ""
        lines.append(f"{subject} against {named(p.method)}, {p.quantity}: {p.verdict} (difference {p.mean:+.{d}f}, "
                     f"{p.level:.2%} Holm-step interval [{p.low:+.{d}f}, {p.high:+.{d}f}], p (Holm) = "
                     f"{p.p_holm:.3g}{tost}, {p.seeds} seeds).")
    lines += [f"{quantity[0].upper()}{quantity[1:]}, {INCONCLUSIVE}: {subject} against {', '.join(methods)}."
              for quantity, methods in inconclusive.items()]
    return lines


def family_sentence(result: WorkloadResult) -> str:
    sizes = {q: sum(p.judged for p in result.paired if p.quantity == q) for q in (FINAL, COST_TO_TARGET)}
    return (f"Words (AtteNT's): Holm across its {sizes[FINAL]} comparisons of the final metric and, apart, its "
            f"{sizes[COST_TO_TARGET]} of the cost to the target, at {ALPHA}; \"equivalent\" by a paired TOST within "
            f"± {result.margin:.4g} (final metric; no margin is declared for the cost).")


def verdict(result: WorkloadResult) -> list[str]:
    s = result.summary.set_index("method")
    lines = [plateau_sentence(result), target_sentence(result)]
    if ATTENT not in s.index:
        return lines + ["No AtteNT runs: no budget to match, no comparisons."]
    a = s.loc[ATTENT]
    reached = f"AtteNT stays past the target in {a['reached']} of {a['seeds']} seeds"
    if a["reached"]:
        reached += f", from {a['cost_to_target_s']:.1f} s of method cost (mean over those seeds)"
    if FULL in s.index and s.loc[FULL, "reached"]:
        reached += f"; full data from {s.loc[FULL, 'cost_to_target_s']:.1f} s"
    steps = "" if math.isnan(a["optimizer_steps"]) else f", {a['optimizer_steps']:.0f} optimiser steps"
    if steps and FULL in s.index and not math.isnan(s.loc[FULL, "optimizer_steps"]):
        steps += f" (full data {s.loc[FULL, 'optimizer_steps']:.0f})"
    lines.append(f"{reached}. Its budget: {percent_cell(a['budget'])} of full data's samples back-propagated{steps}.")
    matched = s[s["standing"].eq(MATCHED)]
    if len(matched) > 1:
        ordered = matched.sort_values("final_metric", ascending=result.lower)
        lines.append(f"At AtteNT's budget, mean final {result.metric} in order (the words below judge the "
                     "differences): " + ", ".join(f"{m} {v:.4f}" for m, v in ordered["final_metric"].items()) + ".")
    for method, row in s[s["standing"].eq(APART)].iterrows():
        lines.append(f"{method} trained on another budget ({percent_cell(row['budget'])} of full data's samples, "
                     f"AtteNT {percent_cell(a['budget'])}): shown apart, not judged.")
    return lines + [family_sentence(result), *judged_sentences(result.paired)]


# --- tables ------------------------------------------------------------------------------------------

def cell(mean: float, std: float, n: int, places: int) -> str:
    """``mean ± std`` where there are two values or more, the mean alone for one, — for none."""
    return stat_cell(mean, std if n >= 2 else math.nan, places)


def percent_stat(mean: float, std: float, n: int) -> str:
    if n >= 2 and not math.isnan(std) and not math.isnan(mean):
        return f"{mean:.1%} ± {std:.1%}"
    return percent_cell(mean)


def interval_cell(row: dict, key: str, percent: bool) -> str:
    """The mean and its 95 % t-interval over seeds (the mean alone without one)."""
    show = percent_cell if percent else ratio_cell
    mean, low, high = row[key], row[f"{key}_low"], row[f"{key}_high"]
    return show(mean) if math.isnan(low) else f"{show(mean)} [{show(low)}, {show(high)}]"


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
    interval = "" if low != low else f" [{low:+.{places}f}, {high:+.{places}f}] ({row[f'vs_{key}_level']:.2%})"
    return f"{mean:+.{places}f}{interval} {row[f'vs_{key}_verdict']}"


def standing_cell(row: dict) -> str:
    if row["standing"] == APART:
        return f"apart (budget {percent_cell(row['budget'])})"
    return row["standing"]


def markdown(result: WorkloadResult) -> str:
    m = result.metric
    q = lambda r, name, places: cell(r[name], r[name + "_std"], r[name + "_n"], places)  # noqa: E731
    lines = [f"## {result.name}: {m} ({'lower' if result.lower else 'higher'} is better)", "",
             "Chosen on validation by the selection stage:", "", *(f"- {line}" for line in choice_lines(result)), "",
             *(f"- {line}" for line in result.verdict), "",
             f"| method | selection | standing | budget | final {m} | method cost to target (s) | method cost (s) "
             "| wall-clock (s) | optimiser steps | ideal saving | realized saving [95 %] | realized / ideal [95 %] "
             "| hardness |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result.summary.to_dict("records"):
        lines.append(f"| {r['method']} | {r['label']} | {standing_cell(r)} "
                     f"| {percent_stat(r['budget'], r['budget_std'], r['budget_n'])} | {q(r, 'final_metric', 4)} "
                     f"| {reach_cell(r)} | {q(r, 'method_cost_s', 1)} | {q(r, 'wallclock_s', 1)} "
                     f"| {q(r, 'optimizer_steps', 0)} "
                     f"| {percent_stat(r['ideal_saving'], r['ideal_saving_std'], r['ideal_saving_n'])} "
                     f"| {interval_cell(r, 'realized_saving', True)} "
                     f"| {interval_cell(r, 'realized_over_ideal', False)} "
                     f"| {q(r, 'hardness', 2)} |")
    seeds = int(result.summary["seeds"].max())
    lines += ["", f"Up to {seeds} seed{'s' if seeds != 1 else ''} per method; mean ± std over seeds (± std only "
              "where n ≥ 2). Cost to target: sustained (from the first evaluation after which the metric stays past "
              "the target), over the seeds that reach it. Budget: samples back-propagated (padding excluded) over "
              f"full data's; matched: within {BUDGET_TOLERANCE:.0%} of AtteNT's (full data at equal cost and at equal "
              "samples by construction). Savings against full data of the same seed; realized / ideal is the mean "
              "of the per-seed ratios; [95 %]: t-interval over seeds. Hardness: mean over epochs of the pick's "
              "hardness (0 uniform, 1 the top-k)."
              + (f" {result.superseded} older finished run(s) of the same method and seed left out: the latest "
                 "of each counts." if result.superseded else "")
              + (f" {result.selection_runs} selection-stage run(s) left out: they chose on validation, the verdict "
                 "reads verdict-stage runs only." if result.selection_runs else "")]
    if result.paired:
        lines += ["", "Paired against AtteNT (AtteNT's minus the method's over the seeds both ran; the cost to the "
                  "target over the seeds where both reached it). Words from Holm-adjusted paired t-tests within each "
                  f"quantity's family at {ALPHA} (better / worse), else a paired TOST within the margin, "
                  "Holm-adjusted the same way (equivalent), else inconclusive; the interval is the t-interval at the "
                  "comparison's Holm step (the j-th smallest p of m, rejected: 1 − 0.05 / (m − j + 1); not rejected: "
                  "1 − 0.05 / (m − r), the step where Holm stopped after r rejections):", "",
                  "| method | standing | quantity | paired seeds | AtteNT − method | Holm-step interval | p (Holm) "
                  "| TOST p (Holm) | verdict (AtteNT's) |",
                  "|---|---|---|---:|---:|---|---:|---:|---|"]
        for p in result.paired:
            lines.append(f"| {p.method} | {p.standing} | {p.quantity} | {p.seeds} | {signed(p.mean, p.places)} "
                         f"| {interval_text(p)} | {number(p.p_holm)} | {number(p.p_tost_holm)} | {p.verdict} |")
    if not result.temperatures.empty:
        lines += ["", "Temperatures (soft and AtteNT rows):", "",
                  f"| method | temperature | hardness | final {m} | standing |", "|---|---:|---:|---:|---|"]
        for r in result.temperatures.to_dict("records"):
            lines.append(f"| {r['method']} | {r['temperature']:g} | {q(r, 'hardness', 2)} "
                         f"| {q(r, 'final_metric', 4)} | {standing_cell(r)} |")
    if not result.variants.empty:
        keys = [k for k in VARIANT_COLUMNS if f"vs_{k}" in result.variants]
        lines += ["", "Variants (a method's name + what it changes): the saving they realize, the share of the ideal "
                  "saving their scoring spent, and their final metric paired seed by seed against "
                  + ", ".join(VARIANT_COLUMNS[k] for k in keys) + " (the variant's minus the other's, the interval at "
                  "its Holm step and its confidence, the word: Holm within the variants' own family of "
                  f"{sum(p.judged for p in result.variant_paired)} comparisons):", "",
                  "| variant | budget | realized / ideal | scoring / ideal saving | score agreement "
                  f"| final {m} | " + " | ".join(f"− {VARIANT_COLUMNS[k]}" for k in keys) + " |",
                  "|---|---:|---:|---:|---:|---:|" + "---|" * len(keys)]
        for r in result.variants.to_dict("records"):
            lines.append(f"| {r['method']} | {percent_cell(r['budget'])} | {ratio_cell(r['realized_over_ideal'])} "
                         f"| {percent_stat(r['scoring_share'], r['scoring_share_std'], r['scoring_share_n'])} "
                         f"| {q(r, 'agreement', 2)} | {q(r, 'final_metric', 4)} | "
                         + " | ".join(vs_cell(r, key, 4) for key in keys) + " |")
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


def signed(value: float, places: int) -> str:
    return "—" if math.isnan(value) else f"{value:+.{places}f}"


def number(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3g}"


def interval_text(p: Paired) -> str:
    if math.isnan(p.low):
        return "—"
    return f"[{p.low:+.{p.places}f}, {p.high:+.{p.places}f}] ({p.level:.2%})"


# --- the terminal and figures ------------------------------------------------------------------------

def terminal(result: WorkloadResult, width: int = 100) -> str:
    """The workload's verdict and its main table, for a terminal: the sentences wrapped to
    ``width``, the table with the columns a reader compares (final metric and method cost: mean
    ± std over seeds; steps: the optimiser's, mean over seeds; the Markdown file has every
    column)."""
    import textwrap

    from tabulate import tabulate
    m = result.metric
    rows = [[r["method"], r["standing"], percent_cell(r["budget"]),
             cell(r["final_metric"], r["final_metric_std"], r["final_metric_n"], 4),
             cell(r["method_cost_s"], r["method_cost_s_std"], r["method_cost_s_n"], 1),
             cell(r["optimizer_steps"], math.nan, 1, 0),
             ratio_cell(r["realized_over_ideal"])] for r in result.summary.to_dict("records")]
    table = tabulate(rows, headers=["method", "standing", "budget", "final", "cost (s)", "steps", "realized/ideal"],
                     tablefmt="simple", disable_numparse=True)
    sentences = [textwrap.fill(line, width, initial_indent="- ", subsequent_indent="  ") for line in result.verdict]
    return "\n".join([f"{result.name}: {m} ({'lower' if result.lower else 'higher'} is better)", *sentences, "",
                      table])


def figures(result: WorkloadResult) -> dict[str, Figure]:
    """Per workload: the metric against cumulative method cost (mean over seeds per method), the
    final metric against method cost, and, where picks have a hardness, hardness per epoch and
    the final metric against hardness."""
    s = result.summary
    apart = set(s.loc[s["standing"].isin([APART, CONTROL]), "method"])
    standing = dict(zip(s["method"], s["standing"]))
    label = lambda method: f"{method} ({standing[method]})" if method in apart else method  # noqa: E731
    out = {f"{result.name}_curves": curves_figure(result, apart, label),
           f"{result.name}_final_vs_cost": final_vs_cost_figure(result, apart, label)}
    if result.curves["hardness"].notna().any():
        out[f"{result.name}_hardness"] = hardness_figure(result, label)
    return out


# Titles break before "against": a metric's name (eval_gsm8k_test_response_loss) would push a
# one-line title past the figure's edges.
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
           title=f"{result.name}: {result.metric}\nagainst cumulative method cost (mean over seeds)")
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
           title=f"{result.name}: final {result.metric}\nagainst method cost (mean ± std over seeds)")
    ax.legend(fontsize=7)
    figure.tight_layout()
    return figure


def hardness_figure(result: WorkloadResult, label) -> Figure:
    s, m = result.summary, result.metric
    hardness = result.curves[result.curves["hardness"].notna()]
    per_epoch_means = hardness.groupby(["method", "epoch"])["hardness"].mean()  # over seeds
    figure = Figure(figsize=(12, 4.5))
    left, right = figure.subplots(1, 2)
    for number, method in enumerate(s["method"]):
        if method not in per_epoch_means.index.get_level_values("method"):
            continue
        per_epoch = per_epoch_means[method]
        left.plot(per_epoch.index, per_epoch.values, marker="o", ms=3, lw=1.2, color=f"C{number % 10}",
                  label=label(method))
        row = s[s["method"].eq(method)].iloc[0]
        right.errorbar(row["hardness"], row["final_metric"], xerr=error(row["hardness_std"]),
                       yerr=error(row["final_metric_std"]), fmt="o", capsize=3, color=f"C{number % 10}",
                       label=label(method))
    # a random pick is below uniform in some epochs: its hardness is then negative
    bottom = min(-0.05, float(per_epoch_means.min()) - 0.05)
    left.set(xlabel="epoch", ylabel="selection hardness (0 uniform, 1 top-k)", ylim=(bottom, 1.05),
             title=f"{result.name}: selection hardness per epoch\n(mean over seeds)")
    right.set(xlabel="selection hardness, mean over epochs (0 uniform, 1 top-k)", ylabel=f"final {m}",
              title=f"{result.name}: final {m}\nagainst selection hardness")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    figure.tight_layout()
    return figure


def error(std: float) -> float | None:
    return None if std != std else std


# --- the report --------------------------------------------------------------------------------------

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
        margin = (margins or {}).get(workload, target.tolerance)
        per_run = per_run_table(group, mine, metric, target.value, lower)
        summary = summarize(per_run)
        variants, variant_paired = variant_table(per_run, summary, lower, margin)
        result = WorkloadResult(workload, metric, lower, plateau_of(per_run, lower, target.tolerance), target,
                                summary, per_run, mine, margin, paired_comparisons(per_run, summary, lower, margin),
                                temperature_table(summary), variants, variant_paired,
                                [c for c in bench.choices if c.get("workload") == workload])
        result.verdict = verdict(result)
        result.superseded = bench.superseded.get(workload, 0)
        result.selection_runs = bench.selection_runs.get(workload, 0)
        results.append(result)
    return results, bench.parent


def tables(results: list[WorkloadResult]) -> dict[str, pd.DataFrame]:
    """The four CSVs' frames, every workload in each."""
    def stacked(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)

    def context(r: WorkloadResult) -> dict[str, object]:
        return {"workload": r.name, "metric": r.metric, "lower_is_better": r.lower, "target": r.target.value,
                "tolerance": r.target.tolerance, "margin": r.margin}
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
    (out / "figures").mkdir(parents=True, exist_ok=True)
    text = [f"# Time-to-accuracy benchmark: {experiment}", "",
            "Does a selection method reach full data's final metric (less a stated tolerance), and stay there, for "
            "less method cost (training + scoring + selection), at AtteNT's budget, where more epochs no longer help "
            "full data? Verdict-stage runs only; comparisons only between rows of matched budgets; words "
            "(better, worse, equivalent within ± m, inconclusive) from Holm-adjusted intervals only. The method: "
            "`analysis/time_to_accuracy.py`'s docstring. CSVs beside this file: per_run.csv, summary.csv, "
            "paired.csv, curves.csv.", ""]
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
