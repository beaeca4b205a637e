"""The plateau control of a benchmark over more seeds than one report holds: the per-run tables
(``per_run.csv`` that `attent report` writes) of the earlier seeds and of a later benchmark that
ran more seeds of full data and full_long alone (`benchmarks/data_size_plateau.yaml`), joined by
workload and seed, then judged by the report's own functions (``analysis.tta_results``: the target's
tolerance from full data's seed spread, the 90 % paired interval of full_long − full against it).

    python benchmarks/join_plateau_seeds.py benchmarks/results/data_size/per_run.csv \\
        reports/data-size-plateau/per_run.csv

Only the final metric is joined (costs depend on the machine and are not compared here). A seed
draws the same data everywhere, but its runs' numbers need not repeat on other CPU kernels or code
(seed 0 re-run on a second machine did not: benchmarks/results/data_size/plateau_seeds/), so the
join assumes a seed's full_long − full is an exchangeable draw wherever it ran; say so beside its
verdicts. A seed found in two tables is refused.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "platform"), str(Path(__file__).resolve().parents[1])]

from analysis.tta_results import FULL, FULL_LONG, plateau_of, target_of  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+", help="per_run.csv files")
    args = parser.parse_args(argv)
    frames = []
    for path in args.tables:
        table = pd.read_csv(path)
        frames.append(table[table["method"].isin([FULL, FULL_LONG])])
    runs = pd.concat(frames, ignore_index=True)
    twice = runs[runs.duplicated(["workload", "method", "seed"], keep=False)]
    if not twice.empty:
        sys.exit(f"the same seed in two tables: {sorted(set(zip(twice.workload, twice.method, twice.seed)))}")
    print("| workload | seeds | full data, final (mean ± std) | full_long − full, 90 % interval | tolerance | verdict |")
    print("|---|---:|---:|---|---:|---|")
    for workload, per_run in runs.groupby("workload", sort=False):
        lower = bool(per_run["lower_is_better"].iloc[0])
        full = per_run[per_run["method"].eq(FULL)]["final_metric"]
        target = target_of(full, lower)
        plateau = plateau_of(per_run, lower, target.tolerance)
        seeds = ", ".join(str(int(s)) for s in sorted(per_run["seed"].unique()))
        print(f"| {workload} | {seeds} | {full.mean():.4f} ± {full.std(ddof=1):.4f} | {plateau.mean:+.4f} "
              f"[{plateau.low:+.4f}, {plateau.high:+.4f}] | {target.tolerance:.4f} | {plateau.verdict} |")


if __name__ == "__main__":
    main()
