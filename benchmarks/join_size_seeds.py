"""The data-size view over more seeds than one report holds: the per-run tables (``per_run.csv``
that `attent report` writes) of the earlier seeds and of a later benchmark that ran more seeds of
a size (`benchmarks/data_size_20000_seeds.yaml`), joined by workload and seed, then judged by the
report's own functions (``analysis.tta_results.paired_comparisons``, ``analysis.data_size.size_trends``):
per size, AtteNT's final metric against Random at its budget, full data and full data at equal
measured cost, Holm-adjusted across all of the size's comparisons as its report does (a method
some tables lack, such as Hard + stratify, stays in the family over the seeds it has), its realized
saving with a 95 % seed interval, and the trend of each difference against log10(size).

    python benchmarks/join_size_seeds.py benchmarks/results/data_size/data_size/data_size.csv \\
        benchmarks/results/data_size/per_run.csv benchmarks/results/data_size/fmnist-20000/per_run.csv \\
        reports/data-size-20000-seeds/per_run.csv

The first file is a saved ``data_size.csv`` (each workload's size; ``--sizes`` adds another's,
for a size measured in a store of its own, e.g. ``benchmarks/data_size_6000.yaml``'s). Joined are the final metric and
the realized saving, both within-seed quantities (a seed's runs ran on one machine); the cost to
the target is not (each report sets its own target). A seed draws the same images everywhere, but
its numbers need not repeat on other CPU kernels (benchmarks/results/data_size/plateau_seeds/), so
the join takes each seed as an exchangeable draw wherever it ran. A seed found in two tables is
refused.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "platform"), str(Path(__file__).resolve().parents[1])]

from analysis.data_size import AGAINST, comparison_cells, size_figure, size_trends, trend_markdown  # noqa: E402
from analysis.tta_results import ATTENT, FINAL, paired_comparisons, summarize  # noqa: E402


def judged(runs: pd.DataFrame, sizes: dict[str, int]) -> tuple[list[dict], pd.DataFrame]:
    """Per size (ascending): the seeds, each AtteNT comparison of ``AGAINST`` (a ``Paired``, judged
    in the size's whole family) and AtteNT's summary row; and the trends across the sizes."""
    runs = runs[runs["workload"].isin(list(sizes))]
    twice = runs[runs.duplicated(["workload", "method", "seed"], keep=False)]
    if not twice.empty:
        keys = sorted(set(zip(twice.workload, twice.method, twice.seed.astype(int))))
        raise ValueError(f"{len(keys)} runs (workload, method, seed) in two tables, e.g. {keys[:2]}: join each seed once")
    lower = bool(runs["lower_is_better"].iloc[0])
    rows = []
    for workload, per_run in sorted(runs.groupby("workload"), key=lambda item: sizes[item[0]]):
        summary = summarize(per_run)
        margin = float(per_run["margin"].iloc[0])
        finals = {p.method: p for p in paired_comparisons(per_run, summary, lower, margin) if p.quantity == FINAL}
        rows.append({"workload": workload, "size": sizes[workload], "metric": per_run["metric"].iloc[0],
                     "seeds": sorted(int(s) for s in per_run.loc[per_run["method"].eq(ATTENT), "seed"]),
                     "finals": {m: finals[m] for m in AGAINST if m in finals},
                     "attent": summary.set_index("method").loc[ATTENT]})
    return rows, size_trends(runs, sizes, lower)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", help="a saved data_size.csv: each workload's training-set size")
    parser.add_argument("--sizes", dest="more_sizes", action="append", default=[], metavar="CSV",
                        help="another saved data_size.csv, for a size a store of its own measured (repeatable)")
    parser.add_argument("tables", nargs="+", help="per_run.csv files")
    parser.add_argument("--figure", metavar="PNG", help="also draw the report's size figure from the joined seeds")
    args = parser.parse_args(argv)
    sizes = {row["workload"]: int(row["size"])
             for path in [args.sizes, *args.more_sizes] for row in pd.read_csv(path).to_dict("records")}
    try:
        rows, trends = judged(pd.concat([pd.read_csv(path) for path in args.tables], ignore_index=True), sizes)
    except ValueError as error:
        sys.exit(str(error))
    print("| training images | seeds | " + " | ".join(f"AtteNT − {label}, final" for label in AGAINST.values())
          + " | realized saving |")
    print("|---:|---|" + "---|" * len(AGAINST) + "---:|")
    for row in rows:
        cells = [f"{p.mean:+.4f} [{p.low:+.4f}, {p.high:+.4f}] {p.verdict}" if (p := row["finals"].get(m)) else "—"
                 for m in AGAINST]
        attent = row["attent"]
        print(f"| {row['size']} | {', '.join(map(str, row['seeds']))} | " + " | ".join(cells)
              + f" | {attent['realized_saving']:.2f} [{attent['realized_saving_low']:.2f}, "
                f"{attent['realized_saving_high']:.2f}] |")
    print()
    print(trend_markdown(trends))
    if args.figure:
        size_figure(figure_table(rows), trends).savefig(args.figure, dpi=110)


def figure_table(rows: list[dict]) -> pd.DataFrame:
    """``judged``'s rows in the columns ``size_figure`` reads (the cost to the target left out)."""
    table = []
    for row in rows:
        attent = row["attent"]
        cells = {"size": row["size"], "metric": row["metric"],
                 **{f"realized_saving{end}": attent[f"realized_saving{end}"] for end in ("", "_low", "_high")}}
        for paired in row["finals"].values():
            cells.update(comparison_cells(paired))
        table.append(cells)
    return pd.DataFrame(table)


if __name__ == "__main__":
    main()
