"""Verdicts for an older report's saved runs under today's rules: the ``per_run.csv`` a
time-to-accuracy report wrote, AtteNT's final metric against each method's, paired by seed,
Holm-adjusted within each workload (``judge_family``), "equivalent" by a paired TOST within the
workload's margin. Such benchmarks ran without the 2E control, so their plateau is undetermined.

    python -m attent.analysis.time_to_accuracy.reanalyse \
        benchmarks/results/time_to_accuracy_small/per_run.csv --margin fmnist-vit=0.01
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from attent.analysis.stats import FINAL
from attent.analysis.time_to_accuracy.results import paired_comparisons, summarize


def reanalyse(per_run: pd.DataFrame, margins: dict[str, float]) -> pd.DataFrame:
    """One row per workload and method: the paired difference, its Holm-step interval and verdict,
    by the report's own ``paired_comparisons`` (families, budget matches, budgets) on the saved runs."""
    rows = []
    for workload, runs in per_run.groupby("workload", sort=False):
        margin = margins.get(workload, float(runs["tolerance"].iloc[0]))
        lower = bool(runs["lower_is_better"].iloc[0])
        for p in paired_comparisons(runs, summarize(runs), lower, margin):
            if p.quantity == FINAL:
                rows.append(
                    {
                        "workload": workload,
                        "method": p.method,
                        "budget_match": p.budget_match,
                        "seeds": p.seeds,
                        "attent_minus_method": p.mean,
                        "holm_level": p.level,
                        "low": p.low,
                        "high": p.high,
                        "p_holm": p.p_holm,
                        "margin": p.margin,
                        "p_tost_holm": p.p_tost_holm,
                        "verdict": p.verdict,
                    }
                )
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    lines = [
        "| workload | method | seeds | AtteNT − method | Holm-step interval | p (Holm) | TOST p (Holm), margin "
        "| verdict |",
        "|---|---|---:|---:|---|---:|---|---|",
    ]
    for r in table.to_dict("records"):
        interval = "—" if r["low"] != r["low"] else f"{r['holm_level']:.2%}: [{r['low']:+.4f}, {r['high']:+.4f}]"
        tost = "—" if r["p_tost_holm"] != r["p_tost_holm"] else f"{r['p_tost_holm']:.3g}, ± {r['margin']:.4g}"
        p_holm = "—" if r["p_holm"] != r["p_holm"] else f"{r['p_holm']:.3g}"
        lines.append(
            f"| {r['workload']} | {r['method']} | {r['seeds']} | {r['attent_minus_method']:+.4f} | {interval} "
            f"| {p_holm} | {tost} | {r['verdict']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("per_run", type=Path, help="an older report's per_run.csv")
    parser.add_argument("--margin", action="append", default=[], help="workload=margin (default: its tolerance)")
    parser.add_argument("--out", type=Path, help="write the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    margins = {k: float(v) for k, v in (item.split("=", 1) for item in args.margin)}
    text = markdown(reanalyse(pd.read_csv(args.per_run), margins))
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
