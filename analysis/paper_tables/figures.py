"""The paper tables' figures: each ``*_figure`` function takes the runs frame (and metric
histories) and returns a matplotlib ``Figure``, or None when the runs cannot fill it. Figures are
built with the object API (no pyplot), so no GUI backend or global figure state is involved;
saving goes through the Agg canvas.
"""

from __future__ import annotations

import pandas as pd
from attent import contract
from attent.analysis.mlflow_runs import METHOD, METHOD_COST, RATIO_KIND, RATIO_START, SELECTED_RATIO
from attent.analysis.paper_tables.experiment_runs import STRATEGY_NAMES, config_names, is_full, strategy_names
from matplotlib.figure import Figure

STRATEGY_COLORS = {
    STRATEGY_NAMES[contract.NONE]: "black",
    STRATEGY_NAMES["random"]: "tab:gray",
    STRATEGY_NAMES["hard"]: "tab:blue",
    STRATEGY_NAMES["soft"]: "tab:orange",
}
COST_PART_HISTORIES = [contract.time_metric(part) for part in contract.METHOD_TIME_PARTS]


def color_of(strategy: str) -> str:
    return STRATEGY_COLORS.get(strategy, "tab:green")


def per_config(runs: pd.DataFrame, values: pd.Series) -> pd.DataFrame:
    """Per configuration (with its strategy): mean/std of ``values`` (aligned with ``runs``),
    ``n`` runs that have a value and ``runs`` in all."""
    frame = pd.DataFrame({"config": config_names(runs), "strategy": strategy_names(runs), "value": values})
    return (
        frame.groupby(["config", "strategy"])["value"].agg(mean="mean", std="std", n="count", runs="size").reset_index()
    )


def config_bars(summary: pd.DataFrame, xlabel: str, title: str) -> Figure:
    """Horizontal bars (mean ± std) per configuration, coloured by strategy."""
    fig = Figure(figsize=(7, 0.45 * len(summary) + 1.5), layout="constrained")
    ax = fig.add_subplot()
    ax.barh(
        summary["config"],
        summary["mean"],
        xerr=summary["std"].fillna(0),
        capsize=3,
        color=[color_of(s) for s in summary["strategy"]],
    )
    ax.invert_yaxis()  # first configuration on top, as in the tables
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return fig


def selected_ratio(runs: pd.DataFrame) -> pd.Series:
    """Fraction of the data each run backpropagated: the logged mean selected ratio, else the
    configured fixed ratio, else 1 for the full-data baseline."""
    ratio = runs[SELECTED_RATIO].fillna(runs[RATIO_START].where(runs[RATIO_KIND].eq("fixed")))
    return ratio.where(~(is_full(runs) & ratio.isna()), 1.0)


def sample_ratio_figure(runs: pd.DataFrame, metric: str) -> Figure | None:
    """Downstream metric vs sample ratio, one series per strategy (the paper's ratio figure)."""
    points = per_config(runs, runs[f"metrics.{metric}"])
    points["ratio"] = per_config(runs, selected_ratio(runs))["mean"]
    points = points.dropna(subset=["ratio", "mean"])
    if points["ratio"].nunique() < 2:
        return None
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    for strategy, series in points.sort_values("ratio").groupby("strategy"):
        ax.errorbar(
            series["ratio"] * 100,
            series["mean"],
            yerr=series["std"].fillna(0),
            marker="o",
            capsize=3,
            label=strategy,
            color=color_of(strategy),
        )
    ax.set_xlabel("sample ratio (%)")
    ax.set_ylabel(metric)
    ax.legend()
    ax.set_title(f"{metric} vs sample ratio")
    return fig


def training_time_figure(runs: pd.DataFrame) -> Figure | None:
    """Method cost (training + scoring + selection; no evaluation) per configuration."""
    summary = per_config(runs, runs[METHOD_COST]).dropna(subset=["mean"])
    if summary.empty:
        return None
    return config_bars(
        summary.sort_values("mean", ascending=False),
        "method cost (s): training + scoring + selection",
        "Method cost per configuration (mean ± std over seeds)",
    )


def loss_curves_figure(runs: pd.DataFrame, histories: pd.DataFrame) -> Figure | None:
    """One panel per strategy, a mean-over-seeds train-loss curve per configuration in it; the
    full-data baseline is drawn dashed in every panel for reference."""
    loss = histories[histories["key"].eq(contract.TRAIN_LOSS)].merge(
        runs.assign(config=config_names(runs), strategy=strategy_names(runs), full=is_full(runs))[
            ["run_id", "config", "strategy", "full"]
        ],
        on="run_id",
    )
    if loss.empty:
        return None
    curves = loss.groupby(["strategy", "config", "full", "step"])["value"].mean().reset_index()
    baseline = curves[curves["full"]]
    panels = sorted(set(curves.loc[~curves["full"], "strategy"])) or [STRATEGY_NAMES["none"]]
    fig = Figure(figsize=(5 * len(panels), 4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    for ax, strategy in zip(axes, panels):
        for config, curve in baseline.groupby("config"):
            ax.plot(curve["step"], curve["value"], "k--", label=config)
        selected = curves[curves["strategy"].eq(strategy) & ~curves["full"]]
        for config, curve in selected.groupby("config"):
            ax.plot(curve["step"], curve["value"], label=config)
        ax.set_title(strategy)
        ax.set_xlabel("epoch")
        ax.legend(fontsize="small")
    axes[0].set_ylabel("train loss (mean over seeds)")
    return fig


def time_to_reach_baseline(runs: pd.DataFrame, histories: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per configuration: method cost (training + scoring + selection seconds) spent until
    ``metric`` first reaches the full-data baseline's final value (mean over its seeds), as
    mean/std over the seeds that reached it, ``n`` of them and ``runs`` in all. Empty when there
    is no baseline."""
    target = runs.loc[runs[METHOD].eq(contract.METHOD_FULL), f"metrics.{metric}"].mean()
    if pd.isna(target):
        return pd.DataFrame(columns=["config", "strategy", "mean", "std", "n", "runs"])
    by_epoch = histories.pivot_table(index=["run_id", "step"], columns="key", values="value")
    reached = pd.DataFrame({"value": by_epoch.get(metric), "cost": epoch_method_cost(by_epoch)})
    reached = reached.dropna()
    reached = reached[reached["value"] >= target]
    first_time = reached.groupby("run_id")["cost"].min()
    return per_config(runs, runs["run_id"].map(first_time))


def epoch_method_cost(by_epoch: pd.DataFrame) -> pd.Series:
    """Cumulative method cost per (run, epoch), as ``contract.method_cost`` defines it."""
    columns = by_epoch.reindex(columns=[contract.TIME_METHOD, *COST_PART_HISTORIES])
    return columns.apply(lambda row: contract.method_cost(row.to_dict()), axis=1, result_type="reduce")


def time_to_baseline_figure(reach: pd.DataFrame, metric: str) -> Figure | None:
    if reach.empty or reach["n"].eq(0).all():
        return None
    reach = reach.fillna({"mean": 0.0, "std": 0.0})  # "not reached": no bar, a note instead
    fig = config_bars(reach, "method cost (s)", f"Method cost to reach the full-data final {metric}")
    ax = fig.axes[0]
    for y, row in enumerate(reach.itertuples()):
        note = "not reached" if row.n == 0 else f"{row.n}/{row.runs} seeds"
        ax.annotate(
            note, (row.mean + row.std, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize="small"
        )
    return fig
