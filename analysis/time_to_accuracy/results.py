"""The time-to-accuracy benchmark's numbers from its runs and curves (``runs``): the per-run and
per-method tables against the target, budgets and budget matches, the paired comparisons against
AtteNT and the variants' (judged by ``stats``: Holm-adjusted t-tests, equivalence by TOST), and
the temperature table. ``report`` states the method and builds the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from attent import contract  # the names the engine logs (no engine import)
from attent.analysis.cell_format import percent_cell
from attent.analysis.stats import (
    APART,
    CONTROL,
    COST_TO_TARGET,
    FINAL,
    MATCHED,
    REFERENCE,
    Paired,
    Plateau,
    Target,
    judge_family,
    mean_std,
    numeric,
    seed_pair,
    t_test,
)
from attent.analysis.time_to_accuracy.runs import METHOD
from attent.contract import base_method

LABEL = f"tags.{contract.TAG_LABEL}"
TEMPERATURE = "params.selection.temperature"
FULL, ATTENT, FULL_LONG = contract.METHOD_FULL, contract.METHOD_ATTENT, contract.METHOD_FULL_LONG
EQUAL_COST, EQUAL_SAMPLES = contract.METHOD_FULL_EQUAL_COST, contract.METHOD_FULL_EQUAL_SAMPLES
RANDOM_EQUAL_COST = contract.METHOD_RANDOM_EQUAL_COST
INFOBATCH_BUDGET = contract.METHOD_INFOBATCH_BUDGET
# What the full-data comparators are, in the tables (their tag label is full data's preset's)
COMPARATOR_LABELS = {
    FULL: "full data",
    FULL_LONG: "full data for 2E epochs (plateau control)",
    EQUAL_COST: "full data at equal cost (measured)",
    EQUAL_SAMPLES: "full data at equal samples",
    RANDOM_EQUAL_COST: "Random at equal cost (measured)",
}
TEMPERATURE_ARMS = ("soft", ATTENT)  # base arms whose temperature the report sets side by side
# Row order within a budget match: by base arm (the part before "+"), then by name.
ARM_ORDER = (
    FULL,
    FULL_LONG,
    EQUAL_COST,
    EQUAL_SAMPLES,
    ATTENT,
    "hard",
    "soft",
    "random",
    RANDOM_EQUAL_COST,
    INFOBATCH_BUDGET,
    "infobatch",
)
OVERHEADS = {
    "scoring_s": contract.time_metric("scoring"),
    "selection_s": contract.time_metric("selection"),
    "eval_s": contract.time_metric("eval"),
    "checkpoint_s": contract.time_metric("checkpoint"),
    "startup_s": contract.TIME_STARTUP,
    "teardown_s": contract.TIME_TEARDOWN,
}

BUDGET_TOLERANCE = 0.02  # relative difference of budgets still called matched
# Per-run quantities, summarized per method as <name>, <name>_std and <name>_n.
QUANTITIES = (
    "final_metric",
    "cost_to_target_s",
    "method_cost_s",
    "wallclock_s",
    "samples_backpropagated",
    "budget",
    "mean_selected_ratio",
    "optimizer_steps",
    "ideal_saving",
    "realized_saving",
    "realized_over_ideal",
    "hardness",
    "overlap",
    "agreement",
    "scoring_share",
    *OVERHEADS,
)
INTERVALS = ("realized_saving", "realized_over_ideal")  # also given a 95 % t-interval over seeds


@dataclass
class WorkloadResult:
    """One workload's numbers and verdicts, as the report writes them (``report``)."""

    name: str
    metric: str  # the curve metric (eval_*)
    lower: bool  # lower is better
    plateau: Plateau
    target: Target
    summary: pd.DataFrame  # one row per method
    per_run: pd.DataFrame  # one row per run
    curves: pd.DataFrame  # one row per run and epoch (CURVE_COLUMNS)
    margin: float = math.nan  # the equivalence margin of the final metric
    paired: list[Paired] = field(default_factory=list)  # AtteNT against each method: two families
    temperatures: pd.DataFrame = field(default_factory=pd.DataFrame)
    variants: pd.DataFrame = field(default_factory=pd.DataFrame)  # methods with a "+": their comparisons
    variant_paired: list[Paired] = field(default_factory=list)  # those comparisons: their own family
    choices: list[dict] = field(default_factory=list)  # what the selection stage chose (choices.json)
    verdict: list[str] = field(default_factory=list)
    superseded: int = 0  # older finished runs of the same method and seed, left out
    selection_runs: int = 0  # selection-stage runs, left out


# --- the numbers ------------------------------------------------------------------------------------


def final_metrics(runs: pd.DataFrame, curves: pd.DataFrame, metric: str) -> pd.Series:
    """Each run's final value of the curve metric (its end-of-run metric, else its curve's last
    evaluation), indexed like ``runs``."""
    last_value = curves[curves["value"].notna()].sort_values("epoch").groupby("run_id")["value"].last()
    return numeric(runs, f"metrics.{metric}").fillna(runs["run_id"].map(last_value))


def time_to_target(curve: pd.DataFrame, target: float, lower: bool) -> float:
    """Sustained time to target: the method cost at the first evaluation from which the metric
    stays past ``target`` through the last evaluation (a curve that crosses and falls back has
    not reached it at that crossing); NaN when the last evaluation is short of it. ``curve``:
    ``cost`` (or ``method_cost_s``, cumulative) and ``value`` per epoch, in epoch order."""
    evaluated = curve[curve["value"].notna()]
    cost = evaluated["cost"] if "cost" in evaluated else evaluated["method_cost_s"]
    past = evaluated["value"] <= target if lower else evaluated["value"] >= target
    stays = past[::-1].cummin()[::-1]  # past here and at every later evaluation
    return float(cost[stays].iloc[0]) if stays.any() else math.nan


# --- tables ----------------------------------------------------------------------------------------


def per_run_table(runs: pd.DataFrame, curves: pd.DataFrame, metric: str, target: float, lower: bool) -> pd.DataFrame:
    """One row per run: its final metric, sustained cost to the target, costs, optimiser steps,
    savings against full data of its seed (and their ratio), budget, the mean hardness and
    overlap of its picks over epochs, the agreement of training and scoring losses, and the
    share of its ideal saving (in full data's method cost) that its scoring passes spent."""
    full = runs[runs[METHOD].eq(FULL)].set_index("seed")
    backprop, cost = f"metrics.{contract.SAMPLES_BACKPROPAGATED}", f"metrics.{contract.TIME_METHOD}"

    def of_full(column: str, any_seed: bool = False) -> pd.Series:
        """Full data's value of the run's seed (or, with ``any_seed``, its mean where that seed
        has none)."""
        values = numeric(full, column)
        matched = runs["seed"].map(values).astype(float)
        return matched.fillna(values.mean()) if any_seed else matched

    by_run = curves.groupby("run_id")
    samples = numeric(runs, backprop)
    selected = numeric(runs, f"metrics.{contract.MEAN_SELECTED_RATIO}")
    budget = (samples / of_full(backprop, any_seed=True)).fillna(selected)
    method_cost = numeric(runs, cost)
    ideal = 1 - samples / of_full(backprop)
    realized = 1 - method_cost / of_full(cost)
    reach = [time_to_target(curves[curves["run_id"].eq(r)].sort_values("epoch"), target, lower) for r in runs["run_id"]]
    return pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "method": runs[METHOD],
            "seed": runs["seed"],
            "label": [
                COMPARATOR_LABELS.get(m, label)
                for m, label in zip(runs[METHOD], runs[LABEL] if LABEL in runs else runs[METHOD])
            ],
            "temperature": numeric(runs, TEMPERATURE),
            "final_metric": final_metrics(runs, curves, metric),
            "cost_to_target_s": reach,
            "reached": pd.notna(reach),
            "method_cost_s": method_cost,
            "wallclock_s": numeric(runs, f"metrics.{contract.TIME_WALLCLOCK}"),
            "samples_backpropagated": samples,
            "budget": budget,
            "mean_selected_ratio": selected,
            "optimizer_steps": numeric(runs, f"metrics.{contract.OPTIMIZER_STEPS}"),
            "ideal_saving": ideal,
            "realized_saving": realized,
            "realized_over_ideal": realized / ideal.where(ideal.abs() > 1e-9),
            "hardness": runs["run_id"].map(by_run["hardness"].mean()).astype(float),
            "overlap": runs["run_id"].map(by_run["overlap"].mean()).astype(float),
            "agreement": runs["run_id"].map(by_run["agreement"].mean()).astype(float),
            "scoring_share": numeric(runs, f"metrics.{OVERHEADS['scoring_s']}")
            / (ideal * of_full(cost)).where(ideal > 1e-9),
            **{name: numeric(runs, f"metrics.{m}") for name, m in OVERHEADS.items()},
        }
    ).reset_index(drop=True)


def order_key(method: str) -> tuple[int, str]:
    base = base_method(method)
    return (ARM_ORDER.index(base) if base in ARM_ORDER else len(ARM_ORDER), method)


def summarize(per_run: pd.DataFrame) -> pd.DataFrame:
    """One row per method: mean, std and n of every per-run quantity (realized / ideal saving:
    the mean of the per-seed ratios), a 95 % t-interval over seeds of the realized saving and of
    realized / ideal (``<name>_low``, ``<name>_high``), the seeds that reached the target, and
    its budget match; reference, control, matched, then apart rows."""
    rows = []
    for method, group in per_run.groupby("method", sort=False):
        temperatures = numeric(group, "temperature").dropna().unique()
        row = {
            "method": method,
            "label": group["label"].iloc[0],
            "temperature": float(temperatures[0]) if len(temperatures) == 1 else math.nan,
            "seeds": len(group),
            "reached": int(group["reached"].sum()),
        }
        for column in QUANTITIES:  # numeric: an older report's per_run.csv lacks the newer columns
            row[column], row[column + "_std"], row[column + "_n"] = mean_std(numeric(group, column))
        for column in INTERVALS:
            interval = t_test(numeric(group, column))
            row[column + "_low"], row[column + "_high"] = interval.low, interval.high
        rows.append(row)
    summary = pd.DataFrame(rows)
    summary["budget_match"] = budget_matches(summary)
    summary["matched"] = summary["budget_match"].eq(MATCHED)
    rank = {REFERENCE: 0, CONTROL: 1, MATCHED: 2, APART: 3}
    keys = [(rank[s], *order_key(m)) for s, m in zip(summary["budget_match"], summary["method"])]
    return summary.iloc[sorted(range(len(summary)), key=keys.__getitem__)].reset_index(drop=True)


def attent_budget(summary: pd.DataFrame) -> float:
    budget = summary.loc[summary["method"].eq(ATTENT), "budget"]
    return float(budget.iloc[0]) if len(budget) else math.nan


def budget_matches(summary: pd.DataFrame) -> list[str]:
    """Full data: the reference; full_long: the plateau control; AtteNT and full data at equal
    cost or equal samples and Random at equal cost: matched (by construction); others matched where their budget is within
    BUDGET_TOLERANCE (relative) of AtteNT's, else apart."""
    reference = attent_budget(summary)
    out = []
    for method, budget in zip(summary["method"], summary["budget"]):
        if method == FULL:
            out.append(REFERENCE)
        elif method == FULL_LONG:
            out.append(CONTROL)
        elif method in (ATTENT, EQUAL_COST, EQUAL_SAMPLES, RANDOM_EQUAL_COST):
            out.append(MATCHED)
        else:
            close = abs(budget - reference) <= BUDGET_TOLERANCE * reference  # False for NaN
            out.append(MATCHED if close else APART)
    return out


def apart_note(budget: float, reference: float) -> str:
    """Why a comparison off AtteNT's budget gets no verdict."""
    return f"budget {percent_cell(budget)} of full data's samples against AtteNT's {percent_cell(reference)}"


def paired_comparisons(per_run: pd.DataFrame, summary: pd.DataFrame, lower: bool, margin: float | None) -> list[Paired]:
    """AtteNT against every other method but full_long (the plateau control), seed by seed: the
    final metric, and the cost to reach the target over the seeds where both reached it. Each
    quantity is one family (``judge_family``; the equivalence ``margin`` applies to the final
    metric; no margin is declared for the cost). Rows apart from AtteNT's budget get the numbers
    but no verdict, and are not in the family."""
    attent = per_run[per_run["method"].eq(ATTENT)].set_index("seed")
    if attent.empty:
        return []
    budget_match = dict(zip(summary["method"], summary["budget_match"]))
    reference = attent_budget(summary)
    finals, costs = [], []
    for method in summary["method"]:
        if method in (ATTENT, FULL_LONG):
            continue
        other = per_run[per_run["method"].eq(method)].set_index("seed")
        budget = float(summary.loc[summary["method"].eq(method), "budget"].iloc[0])
        apart = apart_note(budget, reference) if budget_match[method] == APART else ""
        finals.append(
            Paired(
                ATTENT,
                method,
                budget_match[method],
                FINAL,
                *seed_pair(attent, other, "final_metric"),
                "lower" if lower else "higher",
                apart,
            )
        )
        seeds = attent.index.intersection(other.index)
        reached_a, reached_o = attent.loc[seeds, "reached"], other.loc[seeds, "reached"]
        cost = Paired(
            ATTENT,
            method,
            budget_match[method],
            COST_TO_TARGET,
            *seed_pair(attent, other, "cost_to_target_s"),
            "lower",
            apart,
        )
        if not apart and cost.seeds < len(seeds):
            cost.note = (
                f"reached the target: AtteNT {int(reached_a.sum())}/{len(seeds)}, "
                f"{method} {int(reached_o.sum())}/{len(seeds)}"
            )
        costs.append(cost)
    judge_family(finals, margin)
    judge_family(costs, None)
    return [p for pair in zip(finals, costs) for p in pair]


def temperature_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Soft and AtteNT rows (variants included) by temperature, where there are two or more."""
    rows = summary[summary["method"].map(base_method).isin(TEMPERATURE_ARMS) & summary["temperature"].notna()]
    if rows["temperature"].nunique() < 2:
        return pd.DataFrame()
    return rows.sort_values(["temperature", "method"])[
        [
            "method",
            "temperature",
            "hardness",
            "hardness_std",
            "hardness_n",
            "final_metric",
            "final_metric_std",
            "final_metric_n",
            "budget",
            "budget_match",
        ]
    ].reset_index(drop=True)


VARIANT_COMPARATORS = {FULL: FULL, EQUAL_COST: EQUAL_COST, EQUAL_SAMPLES: EQUAL_SAMPLES}  # key -> method


def variant_table(
    per_run: pd.DataFrame, summary: pd.DataFrame, lower: bool, margin: float | None
) -> tuple[pd.DataFrame, list[Paired]]:
    """The variants of a method (names with a "+", e.g. attent+stale): each one's saving, the
    share of it its scoring spent, the agreement of training and scoring losses, and its final
    metric paired, seed by seed, against full data, full data at equal cost and at equal samples
    (those the workload ran) and the method it varies. Those comparisons are one family of their
    own (``judge_family``: Holm across every variant's, the same verdicts). Returns the table (per
    comparator key: ``vs_<key>``, ``_low``, ``_high`` at the Holm step's level, ``_level``,
    ``_n``, ``_verdict``) and the comparisons."""
    by_method = {m: g.set_index("seed") for m, g in per_run.groupby("method", sort=False)}
    budget_match = dict(zip(summary["method"], summary["budget_match"]))
    budget = dict(zip(summary["method"], summary["budget"]))
    variants = [m for m in summary["method"] if "+" in str(m)]
    comparisons: dict[tuple[str, str], Paired] = {}
    for variant in variants:
        apart = apart_note(budget[variant], attent_budget(summary)) if budget_match[variant] == APART else ""
        against = {key: m for key, m in VARIANT_COMPARATORS.items() if m in by_method} | {"base": base_method(variant)}
        for key, method in against.items():
            values = (
                seed_pair(by_method[variant], by_method[method], "final_metric")
                if method in by_method
                else (np.array([]), np.array([]))
            )
            comparisons[variant, key] = Paired(
                variant, method, budget_match[variant], FINAL, *values, "lower" if lower else "higher", apart
            )
    judge_family(list(comparisons.values()), margin)
    rows = []
    for variant in variants:
        row = summary[summary["method"].eq(variant)].iloc[0].to_dict()
        for (name, key), p in comparisons.items():
            if name == variant:
                row.update(
                    {
                        f"vs_{key}": p.mean,
                        f"vs_{key}_low": p.low,
                        f"vs_{key}_high": p.high,
                        f"vs_{key}_level": p.level,
                        f"vs_{key}_n": p.seeds,
                        f"vs_{key}_verdict": p.verdict if p.seeds else "—",
                    }
                )
        rows.append(row)
    return pd.DataFrame(rows), list(comparisons.values())
