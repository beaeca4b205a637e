"""The time-to-accuracy report's figures, per workload of its results: the metric against
cumulative method cost, the final metric against method cost, and the hardness of the picks.
Built with the object API (no pyplot), so no GUI backend or global figure state is involved;
saving goes through the Agg canvas.
"""

from __future__ import annotations

from attent.analysis.stats import APART, CONTROL
from attent.analysis.time_to_accuracy.results import WorkloadResult
from matplotlib.figure import Figure


def workload_figures(result: WorkloadResult) -> dict[str, Figure]:
    """Per workload: the metric against cumulative method cost (mean over seeds per method), the
    final metric against method cost, and, where picks have a hardness, hardness per epoch and
    the final metric against hardness."""
    s = result.summary
    apart = set(s.loc[s["budget_match"].isin([APART, CONTROL]), "method"])
    budget_match = dict(zip(s["method"], s["budget_match"]))
    label = lambda method: f"{method} ({budget_match[method]})" if method in apart else method  # noqa: E731
    out = {
        f"{result.name}_curves": curves_figure(result, apart, label),
        f"{result.name}_final_vs_cost": final_vs_cost_figure(result, apart, label),
    }
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
        ax.plot(
            mean["method_cost_s"],
            mean["value"],
            marker="o",
            ms=3,
            lw=1.2,
            color=f"C{number % 10}",
            ls=":" if method in apart else "-",
            label=label(method),
        )
    ax.axhline(result.target.value, color="grey", ls="--", lw=1, label=f"target {result.target.value:.4f}")
    ax.set(
        xlabel="cumulative method cost (s): training + scoring + selection",
        ylabel=result.metric,
        title=f"{result.name}: {result.metric}\nagainst cumulative method cost (mean over seeds)",
    )
    ax.legend(fontsize=7)
    figure.tight_layout()
    return figure


def final_vs_cost_figure(result: WorkloadResult, apart: set[str], label) -> Figure:
    figure = Figure(figsize=(7, 4.5))
    ax = figure.subplots()
    for number, row in enumerate(result.summary.to_dict("records")):
        ax.errorbar(
            row["method_cost_s"],
            row["final_metric"],
            xerr=error(row["method_cost_s_std"]),
            yerr=error(row["final_metric_std"]),
            fmt="o",
            mfc="none" if row["method"] in apart else None,
            capsize=3,
            color=f"C{number % 10}",
            label=label(row["method"]),
        )
    ax.axhline(result.target.value, color="grey", ls="--", lw=1, label=f"target {result.target.value:.4f}")
    ax.set(
        xlabel="method cost (s): training + scoring + selection",
        ylabel=f"final {result.metric}",
        title=f"{result.name}: final {result.metric}\nagainst method cost (mean ± std over seeds)",
    )
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
        left.plot(
            per_epoch.index, per_epoch.values, marker="o", ms=3, lw=1.2, color=f"C{number % 10}", label=label(method)
        )
        row = s[s["method"].eq(method)].iloc[0]
        right.errorbar(
            row["hardness"],
            row["final_metric"],
            xerr=error(row["hardness_std"]),
            yerr=error(row["final_metric_std"]),
            fmt="o",
            capsize=3,
            color=f"C{number % 10}",
            label=label(method),
        )
    # a random pick is below uniform in some epochs: its hardness is then negative
    bottom = min(-0.05, float(per_epoch_means.min()) - 0.05)
    left.set(
        xlabel="epoch",
        ylabel="selection hardness (0 uniform, 1 top-k)",
        ylim=(bottom, 1.05),
        title=f"{result.name}: selection hardness per epoch\n(mean over seeds)",
    )
    right.set(
        xlabel="selection hardness, mean over epochs (0 uniform, 1 top-k)",
        ylabel=f"final {m}",
        title=f"{result.name}: final {m}\nagainst selection hardness",
    )
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    figure.tight_layout()
    return figure


def error(std: float) -> float | None:
    return None if std != std else std
