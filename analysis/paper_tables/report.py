"""An experiment's report: the paper's tables (Markdown, CSV, LaTeX) and figures (PNG) from its
MLflow runs, written to ``out_dir/<experiment>/``, printed, and logged under ``report/`` to the
sweep parent run(s) the runs belong to; ``attent report --experiment NAME`` builds it.

Each table also gets its regime check and verdicts (``verdicts``): the plateau verdict of full data by
the plateau control (full data for twice the table's epochs, which is no row of the table), a 95 %
seed interval per row, and Holm-adjusted verdicts against full data (and AtteNT, in the comparison
table).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from attent.analysis import ReportError
from attent.analysis.mlflow_runs import REPORT_ARTIFACTS, TASK
from attent.analysis.paper_tables import figures
from attent.analysis.paper_tables.experiment_runs import (
    HISTORY_KEYS,
    load_experiment_runs,
    load_histories,
    primary_metric,
)
from attent.analysis.paper_tables.layouts import TABLE_BUILDERS, applicable_kinds, plateau_controls
from attent.analysis.paper_tables.table_files import to_csv, to_latex, to_markdown
from attent.analysis.paper_tables.table_numbers import CONFIG_HEADER, Table
from attent.analysis.paper_tables.verdicts import judge_table
from matplotlib.figure import Figure
from mlflow import MlflowClient

INDEX_FILE = "report.md"


@dataclass(frozen=True)
class Report:
    experiment: str
    out_dir: Path  # where the files were written
    tables: list[Table]
    figures: list[Path]
    files: list[Path]  # every file written, tables and figures included
    logged_to: list[str]  # sweep parent run ids that received the files as artifacts
    runs: int  # finished training runs reported
    unfinished: int  # training runs left out because they have not finished
    killed: int  # training runs left out because they ended KILLED (their driver died)


def slug(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("_") or "experiment"


def runs_by_task(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Tasks are never mixed in one table (their baselines and metrics differ)."""
    tasks = runs[TASK].fillna("unknown")
    return {task: runs[tasks.eq(task)] for task in sorted(set(tasks))}


def task_tables(
    runs: pd.DataFrame, controls: pd.DataFrame, task: str, suffix: str, kinds: list[str] | None, margin: float | None
) -> list[Table]:
    """The task's tables from ``runs``, each judged with the plateau ``controls``."""
    tables = [
        judge_table(TABLE_BUILDERS[kind](runs, name=kind + suffix), controls, margin)
        for kind in (kinds or applicable_kinds(runs))
    ]
    if not suffix:
        return tables
    return [dataclasses.replace(t, title=f"{t.title} ({task})") for t in tables]


def task_figures(runs: pd.DataFrame, histories: pd.DataFrame, suffix: str) -> dict[str, Figure]:
    """Figures by file stem; those the runs cannot fill are left out."""
    metric = primary_metric(runs)
    candidates = {
        "fig_training_time": figures.training_time_figure(runs),
        "fig_loss_curves": figures.loss_curves_figure(runs, histories),
    }
    if metric is not None:
        reach = figures.time_to_reach_baseline(runs, histories, metric)
        candidates["fig_sample_ratio"] = figures.sample_ratio_figure(runs, metric)
        candidates["fig_time_to_baseline"] = figures.time_to_baseline_figure(reach, metric)
    return {stem + suffix: fig for stem, fig in candidates.items() if fig is not None}


def write_table(table: Table, out: Path) -> list[Path]:
    """The table as Markdown, CSV and LaTeX, and its comparisons (p, Holm p, intervals) as CSV."""
    paths = []
    for extension, render in (("md", to_markdown), ("csv", to_csv), ("tex", to_latex)):
        path = out / f"{table.name}.{extension}"
        path.write_text(render(table) + ("\n" if extension == "md" else ""), encoding="utf-8")
        paths.append(path)
    if table.comparisons:
        path = out / f"{table.name}_comparisons.csv"
        pd.DataFrame([p.record() for p in table.comparisons]).to_csv(path, index=False, float_format="%.10g")
        paths.append(path)
    return paths


def index_markdown(
    experiment: str, tables: list[Table], figure_paths: list[Path], runs: int, unfinished: int, killed: int
) -> str:
    lines = [
        f"# Report: {experiment}",
        "",
        f"{runs} finished training runs; {unfinished} unfinished and {killed} killed runs "
        "(their driver died mid-run) left out. "
        "Cells are mean ± std over seeds (sample std, ddof=1); n = runs; "
        "bold = best in its column; — = no run. Runs differing in more than the seed are "
        f"never averaged: the {CONFIG_HEADER} column names what tells them apart.",
        "",
        "Method cost = training + scoring + selection seconds (evaluation, checkpointing "
        "and start-up apart; Eval is the evaluation time). Against the full-data row "
        "trained in the same context: Δ cost = method cost change; ideal saving = "
        "1 − samples back-propagated / full data's; realized saving = 1 − method cost / "
        "full data's; realized / ideal = how much of the sample saving became time "
        "saved. Selected ratio = mean over epochs of the share of the data trained on.",
        "",
        "Under each table: whether full data had plateaued, by the plateau control (full data "
        "for twice the table's epochs, no row of the table); the 95 % interval over seeds of "
        "each row's mean; and verdicts against full data (and AtteNT, in the comparison table) "
        "from Holm-adjusted paired tests, as in the time-to-accuracy report.",
        "",
    ]
    for table in tables:
        csv, tex = f"{table.name}.csv", f"{table.name}.tex"
        lines += [f"## {table.title}", "", to_markdown(table), "", f"Files: [{csv}]({csv}), [{tex}]({tex})", ""]
    lines += [f"![{path.stem}]({path.name})\n" for path in figure_paths]
    return "\n".join(lines)


def build_report(
    experiment: str,
    tracking_uri: str | None = None,
    out_dir: str | Path = "reports",
    kinds: list[str] | None = None,
    log_to_parent: bool = True,
    margin: float | None = None,
) -> Report:
    """Tables and figures for every finished training run of ``experiment``.

    ``kinds`` picks table layouts (see ``TABLE_BUILDERS``); by default those the runs fill.
    ``margin``: the equivalence margin of the verdicts (default 0.01 for accuracy-like metrics).
    Raises ReportError for problems the user can fix (unknown experiment, no finished runs).
    """
    unknown = sorted(set(kinds or []) - set(TABLE_BUILDERS))
    if unknown:
        raise ReportError(f"unknown table kind(s) {unknown}; choose from {sorted(TABLE_BUILDERS)}")
    client = MlflowClient(tracking_uri)
    loaded = load_experiment_runs(client, experiment)
    by_task = runs_by_task(loaded.runs)
    metrics = sorted({m for runs in by_task.values() if (m := primary_metric(runs))})
    histories = load_histories(client, loaded.runs["run_id"].tolist(), [*HISTORY_KEYS, *metrics])

    out = Path(out_dir) / slug(experiment)
    out.mkdir(parents=True, exist_ok=True)
    tables: list[Table] = []
    files: list[Path] = []
    figure_paths: list[Path] = []
    for task, task_runs in by_task.items():
        suffix = f"_{slug(task)}" if len(by_task) > 1 else ""
        control = plateau_controls(task_runs)  # read by the verdicts, never a row or a curve
        runs, controls = task_runs[~control], task_runs[control]
        for table in task_tables(runs, controls, task, suffix, kinds, margin):
            tables.append(table)
            files += write_table(table, out)
        task_histories = histories[histories["run_id"].isin(runs["run_id"])]
        for stem, fig in task_figures(runs, task_histories, suffix).items():
            fig.savefig(out / f"{stem}.png", dpi=120, bbox_inches="tight")  # long row labels
            figure_paths.append(out / f"{stem}.png")
    files += figure_paths
    index = index_markdown(experiment, tables, figure_paths, len(loaded.runs), loaded.unfinished, loaded.killed)
    (out / INDEX_FILE).write_text(index, encoding="utf-8")
    files.append(out / INDEX_FILE)
    print(index)

    logged_to = loaded.sweep_parent_ids if log_to_parent else []
    for parent_id in logged_to:  # this run's files only, not leftovers of earlier reports
        for path in files:
            client.log_artifact(parent_id, str(path), artifact_path=REPORT_ARTIFACTS)
    print(
        f"\nWrote {len(files)} files to {out}"
        + (f"; logged them to sweep run(s) {', '.join(logged_to)}" if logged_to else "")
    )
    return Report(
        experiment, out, tables, figure_paths, files, logged_to, len(loaded.runs), loaded.unfinished, loaded.killed
    )
