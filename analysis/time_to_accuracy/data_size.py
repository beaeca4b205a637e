"""How the answer moves with data size: the time-to-accuracy report's verdicts for one workload
per training-set size, side by side.

Per size (the runs' ``task.train_limit``): full data's plateau verdict (its 2E control) and the
seeds it paired, and AtteNT's final metric (and, within one benchmark, its cost to the target)
against Random at its budget, full data, and full data at equal measured cost, each as the
seed-paired difference with its interval at the Holm step's level and the report's verdict;
AtteNT's realized saving and realized / ideal with their 95 % seed intervals. Data-pruning theory
(Sorscher et al., 2022) predicts that keeping hard examples pays only where data is abundant: the
figure reads that prediction off the sizes measured, and ``data_size_trend.size_trends`` tests
it: whether each of AtteNT's differences moves with the size at all.

A benchmark whose spec sets ``size_axis`` gets this view beside its report
(``build_data_size_report``, from MLflow); sizes and seeds measured by several benchmarks are
joined into one view by ``attent report --with`` (``data_size_joined``). Both write it with
``write_size_view``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from attent import contract
from attent.analysis.mlflow_runs import REPORT_ARTIFACTS
from attent.analysis.stats import COST_TO_TARGET, FINAL, Paired, Plateau
from attent.analysis.time_to_accuracy.data_size_trend import AGAINST, TREND_HEADING, size_trends, trend_markdown
from attent.analysis.time_to_accuracy.judge import analyse
from attent.analysis.time_to_accuracy.results import ATTENT
from attent.analysis.time_to_accuracy.runs import WORKLOAD, load_benchmark
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from mlflow import MlflowClient

TRAIN_LIMIT = "params.task.train_limit"


def comparison_cells(paired: Paired) -> dict[str, object]:
    """One of AtteNT's comparisons as the size table's columns: ``final_vs_<method>`` (or
    ``cost_vs_``), the difference, and its ``_low``, ``_high``, ``_level``, ``_seeds`` and ``_verdict``."""
    key = f"{'final' if paired.quantity == FINAL else 'cost'}_vs_{paired.method}"
    return {
        key: paired.mean,
        f"{key}_low": paired.low,
        f"{key}_high": paired.high,
        f"{key}_level": paired.level,
        f"{key}_seeds": paired.seeds,
        f"{key}_verdict": paired.verdict,
    }


def workload_sizes(runs: pd.DataFrame) -> dict[str, int]:
    """Each workload's training-set size (its runs' ``task.train_limit``), where they logged one."""
    if TRAIN_LIMIT not in runs:
        return {}
    sizes = pd.to_numeric(runs[TRAIN_LIMIT], errors="coerce").groupby(runs[WORKLOAD]).max().dropna()
    return {name: int(size) for name, size in sizes.items()}


def size_row(
    workload: str,
    size: float,
    metric: str,
    lower: bool,
    plateau: Plateau,
    target: float,
    paired: list[Paired],
    summary: pd.DataFrame,
) -> dict[str, object]:
    """One size's row: the plateau verdict, AtteNT's seeds, each of its comparisons with a method
    of ``AGAINST`` (difference, Holm-step interval, verdict), and its savings with their intervals."""
    attent = summary.set_index("method").loc[ATTENT] if ATTENT in set(summary["method"]) else None
    row = {
        "workload": workload,
        "size": size,
        "metric": metric,
        "lower_is_better": lower,
        "seeds": 0 if attent is None else int(attent["seeds"]),
        "plateau": plateau.verdict,
        "plateau_seeds": plateau.seeds,
        "plateau_gain": plateau.mean,
        "plateau_low_90": plateau.low,
        "plateau_high_90": plateau.high,
        "target": target,
    }
    for p in paired:
        if p.subject == ATTENT and p.method in AGAINST:
            row.update(comparison_cells(p))
    for name in ("realized_saving", "realized_over_ideal"):
        for suffix in ("", "_low", "_high"):
            row[name + suffix] = math.nan if attent is None else float(attent.get(name + suffix, math.nan))
    return row


def size_table(rows: list[dict[str, object]]) -> pd.DataFrame:
    """``size_row``'s rows by size."""
    return pd.DataFrame(rows).sort_values("size", kind="stable").reset_index(drop=True)


def _plot_differences(final: Axes, cost: Axes, table: pd.DataFrame, fitted: pd.DataFrame) -> set[str]:
    """AtteNT's difference with each comparator of ``AGAINST`` at each size, with its interval,
    and, dashed, the final metric's fitted trend where ``size_trends`` fitted one.

    Args:
        final: the axes of the final metric's differences.
        cost: the axes of the differences of method cost to the target.
        table: ``size_table``'s rows.
        fitted: ``size_trends``'s rows indexed by comparator (empty: no trend to draw).

    Returns:
        The quantities (``"final"``, ``"cost"``) that got any point.
    """
    plotted = set()
    for number, (method, label) in enumerate(AGAINST.items()):
        if method in fitted.index:
            trend = fitted.loc[method]
            ends = np.array([table["size"].min(), table["size"].max()], dtype=float)
            final.plot(
                ends,
                trend["intercept"] + trend["slope_per_decade"] * np.log10(ends),
                "--",
                color=f"C{number}",
                lw=1,
                label=f"fit {trend['slope_per_decade']:+.3f} per 10×: {trend['verdict']}",
            )
        for ax, quantity in ((final, "final"), (cost, "cost")):
            key = f"{quantity}_vs_{method}"
            if key not in table:
                continue
            shown = table[table[key].notna()]
            if shown.empty:
                continue
            plotted.add(quantity)
            low, high = shown[key] - shown[f"{key}_low"], shown[f"{key}_high"] - shown[key]
            # side by side at each size, so the intervals do not hide one another
            x = shown["size"] * (1 + 0.04 * (number - 1))
            joined = quantity == "cost" or method not in fitted.index  # a fitted trend replaces the joining line
            ax.errorbar(
                x,
                shown[key],
                yerr=[low.fillna(0), high.fillna(0)],
                fmt="o-" if joined else "o",
                capsize=3,
                color=f"C{number}",
                label=f"AtteNT − {label}",
            )
    return plotted


def size_figure(table: pd.DataFrame, trends: pd.DataFrame | None = None) -> Figure:
    """Against the training-set size (log scale): AtteNT's final metric minus each comparator's
    (with the fitted trend, ``size_trends``, dashed), its method cost to the target minus theirs,
    and its realized saving, each with its interval."""
    figure = Figure(figsize=(15, 4.5))
    final, cost, saving = figure.subplots(1, 3)
    metric = table["metric"].iloc[0] if len(table) else "metric"
    fitted = trends.set_index("comparator") if trends is not None and len(trends) else pd.DataFrame()
    plotted = _plot_differences(final, cost, table, fitted)
    for ax, quantity in ((final, "final"), (cost, "cost")):
        if quantity not in plotted:  # e.g. no seed of AtteNT reached the target: nothing to pair
            ax.text(0.5, 0.5, "no paired seeds", transform=ax.transAxes, ha="center", color="grey")
            continue
        ax.axhline(0, color="grey", lw=1)
        ax.set_xscale("log")
        ax.legend(fontsize=7)
    final.set(
        xlabel="training images",
        ylabel=f"difference of final {metric}",
        title="AtteNT − comparator, final metric (Holm-step interval)",
    )
    cost.set(
        xlabel="training images",
        ylabel="difference of method cost to the target (s)",
        title="AtteNT − comparator, cost to target (s)",
    )
    shown = table[table["realized_saving"].notna()]
    saving.errorbar(
        shown["size"],
        shown["realized_saving"],
        yerr=[
            (shown["realized_saving"] - shown["realized_saving_low"]).fillna(0),
            (shown["realized_saving_high"] - shown["realized_saving"]).fillna(0),
        ],
        fmt="o-",
        capsize=3,
        color="C3",
        label="realized saving (95 % seed interval)",
    )
    saving.axhline(0, color="grey", lw=1)
    saving.set(
        xscale="log", xlabel="training images", ylabel="1 − method cost / full data's", title="AtteNT's realized saving"
    )
    saving.legend(fontsize=7)
    figure.tight_layout()
    return figure


def markdown(table: pd.DataFrame) -> str:
    def diff(row: dict, key: str, places: int) -> str:
        if key not in row or row[key] != row[key]:
            return "—"
        interval = (
            ""
            if row[f"{key}_low"] != row[f"{key}_low"]
            else f" [{row[f'{key}_low']:+.{places}f}, {row[f'{key}_high']:+.{places}f}]"
        )
        return f"{row[key]:+.{places}f}{interval} {row[f'{key}_verdict']}"

    def saving(row: dict, name: str) -> str:
        if row[name] != row[name]:
            return "—"
        interval = (
            ""
            if row[f"{name}_low"] != row[f"{name}_low"]
            else f" [{row[f'{name}_low']:.2f}, {row[f'{name}_high']:.2f}]"
        )
        return f"{row[name]:.2f}{interval}"

    cost = "cost_vs_full" in table  # the cost to the target: within one benchmark only
    lines = [
        "| training images | seeds | full data's plateau (2E control), paired seeds | AtteNT − Random, final "
        "| AtteNT − full data, final | AtteNT − full at equal cost, final "
        + ("| AtteNT − full data, cost to target (s) " if cost else "")
        + "| realized saving | realized / ideal |",
        "|---:|---:|---|---|---|---|" + ("---|" if cost else "") + "---:|---:|",
    ]
    for row in table.to_dict("records"):
        lines.append(
            f"| {int(row['size']) if row['size'] == row['size'] else '?'} | {row['seeds']} "
            f"| {row['plateau']} ({row['plateau_seeds']}) "
            f"| {diff(row, 'final_vs_random', 4)} | {diff(row, 'final_vs_full', 4)} "
            f"| {diff(row, 'final_vs_' + contract.METHOD_FULL_EQUAL_COST, 4)} "
            + (f"| {diff(row, 'cost_vs_full', 1)} " if cost else "")
            + f"| {saving(row, 'realized_saving')} | {saving(row, 'realized_over_ideal')} |"
        )
    return "\n".join(lines)


def write_size_view(table: pd.DataFrame, trends: pd.DataFrame, out: Path, title: str, about: str) -> None:
    """``data_size.md`` (headed by ``title`` and ``about``), ``data_size.csv``, ``data_size_trend.csv``
    and ``figures/data_size.png`` in ``out``."""
    (out / "figures").mkdir(parents=True, exist_ok=True)
    size_figure(table, trends).savefig(out / "figures" / "data_size.png", dpi=110)
    table.to_csv(out / "data_size.csv", index=False)
    trends.to_csv(out / "data_size_trend.csv", index=False)
    (out / "data_size.md").write_text(
        "\n".join(
            [
                f"# {title}",
                "",
                about,
                "",
                markdown(table),
                "",
                "![data size](figures/data_size.png)",
                "",
                TREND_HEADING,
                "",
                trend_markdown(trends),
                "",
            ]
        )
    )


def build_data_size_report(
    experiment: str,
    *,
    tracking_uri: str,
    out_dir: str | Path,
    tolerances: dict[str, float] | None = None,
    margins: dict[str, float] | None = None,
) -> Path:
    """``data_size.md``, ``data_size.csv`` and ``figures/data_size.png`` in ``out_dir``, also
    logged to the benchmark's parent run under ``report/data_size/``; returns the folder."""
    client = MlflowClient(tracking_uri)
    sizes = workload_sizes(load_benchmark(client, experiment).runs)
    results, parent = analyse(client, experiment, tolerances, margins)
    table = size_table(
        [
            size_row(
                r.name, sizes.get(r.name, math.nan), r.metric, r.lower, r.plateau, r.target.value, r.paired, r.summary
            )
            for r in results
        ]
    )
    sized = table[table["size"].notna()]
    per_run = pd.concat([r.per_run.assign(workload=r.name) for r in results], ignore_index=True)
    trends = size_trends(
        per_run,
        dict(zip(sized["workload"], sized["size"].astype(int))),
        bool(table["lower_is_better"].iloc[0]) if len(table) else False,
    )
    out = Path(out_dir)
    write_size_view(
        table,
        trends,
        out,
        f"{experiment}: the verdict against the training-set size",
        f"AtteNT's minus each comparator's, seed-paired: the mean difference, its interval at the Holm "
        f"step's level and the verdict ({FINAL}: Holm across the workload's comparisons; {COST_TO_TARGET}: "
        "its own family). Savings: mean and 95 % seed interval. The plateau verdict reads full data for "
        "2E epochs against E.",
    )
    if parent:
        client.log_artifacts(parent, str(out), f"{REPORT_ARTIFACTS}/data_size")
    return out
