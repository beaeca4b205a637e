"""MLflow bookkeeping. The driver owns the run's life (create or resume, params, tags, final
status) through one ``TrackingSession`` per run, made once and handed on; rank 0 of the workers
writes metrics and artifacts into it by run id, which works across Ray processes and machines,
through one client per worker process (``process_client``; in local mode, the driver's own)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import subprocess
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
from .credentials import redactor
from .dashboard import add_to_training_view, write_training_view
from .faults import close_runs_of_dead_drivers, driver_tags, reopen_run  # also this module's names
from .tracking_defaults import DEFAULT_ARTIFACTS


def client_for(tracking_uri: str) -> MlflowClient:
    """A new client of the store. This process's first of a SQLite store is made under a file lock
    beside it: MLflow creates and migrates the schema as a client opens the store, and two
    processes doing so at once into a new file left it unreadable. Later ones skip the lock."""
    path = None if tracking_uri in _OPENED_SQLITE else sqlite_file(tracking_uri)
    if path is None:
        return MlflowClient(tracking_uri=tracking_uri)
    from filelock import FileLock

    with FileLock(f"{path}.lock", timeout=300):
        client = MlflowClient(tracking_uri=tracking_uri)
        client.search_experiments(max_results=1)
    _OPENED_SQLITE.add(tracking_uri)
    return client


_OPENED_SQLITE: set[str] = set()  # the SQLite stores this process has opened (under the lock)


@functools.lru_cache(maxsize=8)
def process_client(tracking_uri: str) -> MlflowClient:
    """This process's one client of a store: a Ray worker's, made at its first run's start and
    kept for the runs and restarts it trains (it cannot share the driver's, another process's)."""
    return client_for(tracking_uri)


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


def close_runs_of_dead_drivers_in(tracking_uri: str, experiment: str | None = None) -> list[str]:
    """``close_runs_of_dead_drivers`` for one experiment by name (nothing if it does not exist),
    or for every experiment of the store. A SQLite store not yet made has none (and is not made
    here: a command refused later must leave nothing behind)."""
    if experiment is not None:
        return TrackingSession(tracking_uri, experiment).close_runs_of_dead_drivers()
    if not store_exists(tracking_uri):
        return []
    client = client_for(tracking_uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    return close_runs_of_dead_drivers(client, ids) if ids else []


def store_exists(tracking_uri: str) -> bool:
    """False for a SQLite store whose file is not made yet (any other store: True)."""
    database = sqlite_file(tracking_uri)
    return database is None or database.exists()


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


def latest_run(cfg: ExperimentConfig, tracking: TrackingSession | None = None):
    """The newest MLflow run of this experiment's storage path + name (any status), or None."""
    return TrackingSession.serving(tracking, cfg).latest_run(cfg)


def start_or_resume_run(
    cfg: ExperimentConfig,
    *,
    role: str = "run",
    parent_run_id: str | None = None,
    extra_tags: dict[str, str] | None = None,
    tracking: TrackingSession | None = None,
) -> tuple[str, bool]:
    """(run id, resumed): ``TrackingSession.start_or_resume_run``, in ``tracking`` (or a session of its own)."""
    session = TrackingSession.serving(tracking, cfg)
    return session.start_or_resume_run(cfg, role=role, parent_run_id=parent_run_id, extra_tags=extra_tags)


def finish_run(tracking_uri: str, run_id: str, ok: bool) -> None:
    """End the run; the dashboard's training view then shows its metrics too."""
    RunLogger(tracking_uri, run_id).finish(ok)


class TrackingSession:
    """The driver's tracking for one run, its downstream jobs included: the store's URI (as the
    resolved config gives it), its SQLite file if any, one client (made on first use: a store not
    yet made stays unmade until a run is created), and the experiment's id once found or opened.
    ``run_pipeline`` (or ``run_downstream``, a sweep trial, a benchmark) makes it once and hands it
    on; each run it creates or reopens gets its handle from it (``run``), on the same client."""

    def __init__(self, tracking_uri: str, experiment: str, client: MlflowClient | None = None):
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.sqlite_file = sqlite_file(tracking_uri)
        self.experiment_id: str | None = None  # found active, or opened: nothing to create or restore
        self._client = client

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> TrackingSession:
        """The session of a (resolved) config's store and experiment."""
        return cls(cfg.mlflow.tracking_uri, cfg.mlflow.experiment)

    @staticmethod
    def serving(tracking: TrackingSession | None, cfg: ExperimentConfig) -> TrackingSession:
        """``tracking`` if it is the session of ``cfg``'s store and experiment; one on its client
        for another experiment of its store; else (or with none) a new one of ``cfg``'s."""
        if tracking is None or tracking.tracking_uri != cfg.mlflow.tracking_uri:
            return TrackingSession.of(cfg)
        if tracking.experiment != cfg.mlflow.experiment:
            return TrackingSession(tracking.tracking_uri, cfg.mlflow.experiment, tracking._client)
        return tracking

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = client_for(self.tracking_uri)
        return self._client

    def find_experiment(self) -> str | None:
        """The experiment's id if it exists (nothing is created or restored), else None."""
        if self.experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                return None
            if found.lifecycle_stage != "deleted":
                self.experiment_id = found.experiment_id
            return found.experiment_id
        return self.experiment_id

    def open_experiment(self) -> str:
        """The experiment's id, created (or restored from deletion) if needed."""
        if self.experiment_id is None:
            self.experiment_id = ensure_experiment(self.client, self.experiment, self.tracking_uri)
        return self.experiment_id

    def close_runs_of_dead_drivers(self) -> list[str]:
        """``close_runs_of_dead_drivers`` in the experiment; nothing, and nothing made, in a
        SQLite store not yet made or an experiment that does not exist."""
        if self.sqlite_file is not None and not self.sqlite_file.exists():
            return []
        found = self.find_experiment()
        return close_runs_of_dead_drivers(self.client, [found]) if found is not None else []

    def latest_run(self, cfg: ExperimentConfig):
        """The newest MLflow run of ``cfg``'s storage path + name (any status), or None."""
        experiment_id = self.find_experiment()
        if experiment_id is None:
            return None
        key = f"{cfg.ray.storage_path}/{cfg.name}"
        found = self.client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{contract.TAG_RUN_KEY}` = '{key}'",
            order_by=["attribute.start_time DESC"],
            max_results=1,
        )
        return found[0] if found else None

    def start_or_resume_run(
        self,
        cfg: ExperimentConfig,
        *,
        role: str = "run",
        parent_run_id: str | None = None,
        extra_tags: dict[str, str] | None = None,
    ) -> tuple[str, bool]:
        """(run id, resumed). A run with the same storage path and name that did not finish is
        reopened, so re-running a crashed experiment adds to the same MLflow run."""
        client, experiment_id = self.client, self.open_experiment()
        previous = self.latest_run(cfg)
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

    def run(self, run_id: str) -> RunLogger:
        """The handle of one run of the store, on the session's client."""
        return RunLogger(self.tracking_uri, run_id, client=self.client)


def yaml_dump(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


class RunLogger:
    """One MLflow run's handle: the driver's through its pipeline (progress line, driver
    metrics, the log, the end) and rank 0's writer, on one client (``client``: one it shares,
    the driver's ``TrackingSession``'s or a worker's ``process_client``; else a new one)."""

    def __init__(self, tracking_uri: str, run_id: str, client: MlflowClient | None = None):
        self.run_id, self.tracking_uri = run_id, tracking_uri
        self.client = client if client is not None else client_for(tracking_uri)

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
