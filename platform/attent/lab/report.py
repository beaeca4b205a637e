"""The teaching experiment's summary (Markdown + JSON) and figures."""

from __future__ import annotations

import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..theory.config import TheoryConfig  # noqa: E402
from ..theory.tangent_kernel import kernel_drift  # noqa: E402
from ..theory.teaching import RunRecord  # noqa: E402

COLORS = {"greedy": "tab:red", "random": "tab:blue", "full": "tab:green"}
DRIFT_FRACTIONS = (0.1, 0.25, 0.5)  # of the run: where the drift to the final kernel is reported
SETTLED = 0.1  # drift to the final kernel below which the ANTK counts as settled


def by_rule(records: list[RunRecord]) -> dict[str, list[RunRecord]]:
    grouped: dict[str, list[RunRecord]] = {}
    for record in records:
        grouped.setdefault(record.rule, []).append(record)
    return grouped


def mean_std(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0, "mean": None, "std": None}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def drift_at(record: RunRecord, fraction: float) -> float:
    """Drift to the final kernel at the checkpoint nearest ``fraction`` of the run."""
    drift = kernel_drift(record.kernels)["to_final"]
    goal = fraction * record.iterations
    nearest = min(range(len(drift)), key=lambda k: abs(record.kernel_iterations[k] - goal))
    return drift[nearest]


def settled_iteration(record: RunRecord) -> int:
    """First checkpoint from which the drift to the final kernel stays below SETTLED."""
    drift = kernel_drift(record.kernels)["to_final"]
    for k in range(len(drift)):
        if all(d < SETTLED for d in drift[k:]):
            return record.kernel_iterations[k]
    return record.iterations


def summarize(records: list[RunRecord], cfg: TheoryConfig) -> dict:
    """Per teaching rule, over seeds: iterations and its wall-clock to each target loss, final loss,
    cost per iteration, samples back-propagated, and the ANTK drift."""
    summary = {}
    for rule, runs in by_rule(records).items():
        row = {"seeds": len(runs), "targets": {}}
        for target in cfg.teach.target_losses:
            hits = [run.to_target(target) for run in runs]
            row["targets"][str(target)] = {
                "reached": sum(t is not None for t, _, _ in hits),
                "iterations": mean_std([t for t, _, _ in hits]),
                "seconds": mean_std([s for _, s, _ in hits]),
                "cpu_seconds": mean_std([c for _, _, c in hits]),
            }
        row["final_loss"] = mean_std([run.loss[-1] for run in runs])
        row["final_loss_median"] = statistics.median(run.loss[-1] for run in runs)
        row["ms_per_iteration"] = mean_std([1000 * run.time_s[-1] / max(run.iterations, 1) for run in runs])
        row["cpu_ms_per_iteration"] = mean_std([1000 * run.cpu_s[-1] / max(run.iterations, 1) for run in runs])
        row["samples_backpropagated"] = mean_std([run.samples_backpropagated for run in runs])
        row["antk"] = {
            "initial_to_final": mean_std([kernel_drift(run.kernels)["to_final"][0] for run in runs]),
            "initial_alignment": mean_std([kernel_drift(run.kernels)["alignment_to_final"][0] for run in runs]),
            **{f"to_final_at_{f:g}": mean_std([drift_at(run, f) for run in runs]) for f in DRIFT_FRACTIONS},
            "settled_iteration": mean_std([settled_iteration(run) for run in runs]),
        }
        summary[rule] = row
    return summary


def _cell(stat: dict, digits: str = ".3g", reached: bool = False, seeds: int = 0) -> str:
    if not stat["n"]:
        return "—"
    text = f"{stat['mean']:{digits}}" + (f" ± {stat['std']:{digits}}" if stat["n"] > 1 else "")
    return f"{text} ({stat['n']}/{seeds})" if reached else text


def summary_markdown(summary: dict, cfg: TheoryConfig) -> str:
    """The teaching table and the ANTK drift table."""
    targets = [str(t) for t in cfg.teach.target_losses]
    head = ["teaching rule"] + [
        h for t in targets for h in (f"iterations to {t}", f"wall-clock to {t} (s)", f"CPU to {t} (s)")
    ]
    head += ["final loss (median)", "ms / iteration (wall, CPU)", "samples back-propagated"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for rule, row in summary.items():
        cells = [rule]
        for t in targets:
            hit = row["targets"][t]
            cells += [
                _cell(hit["iterations"], ".1f", True, row["seeds"]),
                _cell(hit["seconds"], ".3f"),
                _cell(hit["cpu_seconds"], ".3f"),
            ]
        cells += [
            f"{_cell(row['final_loss'])} ({row['final_loss_median']:.2g})",
            f"{_cell(row['ms_per_iteration'], '.2f')}, {_cell(row['cpu_ms_per_iteration'], '.2f')}",
            _cell(row["samples_backpropagated"], ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    drift_head = ["teaching rule", "‖K₀−K_T‖/‖K_T‖", "cos(K₀, K_T)"]
    drift_head += [f"drift to final at {f:.0%} of T" for f in DRIFT_FRACTIONS]
    drift_head.append(f"iteration from which drift < {SETTLED:g}")
    lines += ["", "| " + " | ".join(drift_head) + " |", "|---" + "|---:" * (len(drift_head) - 1) + "|"]
    for rule, row in summary.items():
        antk = row["antk"]
        cells = [rule, _cell(antk["initial_to_final"]), _cell(antk["initial_alignment"])]
        cells += [_cell(antk[f"to_final_at_{f:g}"]) for f in DRIFT_FRACTIONS]
        cells.append(_cell(antk["settled_iteration"], ".0f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(records: list[RunRecord], cfg: TheoryConfig) -> dict[str, plt.Figure]:
    """Loss against iterations and against wall-clock, ANTK drift, kernel heatmaps."""
    return {
        "loss_vs_iterations": _loss_figure(records, cfg, "iteration"),
        "loss_vs_wallclock": _loss_figure(records, cfg, "wall"),
        "loss_vs_cpu_time": _loss_figure(records, cfg, "cpu"),
        "antk_drift": _drift_figure(records),
        "kernel_heatmaps": _heatmap_figure(records),
    }


X_LABELS = {
    "iteration": "iteration",
    "wall": "method wall-clock (s: scoring + selection + update)",
    "cpu": "method CPU time (s, one thread: scoring + selection + update)",
}


def _loss_figure(records: list[RunRecord], cfg: TheoryConfig, axis: str):
    """Full-set loss against ``axis`` (iteration | wall | cpu): every seed thin, the geometric
    mean over seeds thick (at the mean time of each iteration)."""

    def xs(run: RunRecord) -> list[float]:
        return {"iteration": list(range(len(run.loss))), "wall": run.time_s, "cpu": run.cpu_s}[axis]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for rule, runs in by_rule(records).items():
        color = COLORS.get(rule)
        for run in runs:
            ax.plot(xs(run), run.loss, color=color, alpha=0.25, linewidth=0.8)
        length = min(len(run.loss) for run in runs)
        mean = np.exp(np.mean([np.log(np.maximum(run.loss[:length], 1e-30)) for run in runs], axis=0))
        x = np.mean([xs(run)[:length] for run in runs], axis=0)
        ax.plot(x, mean, color=color, linewidth=2, label=f"{rule} (geometric mean of {len(runs)} seeds)")
    for target in cfg.teach.target_losses:
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
    ax.set_yscale("log")
    ax.set(
        xlabel=X_LABELS[axis],
        ylabel="full-set loss (MSE)",
        title=f"Teaching f*: m={cfg.teach.subset} of N={cfg.problem.num_sequences}, lr={cfg.teach.lr:g}",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _drift_figure(records: list[RunRecord]):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for rule, runs in by_rule(records).items():
        for k, run in enumerate(runs):
            drift = kernel_drift(run.kernels)
            label = rule if k == 0 else None
            axes[0].plot(run.kernel_iterations, drift["to_final"], color=COLORS.get(rule), alpha=0.6, label=label)
            axes[1].plot(run.kernel_iterations[1:], drift["step"][1:], color=COLORS.get(rule), alpha=0.6, label=label)
    axes[0].set(xlabel="iteration", ylabel="‖K_t − K_T‖_F / ‖K_T‖_F", title="ANTK drift to the final kernel")
    axes[1].set(xlabel="iteration", ylabel="‖K_t − K_prev‖_F / ‖K_prev‖_F", title="ANTK change between checkpoints")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _heatmap_figure(records: list[RunRecord]):
    """First seed of each teaching rule: initial kernel, final kernel, and their difference."""
    firsts = [runs[0] for runs in by_rule(records).values()]
    fig, axes = plt.subplots(len(firsts), 3, figsize=(10, 3.2 * len(firsts)), squeeze=False)
    for row, run in zip(axes, firsts):
        initial, final = run.kernels[0].numpy(), run.kernels[-1].numpy()
        panels = (
            (initial, f"{run.rule}: K at iteration 0"),
            (final, f"{run.rule}: K at iteration {run.iterations}"),
            (final - initial, "final − initial"),
        )
        for ax, (matrix, title) in zip(row, panels):
            image = ax.imshow(matrix, cmap="viridis" if title != "final − initial" else "coolwarm")
            ax.set(title=title, xlabel="probe j", ylabel="probe i")
            fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(f"Empirical ANTK on the probe set (seed {firsts[0].seed})")
    fig.tight_layout()
    return fig


def close(fig) -> None:
    plt.close(fig)
