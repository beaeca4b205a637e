"""Several benchmarks read as one: their per-run tables joined by workload and seed, then judged
by the reports' own functions, as the data-size view (``data_size``) of every size and seed they
hold. ``attent report --with SOURCE`` (repeatable) builds it; a source is a benchmark's runs in
MLflow (``EXPERIMENT`` in the store of ``--tracking-uri``, or ``EXPERIMENT@TRACKING_URI``) or the
``per_run.csv`` an earlier report saved (the shipped results under ``benchmarks/results/`` are
such tables: no MLflow store travels with them). Run over the saved tables of the data-size
benchmarks, it gives the headline table of docs/findings:

    attent report --out reports/data-size-joined \
        --with benchmarks/results/data_size/per_run.csv --with benchmarks/results/data_size_small_seeds/per_run.csv \
        --with benchmarks/results/data_size_6000/per_run.csv \
        --with benchmarks/results/data_size/fmnist-20000/per_run.csv \
        --with benchmarks/results/data_size_20000_seeds/per_run.csv \
        --with benchmarks/results/data_size_plateau/per_run.csv \
        --with benchmarks/results/data_size_plateau/fmnist-20000/per_run.csv

**Pairs never cross sources.** A seed-paired difference is taken within the source that ran both
of its runs (one benchmark, one machine): AtteNT's comparisons of a workload and seed read the
runs of the source holding that seed's AtteNT run, and the plateau control (full data for 2E
epochs − full data for E) those of the source holding its 2E run. So a benchmark of more seeds of
full data and its control alone (``benchmarks/specs/data_size_plateau.yaml``) adds to the plateau
verdict and to no comparison, and a seed of full data run again elsewhere pairs with its own
source's runs only. Two sources holding AtteNT's run (or the 2E run) of one workload and seed are
refused. Each seed is taken as an exchangeable draw wherever it ran.

**What is joined.** The final metric and the realized saving, both within-seed quantities. The
cost to the target is not: each benchmark set its own target. Per workload: AtteNT against every
other method it was paired with, one family (Holm across it, equivalence within the sources'
margin); full data's plateau verdict over the control's seeds, against the tolerance of full
data's seed spread there (``target_of``); and, across the sizes, ``size_trends``. A workload's
training-set size is its runs' ``task.train_limit`` (MLflow), the size an earlier report's view
saved beside its ``per_run.csv`` (``<report>/data_size/data_size.csv``), or ``--size
WORKLOAD=N``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from attent.analysis import ReportError
from attent.analysis.stats import FINAL, plateau_of, target_of
from attent.analysis.time_to_accuracy.data_size import size_row, size_table, workload_sizes, write_size_view
from attent.analysis.time_to_accuracy.data_size_trend import size_trends
from attent.analysis.time_to_accuracy.judge import analyse
from attent.analysis.time_to_accuracy.report import tables
from attent.analysis.time_to_accuracy.results import ATTENT, FULL, FULL_LONG, paired_comparisons, summarize
from attent.analysis.time_to_accuracy.runs import load_benchmark
from mlflow import MlflowClient

SOURCE = "source"  # the joined per-run table's column naming where each run came from


@dataclass
class Source:
    name: str  # the file, or EXPERIMENT@TRACKING_URI
    per_run: pd.DataFrame  # per_run.csv's columns
    sizes: dict[str, int]  # workload -> training-set size, where the source says


def read_source(text: str, tracking_uri: str | None) -> Source:
    """A saved ``per_run.csv`` (a path ending in .csv), else ``EXPERIMENT[@TRACKING_URI]``: that
    benchmark's runs in MLflow, judged as its report judges them."""
    if text.endswith(".csv"):
        path = Path(text)
        if not path.is_file():
            raise ReportError(f"--with {text}: no such file (a per_run.csv an earlier report saved)")
        saved_view = path.parent / "data_size" / "data_size.csv"
        sizes = pd.read_csv(saved_view).dropna(subset=["size"]) if saved_view.is_file() else pd.DataFrame()
        return Source(
            text, pd.read_csv(path), {w: int(s) for w, s in zip(sizes.get("workload", []), sizes.get("size", []))}
        )
    experiment, _, uri = text.partition("@")
    client = MlflowClient(uri or tracking_uri)
    results, _ = analyse(client, experiment)
    return Source(
        f"{experiment}@{client.tracking_uri}",
        tables(results)["per_run"],
        workload_sizes(load_benchmark(client, experiment).runs),
    )


def joined_runs(sources: list[Source]) -> pd.DataFrame:
    """Every source's per-run rows, each with its ``source``."""
    if not sources:
        raise ReportError("nothing to join: give --with a per_run.csv or an EXPERIMENT[@TRACKING_URI]")
    return pd.concat([s.per_run.assign(**{SOURCE: s.name}) for s in sources], ignore_index=True)


def paired_within_sources(runs: pd.DataFrame, anchor: str) -> pd.DataFrame:
    """The rows of ``runs`` (one workload's) that pair with ``anchor``'s runs: for each seed, the
    runs of the one source that holds the anchor's run of that seed."""
    held = runs[runs["method"].eq(anchor)]
    twice = held[held.duplicated("seed", keep=False)]
    if not twice.empty:
        seeds = sorted(int(s) for s in twice["seed"].unique())
        raise ReportError(
            f"{runs['workload'].iloc[0]}: {anchor}'s run of seed(s) {seeds} is in two sources "
            f"({', '.join(sorted(twice[SOURCE].unique()))}): join each seed once"
        )
    owner = dict(zip(held["seed"], held[SOURCE]))
    return runs[runs["seed"].map(owner).eq(runs[SOURCE])]


def judge_joined(
    runs: pd.DataFrame, sizes: dict[str, int], margin: float | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The size table (``size_row`` per workload), the trends across the sizes, and the runs the
    comparisons paired, from the joined per-run rows. ``margin``: the equivalence margin, instead
    of the sources' (which must agree within a workload)."""
    rows, compared = [], []
    for workload, mine in runs.groupby("workload", sort=False):
        lower = bool(mine["lower_is_better"].iloc[0])
        pairs = paired_within_sources(mine, ATTENT)
        control = paired_within_sources(mine, FULL_LONG)
        control = control[control["method"].isin([FULL, FULL_LONG])]
        reference = control if control["method"].eq(FULL).any() else mine  # the control's own full data
        target = target_of(reference.loc[reference["method"].eq(FULL), "final_metric"], lower)
        plateau = plateau_of(control, lower, target.tolerance)
        margins = set(pairs["margin"].dropna())
        if margin is None and len(margins) > 1:
            raise ReportError(f"{workload}: the sources judged with margins {sorted(margins)}: give --margin")
        chosen = margin if margin is not None else (margins.pop() if margins else math.nan)
        summary = summarize(pairs) if len(pairs) else pd.DataFrame({"method": []})
        finals = (
            [p for p in paired_comparisons(pairs, summary, lower, chosen) if p.quantity == FINAL] if len(pairs) else []
        )
        rows.append(
            size_row(
                workload,
                sizes.get(workload, math.nan),
                str(mine["metric"].iloc[0]),
                lower,
                plateau,
                target.value,
                finals,
                summary,
            )
        )
        compared.append(pairs)
    table = size_table(rows)
    sized = table[table["size"].notna()]
    compared_runs = pd.concat(compared, ignore_index=True)
    trends = size_trends(
        compared_runs, dict(zip(sized["workload"], sized["size"].astype(int))), bool(table["lower_is_better"].iloc[0])
    )
    return table, trends, compared_runs


def build_joined_report(
    name: str,
    sources: list[Source],
    out_dir: str | Path,
    sizes: dict[str, int] | None = None,
    margin: float | None = None,
) -> Path:
    """The data-size view of the joined sources (``data_size.md``, ``data_size.csv``,
    ``data_size_trend.csv``, ``figures/data_size.png``) and the joined ``per_run.csv`` (with each
    run's ``source``) in ``out_dir``; returns the folder. ``sizes``: workload -> size, over what
    the sources say."""
    runs = joined_runs(sources)
    known = {w: s for source in sources for w, s in source.sizes.items()} | dict(sizes or {})
    unsized = sorted(set(runs["workload"]) - set(known))
    if unsized:
        raise ReportError(f"no training-set size for {', '.join(unsized)}: give --size WORKLOAD=N")
    table, trends, _ = judge_joined(runs, known, margin)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "per_run.csv", index=False)
    listed = "; ".join(f"`{s.name}`" for s in sources)
    write_size_view(
        table,
        trends,
        out,
        f"{name}: the verdict against the training-set size, joined",
        f"Joined: {listed}. AtteNT's minus each comparator's final metric, seed-paired within the "
        "source that ran both runs: the mean difference, its interval at the Holm step's level and "
        "the verdict (Holm across the workload's comparisons). Savings: mean and 95 % seed interval. The "
        "plateau verdict reads full data for 2E epochs against E over the seeds the control ran. "
        "The cost to the target is not joined (each benchmark set its own target).",
    )
    return out
