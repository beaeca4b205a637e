"""Tables, figures and verdicts of an MLflow experiment, or of several benchmarks' runs joined.

    attent report --experiment NAME [--out DIR] [--tracking-uri URI] [--kinds ablation ratio ...]
                  [--margin M] [--no-log-to-parent]
    attent report [--experiment NAME] --with SOURCE [--with SOURCE ...] [--size WORKLOAD=N ...]

An experiment of `attent bench` gets its time-to-accuracy report, and its data-size view where its
spec sets ``size_axis`` (``time_to_accuracy.report.benchmark_report``); any other experiment gets
the paper's tables (``paper_tables.report.build_report``). With ``--with``, the runs of several
benchmarks (other experiments or stores, or the ``per_run.csv`` their reports saved) are joined and
judged as one (``time_to_accuracy.data_size_joined``).

``add_arguments`` is `attent report`'s one parser; ``run`` makes the report it asks for. The parser
needs the standard library alone: the CLI builds every command's parser at start-up, and the
reports (pandas, MLflow) are imported when one runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from attent.analysis import ReportError
from attent.analysis.paper_tables import TABLE_KINDS

SUMMARY = "tables and figures of an MLflow experiment, or of several benchmarks joined"
NEEDS_A_SOURCE = "attent report needs --experiment NAME, or --with SOURCE to join saved results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`attent report`'s description and options."""
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument("--experiment", help="MLflow experiment name (optional with --with)")
    parser.add_argument("--out", default="reports", help="output folder (default: reports)")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)",
    )
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=TABLE_KINDS,
        metavar="KIND",
        help=f"the paper tables' layouts to build, of {', '.join(TABLE_KINDS)} (default: those the runs fill)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=None,
        help="equivalence margin of the verdicts (default: 0.01 for accuracy-like metrics, none for "
        "lower-is-better ones; a benchmark's: the margins its spec declared)",
    )
    parser.add_argument(
        "--no-log-to-parent",
        action="store_true",
        help="do not log the paper tables' files as artifacts of the sweep parent run",
    )
    parser.add_argument(
        "--with",
        dest="sources",
        action="append",
        default=[],
        metavar="SOURCE",
        help="join another benchmark, read as one with the experiment's: EXPERIMENT[@TRACKING_URI] "
        "or the per_run.csv a report saved (repeatable); the joined data-size view goes to "
        "<out>/<experiment, or joined>/",
    )
    parser.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="WORKLOAD=N",
        help="with --with: a workload's training-set size where no source gives it (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    """The report ``args`` (``add_arguments``') ask for, printed and written under ``args.out``. A
    problem the user can fix (an unknown experiment, no finished runs, MLflow's refusal) is one line
    on stderr and exit status 1."""
    from mlflow.exceptions import MlflowException

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a report reads small files
    try:
        if not args.experiment and not args.sources:
            raise ReportError(NEEDS_A_SOURCE)
        if args.sources:
            folder = joined_report(args.experiment, args.sources, args.tracking_uri, args.out, args.size, args.margin)
            print((folder / "data_size.md").read_text() + f"\nreport: {folder}/data_size.md")
        else:
            experiment_report(args)
    except (ReportError, MlflowException) as error:
        print(f"attent report: {error}", file=sys.stderr)
        return 1
    return 0


def experiment_report(args: argparse.Namespace) -> None:
    """An `attent bench` experiment's own report, rebuilt; else the paper's tables."""
    from attent.analysis.paper_tables.report import build_report
    from attent.analysis.time_to_accuracy.report import benchmark_report
    from attent.analysis.time_to_accuracy.runs import is_benchmark
    from mlflow import MlflowClient

    if is_benchmark(MlflowClient(args.tracking_uri), args.experiment):
        folder, size_view = benchmark_report(args.experiment, args.tracking_uri, args.out, args.margin)
        print(f"\nreport: {folder}/time_to_accuracy.md" + (f", {folder}/data_size/data_size.md" if size_view else ""))
    else:
        build_report(
            args.experiment,
            args.tracking_uri,
            args.out,
            args.kinds,
            log_to_parent=not args.no_log_to_parent,
            margin=args.margin,
        )


def joined_report(
    experiment: str | None,
    sources: list[str],
    tracking_uri: str | None,
    out: str,
    sizes: list[str],
    margin: float | None,
) -> Path:
    """``attent report --with``: the experiment's runs (if named) and every source's, judged as
    one benchmark (``time_to_accuracy.data_size_joined``), in ``<out>/<experiment, or "joined">/``."""
    from attent.analysis.paper_tables.report import slug
    from attent.analysis.time_to_accuracy.data_size_joined import build_joined_report, read_source

    try:
        given = {workload: int(size) for workload, size in (item.split("=", 1) for item in sizes)}
    except ValueError:
        raise ReportError(f"--size takes WORKLOAD=N (a whole number of training samples), not {sizes}") from None
    name = experiment or "joined"
    read = [read_source(source, tracking_uri) for source in ([experiment] if experiment else []) + sources]
    return build_joined_report(name, read, Path(out) / slug(name), sizes=given, margin=margin)
