"""Load an experiment's runs from MLflow into flat DataFrames.

One row per training run. Columns follow MLflow's own ``search_runs`` naming, so tags, params and
metrics never collide: ``tags.attent.method``, ``params.seed``, ``metrics.time_total_s``. Sweep
parent runs are kept apart: they hold no results, only the report's artifacts.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Run

# Column names of the contract the engine logs (see the platform's MLflow contract).
TASK = "tags.attent.task"
METHOD = "tags.attent.method"
STRATEGY = "tags.attent.strategy"
RATIO_SCHEDULE = "tags.attent.ratio_schedule"
INTERVAL_SCHEDULE = "tags.attent.interval_schedule"
LABEL = "tags.attent.label"
ROLE = "tags.attent.role"
PARENT_RUN_ID = "tags.mlflow.parentRunId"
SEED = "params.seed"
RATIO_KIND = "params.selection.ratio.kind"
RATIO_VALUE = "params.selection.ratio.value"

TIME = "metrics.time_total_s"
SELECTED_RATIO = "metrics.mean_selected_ratio"
CONTRACT_COLUMNS = (TASK, METHOD, STRATEGY, RATIO_SCHEDULE, INTERVAL_SCHEDULE, LABEL, ROLE,
                    PARENT_RUN_ID, SEED, RATIO_KIND, RATIO_VALUE, TIME, SELECTED_RATIO)

TRAINING_ROLES = ("trial", "run")
FULL_METHOD = "full"  # the no-selection baseline every table compares against
DOWNSTREAM_PREFIX = "eval_"
MISSING = "—"  # how tables and figures show a value nobody logged
HISTORY_KEYS = ("train_loss", "time_total_s")  # plus the primary downstream metric

_PAGE_SIZE = 1000


class ReportError(Exception):
    """A problem the user can fix (unknown experiment, no finished runs, bad kind)."""


@dataclass(frozen=True)
class ExperimentRuns:
    runs: pd.DataFrame  # finished training runs, one row each
    sweep_parent_ids: list[str]  # sweep parents with at least one of those runs as child
    unfinished: int  # training runs skipped because they are not FINISHED


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
    texts = [c for c in frame.columns if c.startswith(("tags.", "params."))]
    frame[texts] = frame[texts].astype(object)  # all-missing columns would otherwise be float
    for column in (SEED, RATIO_VALUE, TIME, SELECTED_RATIO):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame


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
    is_sweep = everything[ROLE].eq("sweep")
    training = everything[everything[ROLE].isin(TRAINING_ROLES)]  # not other tools' runs
    finished = training[training["status"].eq("FINISHED")].reset_index(drop=True)
    if finished.empty:
        raise ReportError(f"MLflow experiment {experiment!r} has no finished training runs "
                          f"({len(training)} unfinished).")
    parents = everything.loc[is_sweep, "run_id"]
    parents = parents[parents.isin(finished[PARENT_RUN_ID])].tolist()
    return ExperimentRuns(finished, parents, len(training) - len(finished))


def load_histories(client: MlflowClient, run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    """Long frame ``run_id, key, step, value`` of the metric histories (step = epoch)."""
    rows = [(run_id, key, metric.step, metric.value)
            for run_id in run_ids for key in keys
            for metric in client.get_metric_history(run_id, key)]
    return pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])


def downstream_metrics(runs: pd.DataFrame) -> list[str]:
    """Final ``eval_*`` metrics some run logged: higher-is-better first, then by name."""
    names = [c.removeprefix("metrics.") for c in runs.columns
             if c.startswith("metrics." + DOWNSTREAM_PREFIX) and runs[c].notna().any()]
    return sorted(names, key=lambda name: (lower_is_better(name), name))


def primary_metric(runs: pd.DataFrame) -> str | None:
    """The downstream metric the figures plot: the first higher-is-better one."""
    candidates = [m for m in downstream_metrics(runs) if not lower_is_better(m)]
    return candidates[0] if candidates else None


def lower_is_better(metric: str) -> bool:
    return any(word in metric for word in ("loss", "time", "perplexity"))


# --- naming runs for humans ----------------------------------------------------------------
STRATEGY_NAMES = {"random": "Random", "hard": "Hard", "soft": "Soft", "none": "No selection"}
METHOD_NAMES = {"attent": "AtteNT", "class_weight": "Class weight", "group_weight": "Group weight",
                "gradnorm": "GradNorm", "infobatch": "InfoBatch", "random": "Random subset",
                "full": "Full data"}


def is_full(runs: pd.DataFrame) -> pd.Series:
    return runs[METHOD].eq(FULL_METHOD)


def config_names(runs: pd.DataFrame) -> pd.Series:
    """One name per configuration: the engine's label, else the method's name."""
    return runs[LABEL].fillna(runs[METHOD].map(METHOD_NAMES)).fillna(runs[METHOD]).fillna(MISSING)


def strategy_names(runs: pd.DataFrame) -> pd.Series:
    """Strategy per run; the full-data baseline selects nothing whatever its tag says."""
    strategy = runs[STRATEGY].where(~is_full(runs), "none")
    return strategy.map(STRATEGY_NAMES).fillna(strategy).fillna(MISSING)
