"""MLflow bookkeeping. The driver owns the run's life (create or resume, params, tags, final
status); rank 0 of the workers writes metrics and artifacts into it by run id, which works
across Ray processes and machines."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from mlflow.entities import Metric, Param, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from .. import contract
from ..experiment.files import flatten
from ..experiment.schema import ExperimentConfig
from ..experiment.uris import sqlite_file
from ..selection.plan import build_plan
from . import faults
from .credentials import redactor
from .dashboard import add_to_training_view, write_training_view
from .tracking_defaults import DEFAULT_ARTIFACTS


def client_for(tracking_uri: str) -> MlflowClient:
    if tracking_uri.startswith("sqlite:"):
        open_sqlite_store(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri)


@functools.cache
def open_sqlite_store(tracking_uri: str) -> None:
    """This process's first use of a SQLite store, under a file lock beside it: MLflow creates and
    migrates the schema on first use, and two processes doing so at once into a new file left it
    unreadable. Later uses in the process skip the lock."""
    from filelock import FileLock

    path = sqlite_file(tracking_uri)
    if path is None:
        return
    with FileLock(f"{path}.lock", timeout=300):
        MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)


def ensure_experiment(client: MlflowClient, name: str, tracking_uri: str) -> str:
    """Experiment id, creating it if needed. With a SQLite store the artifacts go to
    ``mlartifacts/`` beside the database (an absolute path every local process can reach)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    database = sqlite_file(tracking_uri)
    location = database.parent.joinpath(DEFAULT_ARTIFACTS).as_uri() if database is not None else None
    try:
        # The kind tag opened the experiment on its training runs in earlier MLflow 3 UIs; 3.17's
        # asks its GenAI / Model training switch instead (training_view_url sets that).
        experiment_id = client.create_experiment(
            name, artifact_location=location, tags={contract.TAG_EXPERIMENT_KIND: contract.EXPERIMENT_KIND_TRAINING}
        )
    except Exception:  # another process created it first
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id
    write_training_view(client, experiment_id, [])
    return experiment_id


def open_experiment(client: MlflowClient, name: str, tracking_uri: str) -> str:
    """Experiment id, creating it if needed; its runs left RUNNING by a dead driver are closed."""
    experiment_id = ensure_experiment(client, name, tracking_uri)
    close_runs_of_dead_drivers(client, [experiment_id])
    return experiment_id


# --- runs whose driver died -------------------------------------------------------------------
def driver_tags() -> dict[str, str]:
    """The tag naming this process as the driver of a run, so that any later command on this
    machine can tell whether the run's driver still lives."""
    return {contract.TAG_DRIVER: json.dumps(faults.process_identity())}


def reopen_run(client: MlflowClient, run_id: str) -> None:
    """A run this process goes on with: tagged as its driver first, then RUNNING (the other order
    would show a RUNNING run with a dead driver to a command looking in between)."""
    for key, value in driver_tags().items():
        client.set_tag(run_id, key, value)
    client.update_run(run_id, status=contract.STATUS_RUNNING)


def close_runs_of_dead_drivers(client: MlflowClient, experiment_ids: list[str]) -> list[str]:
    """End KILLED the RUNNING runs of these experiments whose driver is gone (SIGKILL, a closed
    laptop: nothing closed them), saying so in one line; their names. A run whose driver ran on
    another machine is left as it is: only that machine can see its process (and the run's lock
    file may lie on storage this one does not share)."""
    closed = []
    for run in search_runs_paged(
        client,
        experiment_ids,
        f"attributes.status = '{contract.STATUS_RUNNING}'",
        order_by=["attributes.start_time ASC"],
    ):
        identity = run_driver(run)
        if identity is None or faults.driver_alive(identity) is not False:
            continue
        if run_driver(client.get_run(run.info.run_id)) != identity:  # a new driver reopened it meanwhile
            continue
        driver = faults.describe_driver(identity)
        client.set_tag(
            run.info.run_id,
            contract.TAG_CLOSED_AS_KILLED,
            f"its driver ({driver}) was gone at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        )
        client.set_terminated(run.info.run_id, status=contract.STATUS_KILLED)
        closed.append((run.info.run_name, driver))
    if len(closed) == 1:
        ((name, driver),) = closed
        print(f"[attent] closed 1 run left RUNNING by a dead driver ({driver}): {name} → KILLED", file=sys.stderr)
    elif closed:
        print(
            f"[attent] closed {len(closed)} runs left RUNNING by dead drivers: "
            + ", ".join(f"{name} ({driver}) → KILLED" for name, driver in closed),
            file=sys.stderr,
        )
    return [name for name, _ in closed]


def close_runs_of_dead_drivers_in(tracking_uri: str, experiment: str | None = None) -> list[str]:
    """``close_runs_of_dead_drivers`` for one experiment by name (nothing if it does not exist),
    or for every experiment of the store. A SQLite store not yet made has none (and is not made
    here: a command refused later must leave nothing behind)."""
    database = sqlite_file(tracking_uri)
    if database is not None and not database.exists():
        return []
    client = client_for(tracking_uri)
    if experiment is None:
        ids = [e.experiment_id for e in client.search_experiments()]
    else:
        found = client.get_experiment_by_name(experiment)
        ids = [found.experiment_id] if found else []
    return close_runs_of_dead_drivers(client, ids) if ids else []


def run_driver(run) -> dict[str, object] | None:
    """The driver a run is tagged with (None for runs from before the tag, or a tag not ours)."""
    try:
        identity = json.loads(run.data.tags.get(contract.TAG_DRIVER, "null"))
    except ValueError:
        return None
    return identity if isinstance(identity, dict) and "pid" in identity else None


def search_runs_paged(
    client: MlflowClient, experiment_ids: list[str], filter_string: str, order_by: list[str] | None = None
) -> list:
    from mlflow.utils import get_results_from_paginated_fn

    return get_results_from_paginated_fn(
        lambda count, token: client.search_runs(
            experiment_ids, filter_string, max_results=count, order_by=order_by, page_token=token
        ),
        1000,
    )


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_tags(cfg: ExperimentConfig, role: str) -> dict[str, str]:
    sel, plan = cfg.selection, build_plan(cfg.selection, cfg.train.epochs)
    loss_based = sel.method == contract.METHOD_ATTENT  # its strategy: hard, soft or random
    return {
        contract.TAG_TASK: cfg.task.name,
        contract.TAG_METHOD: sel.method,
        contract.TAG_STRATEGY: sel.strategy if loss_based else contract.NONE,
        contract.TAG_RATIO_SCHEDULE: sel.ratio_schedule.describe() if sel.uses_ratio_schedule else contract.NONE,
        contract.TAG_INTERVAL_SCHEDULE: sel.interval_schedule.describe() if sel.uses_ratio_schedule else contract.NONE,
        contract.TAG_LABEL: plan.label,
        contract.TAG_RATIO_REACHED: f"{plan.ratio_reached():.4g}" if sel.uses_ratio_schedule else "1",
        contract.TAG_IDENTITY: contract.identity_hash(flatten(cfg)),
        contract.TAG_ROLE: role,
        contract.TAG_GIT_COMMIT: git_commit(),
        contract.TAG_RUN_KEY: f"{cfg.ray.storage_path}/{cfg.name}",
        contract.TAG_RUN_NAME: cfg.name,
    }


def latest_run(cfg: ExperimentConfig):
    """The newest MLflow run of this experiment's storage path + name (any status), or None."""
    client = client_for(cfg.mlflow.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.mlflow.experiment)
    if experiment is None:
        return None
    key = f"{cfg.ray.storage_path}/{cfg.name}"
    found = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{contract.TAG_RUN_KEY}` = '{key}'",
        order_by=["attribute.start_time DESC"],
        max_results=1,
    )
    return found[0] if found else None


def start_or_resume_run(
    cfg: ExperimentConfig,
    *,
    role: str = "run",
    parent_run_id: str | None = None,
    extra_tags: dict[str, str] | None = None,
) -> tuple[str, bool]:
    """(run id, resumed). A run with the same storage path and name that did not finish is
    reopened, so re-running a crashed experiment adds to the same MLflow run."""
    client = client_for(cfg.mlflow.tracking_uri)
    experiment_id = ensure_experiment(client, cfg.mlflow.experiment, cfg.mlflow.tracking_uri)
    previous = latest_run(cfg)
    if previous and previous.info.status != contract.STATUS_FINISHED:
        reopen_run(client, previous.info.run_id)
        return previous.info.run_id, True
    hide = redactor()  # no MLflow password, nor one written into a URI, in what the run records
    tags = {
        **run_tags(cfg, role),
        **driver_tags(),
        **(extra_tags or {}),
    }  # extra_tags may name the run (a benchmark's arm and seed)
    if parent_run_id:
        tags[contract.TAG_PARENT_RUN_ID] = parent_run_id
    tags = {key: hide(value) for key, value in tags.items()}
    run = client.create_run(experiment_id, run_name=tags[contract.TAG_RUN_NAME], tags=tags)
    params = {k: hide(_param(v)) for k, v in flatten(cfg).items()}
    items = list(params.items())
    for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in items[i : i + 100]])
    client.log_text(run.info.run_id, hide(yaml_dump(cfg)), "config.yaml")
    return run.info.run_id, False


def finish_run(tracking_uri: str, run_id: str, ok: bool) -> None:
    """End the run; the dashboard's training view then shows its metrics too."""
    RunLogger(tracking_uri, run_id).finish(ok)


def yaml_dump(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


class RunLogger:
    """One MLflow run's handle: the driver's through its pipeline (progress line, driver
    metrics, the log, the end) and rank 0's writer, on one client."""

    def __init__(self, tracking_uri: str, run_id: str):
        self.client, self.run_id, self.tracking_uri = client_for(tracking_uri), run_id, tracking_uri

    def get(self):
        """The run as the store has it now (metrics, tags, status)."""
        return self.client.get_run(self.run_id)

    def finish(self, ok: bool) -> None:
        """End the run; the dashboard's training view then shows its metrics too."""
        self.client.set_terminated(
            self.run_id, status=RunStatus.to_string(RunStatus.FINISHED if ok else RunStatus.FAILED)
        )
        try:
            run = self.get()
            add_to_training_view(self.client, run.info.experiment_id, run.data.metrics)
        except MlflowException as error:  # a view is no reason to fail a finished run
            print(f"[attent] could not refresh the dashboard's training view: {error}", flush=True)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(metric_name(k), float(v), now, step or 0) for k, v in metrics.items() if _is_number(v)]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value[:5000])  # MLflow's tag value limit

    def log_json(self, obj: Any, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, obj, artifact_file)

    def log_files(self, paths: Iterable[Path], artifact_path: str | None = None) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_figure(self, figure, artifact_file: str) -> None:
        self.client.log_figure(self.run_id, figure, artifact_file)

    def log_datasets(self, datasets: Iterable[contract.DatasetDescription], attempts: int = 3) -> None:
        """The run's datasets as MLflow run inputs (logging one again changes nothing). Two runs
        inserting the same dataset at once collide in MLflow's check-then-insert (a 400 through a
        server, which its client does not retry): the retry finds the row and links it."""
        inputs = [dataset_input(d) for d in datasets]
        for attempt in range(attempts):
            try:
                return self.client.log_inputs(self.run_id, datasets=inputs)
            except MlflowException as error:
                if attempt + 1 == attempts or not DATASET_INSERT_RACE.search(str(error)):
                    raise
                time.sleep(0.5 * (attempt + 1))


# what SQLite and PostgreSQL say when two runs insert the same dataset row at once
DATASET_INSERT_RACE = re.compile(r"UNIQUE constraint failed: datasets|dataset_pk|UniqueViolation")


def dataset_input(described: contract.DatasetDescription):
    """A dataset as MLflow records a run's input: name, digest (of the content's fingerprint, or
    of the description), source (an ``mlflow.data`` source), the sample count as its profile,
    and what the run used it for as the input's context tag."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    if described.source_type == contract.DATASET_SOURCE_HUB:
        from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource

        source = HuggingFaceDatasetSource(described.source)
    else:  # MLflow's local-file source (a generated class, found by its type)
        from mlflow.data.dataset_source_registry import get_dataset_source_from_json

        source = get_dataset_source_from_json(json.dumps({"uri": described.source}), "local")
    identity = [described.name, described.source, described.num_samples, described.fingerprint]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:8]  # 8 digits, as MLflow's own
    dataset = Dataset(
        name=described.name,
        digest=digest,
        source_type=described.source_type,
        source=source.to_json(),
        profile=json.dumps({"num_samples": described.num_samples}),
    )
    return DatasetInput(dataset, tags=[InputTag(contract.DATASET_CONTEXT_TAG, described.context)])


def metric_name(name: str) -> str:
    """MLflow accepts letters, digits, _ - . / and spaces: 'humaneval_pass@1' -> 'humaneval_pass_at_1'."""
    name = name.replace("@", "_at_")
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)


def _param(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text[:6000]


def _is_number(value: Any) -> bool:
    try:
        return value is not None and float(value) == float(value)  # drops NaN
    except (TypeError, ValueError):
        return False
