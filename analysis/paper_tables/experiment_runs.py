"""An experiment's finished training runs (a sweep's), the metric histories the figures read, which
metric a table reports, and the runs' names for humans: labels, method and strategy names, and what
tells apart configurations that share a label (their identity params).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from attent import contract  # the names the engine logs (standard library only: no engine import)
from attent.analysis import ReportError
from attent.analysis.cell_format import MISSING
from attent.analysis.mlflow_runs import (
    IDENTITY,
    LABEL,
    METHOD,
    PARENT_RUN_ID,
    ROLE,
    STRATEGY,
    runs_frame,
    search_all_runs,
)
from mlflow import MlflowClient

# Per-epoch histories the figures read (plus the primary downstream metric).
HISTORY_KEYS = (
    contract.TRAIN_LOSS,
    contract.TIME_TOTAL,
    contract.TIME_METHOD,
    *(contract.time_metric(part) for part in contract.METHOD_TIME_PARTS),
)


@dataclass(frozen=True)
class ExperimentRuns:
    runs: pd.DataFrame  # finished training runs, one row each
    sweep_parent_ids: list[str]  # sweep parents with at least one of those runs as child
    unfinished: int  # training runs skipped because they have not finished (running, failed)
    killed: int  # training runs skipped because they ended KILLED (their driver died mid-run)


def load_experiment_runs(client: MlflowClient, experiment: str) -> ExperimentRuns:
    """Finished training runs of ``experiment`` and the sweep parents they belong to. Runs
    without an ``attent.role`` of trial/run (not logged by the engine) are ignored."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ReportError(f"MLflow experiment {experiment!r} does not exist (tracking URI: {client.tracking_uri}).")
    everything = runs_frame(search_all_runs(client, found.experiment_id))
    if everything.empty:
        raise ReportError(f"MLflow experiment {experiment!r} has no runs yet.")
    is_sweep = everything[ROLE].eq(contract.ROLE_SWEEP)
    training = everything[everything[ROLE].isin(contract.TRAINING_ROLES)]  # not other tools' runs
    finished = training[training["status"].eq(contract.STATUS_FINISHED)].reset_index(drop=True)
    killed = int(training["status"].eq(contract.STATUS_KILLED).sum())
    unfinished = len(training) - len(finished) - killed
    if finished.empty:
        raise ReportError(
            f"MLflow experiment {experiment!r} has no finished training runs "
            f"({unfinished} unfinished, {killed} killed)."
        )
    parents = everything.loc[is_sweep, "run_id"]
    parents = parents[parents.isin(finished[PARENT_RUN_ID])].tolist()
    return ExperimentRuns(finished, parents, unfinished, killed)


def load_histories(client: MlflowClient, run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    """Long frame ``run_id, key, step, value`` of the metric histories (step = epoch)."""
    rows = [
        (run_id, key, metric.step, metric.value)
        for run_id in run_ids
        for key in keys
        for metric in client.get_metric_history(run_id, key)
    ]
    return pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])


# Downstream jobs in the order the paper's pretraining tables (3, 7, 8) report them; other jobs
# follow by name.
DOWNSTREAM_JOB_ORDER = ("classification", "semseg", "depth")


def downstream_metrics(runs: pd.DataFrame) -> list[str]:
    """Final results some run logged: first its downstream jobs' (``downstream.<job>.<metric>``,
    what a pretraining table is about) by job (DOWNSTREAM_JOB_ORDER, then by name), then its own
    ``eval_*`` metrics; within a job and among the ``eval_*`` ones, higher-is-better first, then
    by name."""
    logged = [c.removeprefix("metrics.") for c in runs.columns if c.startswith("metrics.") and runs[c].notna().any()]
    jobs = [name for name in logged if name.startswith(contract.DOWNSTREAM_PREFIX)]
    evals = [name for name in logged if name.startswith(contract.EVAL_PREFIX)]

    def job_key(name: str) -> tuple:
        job, _ = split_downstream(name)
        known = job in DOWNSTREAM_JOB_ORDER
        return (not known, DOWNSTREAM_JOB_ORDER.index(job) if known else 0, job, contract.lower_is_better(name), name)

    return [*sorted(jobs, key=job_key), *sorted(evals, key=lambda name: (contract.lower_is_better(name), name))]


def split_downstream(metric_name: str) -> tuple[str, str]:
    """``downstream.semseg.miou`` -> ``("semseg", "miou")``."""
    job, _, name = metric_name.removeprefix(contract.DOWNSTREAM_PREFIX).partition(".")
    return job, name


def primary_metric(runs: pd.DataFrame) -> str | None:
    """The downstream metric the figures plot: the first higher-is-better one (a downstream
    job's where runs carry them, else an ``eval_*`` one)."""
    candidates = [m for m in downstream_metrics(runs) if not contract.lower_is_better(m)]
    return candidates[0] if candidates else None


# --- naming runs for humans ----------------------------------------------------------------
STRATEGY_NAMES = {"random": "Random", "hard": "Hard", "soft": "Soft", contract.NONE: "No selection"}
METHOD_NAMES = {
    contract.METHOD_ATTENT: "AtteNT",
    "class_weight": "Class weight",
    "group_weight": "Group weight",
    "gradnorm": "GradNorm",
    "infobatch": "InfoBatch",
    contract.METHOD_FULL: "Full data",
}
SHORT_PREFIX = "selection."  # dropped from field names in labels: temperature=0.5


def is_full(runs: pd.DataFrame) -> pd.Series:
    return runs[METHOD].eq(contract.METHOD_FULL)


def label_names(runs: pd.DataFrame) -> pd.Series:
    """The engine's label of each run's selection config, else the method's name."""
    names = runs[LABEL].fillna(runs[METHOD].map(METHOD_NAMES)).fillna(runs[METHOD])
    return names.fillna(MISSING)


def config_names(runs: pd.DataFrame) -> pd.Series:
    """One name per configuration: its label, plus, where runs sharing a label differ in more
    than the seed, the fields that tell them apart: ``Soft · ... (temperature=0.5)``."""
    names = label_names(runs)
    detail = config_details(runs, names)
    return names.where(detail.eq(""), names + " (" + detail + ")")


def strategy_names(runs: pd.DataFrame) -> pd.Series:
    """Strategy per run; the full-data baseline selects nothing whatever its tag says."""
    strategy = runs[STRATEGY].where(~is_full(runs), contract.NONE)
    return strategy.map(STRATEGY_NAMES).fillna(strategy).fillna(MISSING)


# --- run identity: which runs are seeds of one configuration --------------------------------
def identity_columns(runs: pd.DataFrame) -> list[str]:
    """The params columns that are part of a run's identity (not seed, not plumbing)."""
    return [c for c in runs.columns if c.startswith("params.") and contract.is_identity_key(c.removeprefix("params."))]


def varying_fields(runs: pd.DataFrame) -> list[str]:
    """Identity params columns whose value differs between some of ``runs``."""
    values = runs[identity_columns(runs)].astype(str)  # missing compares as "nan"
    return [column for column in values.columns if values[column].nunique() > 1]


def field_name(column: str) -> str:
    """``params.selection.temperature`` -> ``temperature``; ``params.task.model`` stays
    ``task.model``."""
    return column.removeprefix("params.").removeprefix(SHORT_PREFIX)


def describe_fields(runs: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Per run, ``temperature=0.5, task.model=X`` over ``columns``."""
    detail = pd.Series("", index=runs.index, dtype=object)
    for column in columns:
        text = field_name(column) + "=" + runs[column].fillna(MISSING).astype(str)
        detail = detail.where(detail.eq(""), detail + ", ") + text
    return detail


def config_details(runs: pd.DataFrame, groups: pd.Series) -> pd.Series:
    """Per run: what tells its configuration apart from the others in its group (e.g. a table
    row), as ``temperature=0.5``; empty where the group holds a single configuration or the run
    has no identity tag (runs logged before it existed keep the group's grouping)."""
    detail = pd.Series("", index=runs.index, dtype=object)
    with_identity = runs[runs[IDENTITY].notna()]
    for _, members in with_identity.groupby(groups.loc[with_identity.index]):
        if members[IDENTITY].nunique() < 2:
            continue
        columns = varying_fields(members)
        detail[members.index] = (
            describe_fields(members, columns) if columns else "config " + members[IDENTITY].astype(str)
        )
    return detail
