"""A workload's tables as the report writes them: in Markdown for ``time_to_accuracy.md`` (per
method, paired against AtteNT, temperatures, variants, overheads, after the choices and the
verdict's sentences), and its verdict with the main table for a terminal.
"""

from __future__ import annotations

import math

from attent.analysis.cell_format import MISSING, percent_cell, ratio_cell, stat_cell
from attent.analysis.stats import ALPHA, APART, Paired
from attent.analysis.time_to_accuracy.results import (
    BUDGET_TOLERANCE,
    COMPARATOR_LABELS,
    EQUAL_COST,
    EQUAL_SAMPLES,
    OVERHEADS,
    WorkloadResult,
)
from attent.analysis.time_to_accuracy.verdict import choice_lines

VARIANT_COLUMNS = {
    "full": "full data",
    "full_equal_cost": COMPARATOR_LABELS[EQUAL_COST],
    "full_equal_samples": COMPARATOR_LABELS[EQUAL_SAMPLES],
    "base": "its method",
}


def cell(mean: float, std: float, n: int, places: int) -> str:
    """``mean ± std`` where there are two values or more, the mean alone for one, — for none."""
    return stat_cell(mean, std if n >= 2 else math.nan, places)


def percent_stat(mean: float, std: float, n: int) -> str:
    if n >= 2 and not math.isnan(std) and not math.isnan(mean):
        return f"{mean:.1%} ± {std:.1%}"
    return percent_cell(mean)


def mean_interval_cell(row: dict, key: str, percent: bool) -> str:
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
        return MISSING
    interval = "" if low != low else f" [{low:+.{places}f}, {high:+.{places}f}] ({row[f'vs_{key}_level']:.2%})"
    return f"{mean:+.{places}f}{interval} {row[f'vs_{key}_verdict']}"


def budget_match_cell(row: dict) -> str:
    if row["budget_match"] == APART:
        return f"apart (budget {percent_cell(row['budget'])})"
    return row["budget_match"]


def seed_stat(r: dict, name: str, places: int) -> str:
    """A per-method statistic as mean ± std over its seeds."""
    return cell(r[name], r[name + "_std"], r[name + "_n"], places)


def markdown(result: WorkloadResult) -> str:
    """A workload's section of the report: its choices and verdict, the summary table, then the
    paired comparisons, temperatures, variants and overheads."""
    return "\n".join(
        [
            *summary_lines(result),
            *paired_lines(result),
            *temperature_lines(result),
            *variant_lines(result),
            *overhead_lines(result),
        ]
    )


def summary_lines(result: WorkloadResult) -> list[str]:
    m = result.metric
    q = seed_stat
    lines = [
        f"## {result.name}: {m} ({'lower' if result.lower else 'higher'} is better)",
        "",
        "Chosen on validation by the selection stage:",
        "",
        *(f"- {line}" for line in choice_lines(result)),
        "",
        *(f"- {line}" for line in result.verdict),
        "",
        f"| method | selection | budget match | budget | final {m} | method cost to target (s) | method cost (s) "
        "| wall-clock (s) | optimiser steps | ideal saving | realized saving [95 %] | realized / ideal [95 %] "
        "| hardness |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result.summary.to_dict("records"):
        lines.append(
            f"| {r['method']} | {r['label']} | {budget_match_cell(r)} "
            f"| {percent_stat(r['budget'], r['budget_std'], r['budget_n'])} | {q(r, 'final_metric', 4)} "
            f"| {reach_cell(r)} | {q(r, 'method_cost_s', 1)} | {q(r, 'wallclock_s', 1)} "
            f"| {q(r, 'optimizer_steps', 0)} "
            f"| {percent_stat(r['ideal_saving'], r['ideal_saving_std'], r['ideal_saving_n'])} "
            f"| {mean_interval_cell(r, 'realized_saving', True)} "
            f"| {mean_interval_cell(r, 'realized_over_ideal', False)} "
            f"| {q(r, 'hardness', 2)} |"
        )
    seeds = int(result.summary["seeds"].max())
    lines += [
        "",
        f"Up to {seeds} seed{'s' if seeds != 1 else ''} per method; mean ± std over seeds (± std only "
        "where n ≥ 2). Cost to target: sustained (from the first evaluation after which the metric stays past "
        "the target), over the seeds that reach it. Budget: samples back-propagated (padding excluded) over "
        f"full data's; matched: within {BUDGET_TOLERANCE:.0%} of AtteNT's (full data at equal cost and at equal "
        "samples by construction). Savings against full data of the same seed; realized / ideal is the mean "
        "of the per-seed ratios; [95 %]: t-interval over seeds. Hardness: mean over epochs of the pick's "
        "hardness (0 uniform, 1 the top-k)."
        + (
            f" {result.superseded} older finished run(s) of the same method and seed left out: the latest "
            "of each counts."
            if result.superseded
            else ""
        )
        + (
            f" {result.selection_runs} selection-stage run(s) left out: they chose on validation, the verdict "
            "reads verdict-stage runs only."
            if result.selection_runs
            else ""
        ),
    ]
    return lines


def paired_lines(result: WorkloadResult) -> list[str]:
    if not result.paired:
        return []
    lines = [
        "",
        "Paired against AtteNT (AtteNT's minus the method's over the seeds both ran; the cost to the "
        "target over the seeds where both reached it). Verdicts from Holm-adjusted paired t-tests within each "
        f"quantity's family at {ALPHA} (better / worse), else a paired TOST within the margin, "
        "Holm-adjusted the same way (equivalent), else inconclusive; the interval is the t-interval at the "
        "comparison's Holm step (the j-th smallest p of m, rejected: 1 − 0.05 / (m − j + 1); not rejected: "
        "1 − 0.05 / (m − r), the step where Holm stopped after r rejections):",
        "",
        "| method | budget match | quantity | paired seeds | AtteNT − method | Holm-step interval | p (Holm) "
        "| TOST p (Holm) | verdict (AtteNT's) |",
        "|---|---|---|---:|---:|---|---:|---:|---|",
    ]
    for p in result.paired:
        lines.append(
            f"| {p.method} | {p.budget_match} | {p.quantity} | {p.seeds} | {signed(p.mean, p.places)} "
            f"| {interval_text(p)} | {number(p.p_holm)} | {number(p.p_tost_holm)} | {p.verdict} |"
        )
    return lines


def temperature_lines(result: WorkloadResult) -> list[str]:
    if result.temperatures.empty:
        return []
    m, q = result.metric, seed_stat
    lines = [
        "",
        "Temperatures (soft and AtteNT rows):",
        "",
        f"| method | temperature | hardness | final {m} | budget match |",
        "|---|---:|---:|---:|---|",
    ]
    for r in result.temperatures.to_dict("records"):
        lines.append(
            f"| {r['method']} | {r['temperature']:g} | {q(r, 'hardness', 2)} "
            f"| {q(r, 'final_metric', 4)} | {budget_match_cell(r)} |"
        )
    return lines


def variant_lines(result: WorkloadResult) -> list[str]:
    if result.variants.empty:
        return []
    m, q = result.metric, seed_stat
    keys = [k for k in VARIANT_COLUMNS if f"vs_{k}" in result.variants]
    lines = [
        "",
        "Variants (a method's name + what it changes): the saving they realize, the share of the ideal "
        "saving their scoring spent, and their final metric paired seed by seed against "
        + ", ".join(VARIANT_COLUMNS[k] for k in keys)
        + " (the variant's minus the other's, the interval at "
        "its Holm step and its confidence, the verdict: Holm within the variants' own family of "
        f"{sum(p.judged for p in result.variant_paired)} comparisons):",
        "",
        "| variant | budget | realized / ideal | scoring / ideal saving | score agreement "
        f"| final {m} | " + " | ".join(f"− {VARIANT_COLUMNS[k]}" for k in keys) + " |",
        "|---|---:|---:|---:|---:|---:|" + "---|" * len(keys),
    ]
    for r in result.variants.to_dict("records"):
        lines.append(
            f"| {r['method']} | {percent_cell(r['budget'])} | {ratio_cell(r['realized_over_ideal'])} "
            f"| {percent_stat(r['scoring_share'], r['scoring_share_std'], r['scoring_share_n'])} "
            f"| {q(r, 'agreement', 2)} | {q(r, 'final_metric', 4)} | "
            + " | ".join(vs_cell(r, key, 4) for key in keys)
            + " |"
        )
    return lines


def overhead_lines(result: WorkloadResult) -> list[str]:
    q = seed_stat
    lines = [
        "",
        "Overheads (s, mean over seeds; not in the method cost except scoring and selection); the "
        "share of the ideal saving (in full data's method cost) that scoring spent; the rank correlation "
        "of training-forward and scoring-pass losses of the samples re-scored after training:",
        "",
        "| method | "
        + " | ".join(name.removesuffix("_s") for name in OVERHEADS)
        + " | scoring / ideal saving | score agreement |",
        "|---|" + "---:|" * (len(OVERHEADS) + 2),
    ]
    for r in result.summary.to_dict("records"):
        lines.append(
            f"| {r['method']} | "
            + " | ".join(cell(r[k], math.nan, 1, 1) for k in OVERHEADS)
            + f" | {percent_stat(r['scoring_share'], r['scoring_share_std'], r['scoring_share_n'])} "
            f"| {q(r, 'agreement', 2)} |"
        )
    return lines


def signed(value: float, places: int) -> str:
    return MISSING if math.isnan(value) else f"{value:+.{places}f}"


def number(value: float) -> str:
    return MISSING if math.isnan(value) else f"{value:.3g}"


def interval_text(p: Paired) -> str:
    if math.isnan(p.low):
        return MISSING
    return f"[{p.low:+.{p.places}f}, {p.high:+.{p.places}f}] ({p.level:.2%})"


# --- the terminal -----------------------------------------------------------------------------------


def terminal(result: WorkloadResult, width: int = 100) -> str:
    """The workload's verdict and its main table, for a terminal: the sentences wrapped to
    ``width``, the table with the columns a reader compares (final metric and method cost: mean
    ± std over seeds; steps: the optimiser's, mean over seeds; the budget with its budget match in
    brackets, to fit the width; the Markdown file has every column)."""
    import textwrap

    from tabulate import tabulate

    m = result.metric
    rows = [
        [
            r["method"],
            f"{percent_cell(r['budget'])} ({r['budget_match']})",
            cell(r["final_metric"], r["final_metric_std"], r["final_metric_n"], 4),
            cell(r["method_cost_s"], r["method_cost_s_std"], r["method_cost_s_n"], 1),
            cell(r["optimizer_steps"], math.nan, 1, 0),
            ratio_cell(r["realized_over_ideal"]),
        ]
        for r in result.summary.to_dict("records")
    ]
    table = tabulate(
        rows,
        headers=["method", "budget (match)", "final", "cost (s)", "steps", "realized/ideal"],
        tablefmt="simple",
        disable_numparse=True,
    )
    sentences = [textwrap.fill(line, width, initial_indent="- ", subsequent_indent="  ") for line in result.verdict]
    return "\n".join([f"{result.name}: {m} ({'lower' if result.lower else 'higher'} is better)", *sentences, "", table])
