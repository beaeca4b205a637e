"""MLflow runs as one flat DataFrame, the form both reports read them in.

One row per run. Columns follow MLflow's own ``search_runs`` naming, so tags, params and metrics
never collide: ``tags.attent.method``, ``params.seed``, ``metrics.time_method_s``; every name comes
from ``attent.contract``, the names the engine logs.
"""

from __future__ import annotations

import pandas as pd
from attent import contract  # the names the engine logs (standard library only: no engine import)
from mlflow import MlflowClient
from mlflow.entities import Run


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
INTERVAL_KIND = param(contract.PARAM_INTERVAL_KIND)
INTERVAL_REDRAW = param(contract.PARAM_INTERVAL_REDRAW)
INTERVAL_FIELDS = param(f"{contract.PARAM_INTERVAL}.")  # prefix of the interval section's columns
EPOCHS = param(contract.PARAM_EPOCHS)

METHOD_COST = metric(contract.TIME_METHOD)  # training + scoring + selection seconds
METHOD_COST_PARTS = tuple(metric(contract.time_metric(part)) for part in contract.METHOD_TIME_PARTS)
SELECTED_RATIO = metric(contract.MEAN_SELECTED_RATIO)
BACKPROPAGATED = metric(contract.SAMPLES_BACKPROPAGATED)
NUMERIC_COLUMNS = (SEED, RATIO_START, METHOD_COST, *METHOD_COST_PARTS, SELECTED_RATIO, BACKPROPAGATED)
CONTRACT_COLUMNS = (
    TASK,
    METHOD,
    STRATEGY,
    RATIO_SCHEDULE,
    INTERVAL_SCHEDULE,
    LABEL,
    ROLE,
    IDENTITY,
    PARENT_RUN_ID,
    RATIO_KIND,
    INTERVAL_KIND,
    *NUMERIC_COLUMNS,
)

REPORT_ARTIFACTS = "report"  # where a report logs its files on the parent run of its runs

_PAGE_SIZE = 1000


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
    columns = {
        c: frame[c].astype(object) if c.startswith(("tags.", "params.")) else frame[c] for c in frame.columns
    }  # text columns as object: all-missing ones would be float
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
