"""Figures of one training run, logged to MLflow as PNG artifacts. Built with matplotlib's object
API, as the reports' are: no pyplot, so no backend to select and no global figure registry that a
long-lived process (a local-mode sweep's trial, a user's notebook) must remember to close."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def training_figures(history: list[dict[str, float]], selections, label: str) -> dict[str, Figure]:
    """Loss and evaluation curves, selected ratio per epoch, and where the time went."""
    epochs = [row["epoch"] for row in history]
    figs = {}

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.plot(epochs, [row["train_loss"] for row in history], marker="o", label="train loss (selected samples)")
    if any("eval_loss" in row for row in history):
        points = [(row["epoch"], row["eval_loss"]) for row in history if "eval_loss" in row]
        ax.plot(*zip(*points), marker="s", label="eval loss")
    ax.set(xlabel="epoch", ylabel="loss", title=f"Loss — {label}")
    ax.legend()
    figs["loss"] = fig

    eval_keys = sorted({k for row in history for k in row if k.startswith("eval_") and k != "eval_loss"})
    if eval_keys:
        fig = Figure(figsize=(6, 4))
        ax = fig.subplots()
        for key in eval_keys:
            points = [(row["epoch"], row[key]) for row in history if key in row]
            ax.plot(*zip(*points), marker="o", label=key[5:])
        ax.set(xlabel="epoch", ylabel="metric", title=f"Evaluation — {label}")
        ax.legend()
        figs["eval"] = fig

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.step(epochs, [row["selected_ratio"] for row in history], where="mid", marker="o", label="selected ratio")
    for record in selections:
        ax.axvline(record.epoch + 1, color="grey", alpha=0.3, linewidth=1)
    ax.set(
        xlabel="epoch (grey: re-selection)",
        ylabel="fraction of training set",
        ylim=(0, 1.05),
        title=f"Selected ratio — {label}",
    )
    figs["selected_ratio"] = fig

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    last = history[-1]
    parts = [k for k in ("train", "scoring", "selection", "eval", "checkpoint") if f"time_{k}_s" in last]
    ax.bar(parts, [last[f"time_{k}_s"] for k in parts])
    ax.set(ylabel="seconds", title=f"Time split — total {last['time_total_s']:.1f}s")
    figs["time_split"] = fig
    return figs


def antk_figures(
    epochs: list[int], kernels: list, drift: dict[str, list[float]], heatmap_epochs: list[int]
) -> dict[str, Figure]:
    """The probe-set kernels at ``heatmap_epochs`` (0-based, each with its own colour scale: the
    kernel's scale grows as it settles) and the drift per tracked epoch, keyed by artifact file."""
    from .. import contract

    figs = {}
    shown = [(e, k) for e, k in zip(epochs, kernels) if e in heatmap_epochs]
    fig = Figure(figsize=(4 * len(shown), 3.6))
    axes = fig.subplots(1, len(shown), squeeze=False)
    for ax, (epoch, kernel) in zip(axes[0], shown):
        image = ax.imshow(kernel.numpy(), cmap="viridis")
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set(title=f"after epoch {epoch + 1}", xlabel="probe sample", ylabel="probe sample")
    fig.suptitle("Empirical ANTK on the probe set")
    fig.tight_layout()
    figs[contract.ANTK_HEATMAP_FIGURE] = fig

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    x = [e + 1 for e in epochs]
    ax.plot(x, drift["to_final"], marker="o", label="‖K_e − K_final‖ / ‖K_final‖")
    ax.plot(x[1:], drift["step"][1:], marker="s", label="‖K_e − K_previous‖ / ‖K_previous‖")
    ax.plot(x, drift["alignment_to_final"], marker="^", linestyle="--", label="alignment with K_final")
    ax.set(xlabel="epoch", ylabel="relative Frobenius distance / alignment", title="Kernel drift")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    figs[contract.ANTK_DRIFT_FIGURE] = fig
    return figs
