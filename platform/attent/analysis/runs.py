"""Load an experiment's runs from MLflow into flat DataFrames.

One row per training run. Columns follow MLflow's own ``search_runs`` naming, so tags, params and
metrics never collide: ``tags.attent.method``, ``params.seed``, ``metrics.time_method_s``; every
name comes from ``attent.contract``, the names the engine logs. Sweep parent runs are kept
apart: they hold no results, only the report's artifacts.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Run

from attent import contract  # the names the engine logs (standard library only: no engine import)


def tag(name: str) -> str:
    """Frame column of a tag: ``attent.method`` -> ``tags.attent.method``."""
    return f"tags.{name}"


def param(key: str) -> str:
    return f"params.{key}"


def metric(name: str) -> str:
    return f"metrics.{name}"


TASK = tag(contract.TAG_TASK)
METHOD = tag(contract.TAG_METHOD)
STRATEGY = tag(contract.TAG_STRATEGY)
RATIO_SCHEDULE = tag(contract.TAG_RATIO_SCHEDULE)
INTERVAL_SCHEDULE = tag(contract.TAG_INTERVAL_SCHEDULE)
LABEL = tag(contract.TAG_LABEL)
ROLE = tag(contract.TAG_ROLE)
IDENTITY = tag(contract.TAG_IDENTITY)
PARENT_RUN_ID = tag(contract.TAG_PARENT_RUN_ID)
SEED = param(contract.PARAM_SEED)
RATIO_KIND = param(contract.PARAM_RATIO_KIND)
RATIO_START = param(contract.PARAM_RATIO_START)  # a fixed schedule's ratio
EPOCHS = param(contract.PARAM_EPOCHS)

METHOD_COST = metric(contract.TIME_METHOD)  # training + scoring + selection seconds
METHOD_COST_PARTS = tuple(metric(contract.time_metric(part)) for part in contract.METHOD_TIME_PARTS)
SELECTED_RATIO = metric(contract.MEAN_SELECTED_RATIO)
BACKPROPAGATED = metric(contract.SAMPLES_BACKPROPAGATED)
NUMERIC_COLUMNS = (SEED, RATIO_START, METHOD_COST, *METHOD_COST_PARTS, SELECTED_RATIO,
                   BACKPROPAGATED)
CONTRACT_COLUMNS = (TASK, METHOD, STRATEGY, RATIO_SCHEDULE, INTERVAL_SCHEDULE, LABEL, ROLE,
                    IDENTITY, PARENT_RUN_ID, RATIO_KIND, *NUMERIC_COLUMNS)

MISSING = "—"  # how tables and figures show a value nobody logged
REPORT_ARTIFACTS = "report"  # where a report logs its files on the parent run of its runs
# Per-epoch histories the figures read (plus the primary downstream metric).
HISTORY_KEYS = (contract.TRAIN_LOSS, contract.TIME_TOTAL, contract.TIME_METHOD,
                *(contract.time_metric(part) for part in contract.METHOD_TIME_PARTS))

_PAGE_SIZE = 1000


class ReportError(Exception):
    """A problem the user can fix (unknown experiment, no finished runs, bad kind)."""


@dataclass(frozen=True)
class ExperimentRuns:
    runs: pd.DataFrame  # finished training runs, one row each
    sweep_parent_ids: list[str]  # sweep parents with at least one of those runs as child
    unfinished: int  # training runs skipped because they have not finished (running, failed)
    killed: int  # training runs skipped because they ended KILLED (their driver died mid-run)


def run_record(run: Run) -> dict[str, object]:
    """Flatten one MLflow run into ``run_id``/``status`` + prefixed tags, params and metrics."""
    record: dict[str, object] = {"run_id": run.info.run_id, "status": run.info.status}
    record.update({f"tags.{k}": v for k, v in run.data.tags.items()})
    record.update({f"params.{k}": v for k, v in run.data.params.items()})
    record.update({f"metrics.{k}": v for k, v in run.data.metrics.items()})
    return record


def runs_frame(runs: list[Run]) -> pd.DataFrame:
    """Flat frame of runs with every contract column present (missing values as NaN), so
    runs from older engine versions or partial sweeps never raise KeyError downstream."""
    frame = pd.DataFrame([run_record(run) for run in runs])
    expected = ("run_id", "status", *CONTRACT_COLUMNS)
    frame = frame.reindex(columns=frame.columns.union(expected, sort=False))
    # Built as one frame from a dict of columns: assigning columns one by one leaves a frame of
    # hundreds of blocks (engine runs log hundreds of params), on which every later insert warns.
    columns = {c: frame[c].astype(object) if c.startswith(("tags.", "params.")) else frame[c]
               for c in frame.columns}  # text columns as object: all-missing ones would be float
    columns.update({c: pd.to_numeric(columns[c], errors="coerce") for c in NUMERIC_COLUMNS})
    frame = pd.DataFrame(columns, index=frame.index)
    frame[METHOD_COST] = method_cost(frame)
    return frame


def method_cost(frame: pd.DataFrame) -> pd.Series:
    """The logged method cost; for runs from before it was logged, the sum of its parts
    (training + scoring + selection seconds; missing where training time is missing too)."""
    names = [contract.TIME_METHOD, *(contract.time_metric(part) for part in contract.METHOD_TIME_PARTS)]
    values = frame.reindex(columns=[metric(name) for name in names]).set_axis(names, axis=1)
    return values.apply(lambda row: contract.method_cost(row.to_dict()), axis=1, result_type="reduce")


def search_all_runs(client: MlflowClient, experiment_id: str) -> list[Run]:
    runs: list[Run] = []
    page_token = None
    while True:
        page = client.search_runs([experiment_id], max_results=_PAGE_SIZE, page_token=page_token)
        runs.extend(page)
        page_token = page.token
        if not page_token:
            return runs


def load_experiment_runs(client: MlflowClient, experiment: str) -> ExperimentRuns:
    """Finished training runs of ``experiment`` and the sweep parents they belong to. Runs
    without an ``attent.role`` of trial/run (not logged by the engine) are ignored."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ReportError(f"MLflow experiment {experiment!r} does not exist "
                          f"(tracking URI: {client.tracking_uri}).")
    everything = runs_frame(search_all_runs(client, found.experiment_id))
    if everything.empty:
        raise ReportError(f"MLflow experiment {experiment!r} has no runs yet.")
    is_sweep = everything[ROLE].eq(contract.ROLE_SWEEP)
    training = everything[everything[ROLE].isin(contract.TRAINING_ROLES)]  # not other tools' runs
    finished = training[training["status"].eq(contract.STATUS_FINISHED)].reset_index(drop=True)
    killed = int(training["status"].eq(contract.STATUS_KILLED).sum())
    unfinished = len(training) - len(finished) - killed
    if finished.empty:
        raise ReportError(f"MLflow experiment {experiment!r} has no finished training runs "
                          f"({unfinished} unfinished, {killed} killed).")
    parents = everything.loc[is_sweep, "run_id"]
    parents = parents[parents.isin(finished[PARENT_RUN_ID])].tolist()
    return ExperimentRuns(finished, parents, unfinished, killed)


def load_histories(client: MlflowClient, run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    """Long frame ``run_id, key, step, value`` of the metric histories (step = epoch)."""
    rows = [(run_id, key, metric.step, metric.value)
            for run_id in run_ids for key in keys
            for metric in client.get_metric_history(run_id, key)]
    return pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])


# Downstream jobs in the order the paper's pretraining tables (3, 5, 6) report them; other jobs
# follow by name.
DOWNSTREAM_JOB_ORDER = ("classification", "semseg", "depth")


def downstream_metrics(runs: pd.DataFrame) -> list[str]:
    """Final results some run logged: first its downstream jobs' (``downstream.<job>.<metric>``,
    what a pretraining table is about) by job (DOWNSTREAM_JOB_ORDER, then by name), then its own
    ``eval_*`` metrics; within a job and among the ``eval_*`` ones, higher-is-better first, then
    by name."""
    logged = [c.removeprefix("metrics.") for c in runs.columns
              if c.startswith("metrics.") and runs[c].notna().any()]
    jobs = [name for name in logged if name.startswith(contract.DOWNSTREAM_PREFIX)]
    evals = [name for name in logged if name.startswith(contract.EVAL_PREFIX)]

    def job_key(name: str) -> tuple:
        job, _ = split_downstream(name)
        known = job in DOWNSTREAM_JOB_ORDER
        return (not known, DOWNSTREAM_JOB_ORDER.index(job) if known else 0, job,
                contract.lower_is_better(name), name)
    return [*sorted(jobs, key=job_key),
            *sorted(evals, key=lambda name: (contract.lower_is_better(name), name))]


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
METHOD_NAMES = {contract.METHOD_ATTENT: "AtteNT", "class_weight": "Class weight",
                "group_weight": "Group weight", "gradnorm": "GradNorm", "infobatch": "InfoBatch",
                "random": "Random subset", contract.METHOD_FULL: "Full data"}
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
    return [c for c in runs.columns
            if c.startswith("params.") and contract.is_identity_key(c.removeprefix("params."))]


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
        detail[members.index] = (describe_fields(members, columns) if columns
                                 else "config " + members[IDENTITY].astype(str))
    return detail
