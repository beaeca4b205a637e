"""The epoch pilot's reading: which epoch count E lets full data plateau, judged on validation.

A pilot sweep trains full data for several epoch counts (each schedule spanning its epochs) over
seeds that each draw their own split with a validation set. For every count E whose double 2E was
also trained, the plateau control's test of the time-to-accuracy report (``plateau_of``): 2E's
final validation metric minus E's, seed by seed, 90 % paired interval against the tolerance
(``target_of``: the larger of 0.005 absolute and full data's seed std at E). The pilot's E is the
smallest count called "plateaued". Only validation metrics are read, so the tables built at that E
read their test split for their verdicts alone. The table and a figure (the metric against the
epochs, seed by seed) go to ``<out>/<experiment>/`` and to the pilot sweep's parent run.

    python -m attent.analysis.paper_tables.epochs_pilot --experiment epochs-pilot-digits [--metric eval_val_accuracy]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd
from attent import contract
from attent.analysis import ReportError
from attent.analysis.mlflow_runs import EPOCHS, REPORT_ARTIFACTS, SEED, metric
from attent.analysis.paper_tables.experiment_runs import is_full, load_experiment_runs
from attent.analysis.paper_tables.verdicts import CONTROL_NAME
from attent.analysis.stats import (
    ACCURACY_TOLERANCE,
    LOSS_TOLERANCE,
    PLATEAU_CONFIDENCE,
    PLATEAUED,
    plateau_of,
    target_of,
)
from attent.contract import lower_is_better
from matplotlib.figure import Figure

STEM = "epochs_pilot"  # <out>/<experiment>/epochs_pilot.{md,png}


def pilot_finals(runs: pd.DataFrame, metric_name: str) -> pd.Series:
    """Full data's final ``metric_name`` by (epochs, seed); a seed trained twice: its mean."""
    if not metric_name.startswith(contract.VAL_PREFIX):  # the test split is the tables' verdicts' alone
        raise ReportError(f"the pilot reads validation metrics only ({contract.VAL_PREFIX}...), not {metric_name!r}")
    column = metric(metric_name)
    if column not in runs:
        raise ReportError(f"no run logged {metric_name!r}: give the pilot's trials a validation split (task.val_limit)")
    full = runs[is_full(runs)].assign(
        epochs=pd.to_numeric(runs[EPOCHS], errors="coerce"),
        seed=pd.to_numeric(runs[SEED], errors="coerce"),
        final_metric=pd.to_numeric(runs[column], errors="coerce"),
    )
    return full.groupby(["epochs", "seed"])["final_metric"].mean()


def pilot_rows(finals: pd.Series, lower: bool) -> tuple[pd.DataFrame, int | None]:
    """One row per trained epoch count E of ``finals`` (``pilot_finals``): full data's final metric
    (mean, std, seeds) and, where 2E was trained too, the gain of 2E over E with its interval and
    verdict. Also the pilot's E: the smallest plateaued count (None when none is)."""
    rows, chosen = [], None
    for epochs in sorted(finals.index.get_level_values("epochs").unique()):
        at_e = finals.loc[epochs]
        row = {
            "epochs": int(epochs),
            "seeds": int(at_e.notna().sum()),
            "mean": at_e.mean(),
            "std": at_e.std(),
            "gain": math.nan,
            "low": math.nan,
            "high": math.nan,
            "tolerance": math.nan,
            "verdict": "no 2E run",
        }
        if 2 * epochs in finals.index.get_level_values("epochs"):
            per_run = pd.concat(
                [
                    at_e.rename("final_metric").reset_index().assign(method=contract.METHOD_FULL),
                    finals.loc[2 * epochs]
                    .rename("final_metric")
                    .reset_index()
                    .assign(method=contract.METHOD_FULL_LONG),
                ]
            )
            target = target_of(at_e, lower)
            plateau = plateau_of(per_run, lower, target.tolerance, CONTROL_NAME)
            row.update(
                gain=plateau.mean,
                low=plateau.low,
                high=plateau.high,
                tolerance=plateau.tolerance,
                verdict=plateau.verdict,
            )
            if plateau.verdict == PLATEAUED and chosen is None:
                chosen = int(epochs)
        rows.append(row)
    return pd.DataFrame(rows), chosen


def markdown(table: pd.DataFrame, chosen: int | None, metric_name: str, experiment: str) -> str:
    lines = [
        f"# Epoch pilot: {experiment}",
        "",
        f"Full data's final {metric_name} per epoch count E (mean ± std over seeds), and the gain of 2E "
        f"over E seed by seed (positive = better), its {PLATEAU_CONFIDENCE:.0%} paired t-interval and the "
        "plateau verdict against the tolerance (the larger of a floor, "
        f"{ACCURACY_TOLERANCE} absolute or {LOSS_TOLERANCE:.0%} of a loss, and full data's seed std at E).",
        "",
        f"| E | seeds | {metric_name} | gain of 2E | {PLATEAU_CONFIDENCE:.0%} interval | tolerance | verdict |",
        "|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in table.to_dict("records"):
        interval = "—" if math.isnan(r["low"]) else f"[{r['low']:+.4f}, {r['high']:+.4f}]"
        gain = "—" if math.isnan(r["gain"]) else f"{r['gain']:+.4f}"
        tolerance = "—" if math.isnan(r["tolerance"]) else f"{r['tolerance']:.4f}"
        lines.append(
            f"| {r['epochs']} | {r['seeds']} | {r['mean']:.4f} ± {r['std']:.4f} | {gain} | {interval} "
            f"| {tolerance} | {r['verdict']} |"
        )
    lines += [
        "",
        f"E = {chosen}: the smallest count whose doubling gains less than the tolerance."
        if chosen
        else "No count is shown to have plateaued: train longer counts, or more seeds to narrow the intervals.",
    ]
    return "\n".join(lines)


def pilot_figure(finals: pd.Series, chosen: int | None, metric_name: str) -> Figure:
    """The final metric against the epoch count, one line per seed and the mean, E marked."""
    fig = Figure(figsize=(5.5, 3.5), layout="constrained")
    ax = fig.add_subplot()
    by_seed = finals.unstack("seed")
    for seed in by_seed.columns:
        ax.plot(
            by_seed.index,
            by_seed[seed],
            marker="o",
            color="tab:gray",
            alpha=0.6,
            lw=1,
            label="a seed" if seed == by_seed.columns[0] else None,
        )
    ax.plot(by_seed.index, by_seed.mean(axis=1), marker="o", color="black", lw=2, label="mean over seeds")
    if chosen is not None:
        ax.axvline(chosen, color="tab:blue", ls="--", label=f"E = {chosen}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(by_seed.index), [f"{e:g}" for e in by_seed.index])
    ax.set_xlabel("epochs (the schedule spans them)")
    ax.set_ylabel(f"final {metric_name}")
    ax.set_title("Full data against its epoch count")
    ax.legend(fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", required=True)
    parser.add_argument(
        "--metric", default=contract.VAL_PREFIX + "accuracy", help="a validation metric (default: eval_val_accuracy)"
    )
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports)")
    args = parser.parse_args(argv)
    from mlflow import MlflowClient

    client = MlflowClient(args.tracking_uri)
    try:
        loaded = load_experiment_runs(client, args.experiment)
        finals = pilot_finals(loaded.runs, args.metric)
        table, chosen = pilot_rows(finals, lower_is_better(args.metric))
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = markdown(table, chosen, args.metric, args.experiment)
    print(text)
    out = args.out / args.experiment
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.md").write_text(f"{text}\n\n![{STEM}]({STEM}.png)\n", encoding="utf-8")
    pilot_figure(finals, chosen, args.metric).savefig(out / f"{STEM}.png", dpi=120)
    for parent_id in loaded.sweep_parent_ids:
        for path in (out / f"{STEM}.md", out / f"{STEM}.png"):
            client.log_artifact(parent_id, str(path), artifact_path=REPORT_ARTIFACTS)
    print(
        f"\nWrote {out / STEM}.md and .png"
        + (f"; logged them to sweep run(s) {', '.join(loaded.sweep_parent_ids)}" if loaded.sweep_parent_ids else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
