"""Checks that refuse a run before anything starts, each naming its fix:

* ``store``: the MLflow tracking store answers and its API accepts us or, for SQLite, can be written;
  ``permission``: on a server with users, the user may write the run's experiment;
* ``resources``: the Ray address answers; the workers fit this machine (before a local Ray
  starts); ``cluster``: they fit the connected cluster (after ``ray.init``), or an autoscaler can
  add the nodes, announced as a wait;
* ``check_init_weights``: a local ``train.init_weights`` exists;
* ``check_outside_job_copy``: under ``ray job submit --working-dir``, the store and the checkpoints
  do not lie in Ray's temporary copy of the folder (deleted with the job).

A refusal is a ``config.PreflightError`` (a ``ValueError``: the CLI prints it as
``attent <cmd>: error: ...`` and exits 2). Nothing here imports torch; Ray only to size a local
cluster, so the CLI refuses before importing the engine.
"""

from __future__ import annotations

from pathlib import Path

from ...experiment.schema import PreflightError
from ...experiment.uris import sqlite_file
from .permission import check_can_log
from .resources import check_local_resources, check_ray_address
from .store import check_tracking


def check_experiment(*cfgs) -> None:
    """Everything that can be refused before Ray starts, for one run or a sweep's trials
    (resolved ExperimentConfigs): the MLflow store, resources, data files (once per distinct
    task section)."""
    for cfg in cfgs:
        check_outside_job_copy(cfg)
    for uri in dict.fromkeys(cfg.mlflow.tracking_uri for cfg in cfgs):
        check_tracking(uri)  # seconds, not MLflow's minutes of retries
    for uri, experiment in dict.fromkeys((cfg.mlflow.tracking_uri, cfg.mlflow.experiment) for cfg in cfgs):
        check_can_log(uri, experiment)  # a READ user: refused here, not by the driver's first write
    check_ray_address(*cfgs)  # seconds, not ray.init's minutes of retries
    check_local_resources(*cfgs)  # a local Ray that could never host the workers
    tasks = [cfg.task for cfg in cfgs] + [  # downstream jobs' data (weights come later)
        cfg.downstream_experiment(job, pretrained=None).resolved().task for cfg in cfgs for job in cfg.downstream
    ]
    for task in {task.model_dump_json(): task for task in tasks}.values():
        task.check_data()
    for cfg in cfgs:
        check_init_weights(cfg.train.init_weights)


def check_init_weights(source: str | None) -> None:
    """A local ``train.init_weights`` exists (the workers read an MLflow URI: a wrong one fails
    there, naming it)."""
    if source and ":/" not in source and not Path(source).exists():
        raise PreflightError(
            f"train.init_weights {source!r} does not exist: give a logged model "
            "(models:/<model_id>, runs:/<run_id>/model) or a run's Ray checkpoint folder"
        )


JOB_COPY = ("runtime_resources", "working_dir_files")  # where Ray unpacks `ray job submit --working-dir`'s upload


def in_job_copy(path: Path) -> bool:
    parts = Path(path).parts
    return any(parts[i : i + 2] == JOB_COPY for i in range(len(parts) - 1))


def check_outside_job_copy(cfg) -> None:
    """A job of `ray job submit --working-dir .` runs in Ray's copy of the folder, deleted after the job:
    a relative ``sqlite:///mlflow.db`` or ``ray_results`` (the defaults) resolves inside it, and the runs
    would never reach the user's store. Refused, naming the absolute paths to give."""
    storage = cfg.ray.storage_path
    for key, path in (
        ("mlflow.tracking_uri", sqlite_file(cfg.mlflow.tracking_uri or "")),
        ("ray.storage_path", None if "://" in storage else Path(storage)),
    ):
        if path is not None and in_job_copy(path):
            raise PreflightError(
                f"{key} resolves to {path}, inside Ray's temporary copy of `ray job submit --working-dir`, which "
                "Ray deletes with the job: the run would never reach your store; nothing was run or recorded. Fix: "
                "give absolute paths, mlflow.tracking_uri=sqlite:////<abs path>/mlflow.db (or a tracking server's "
                "URL) and ray.storage_path=/<abs path>/ray_results, e.g. `attent train FILE "
                "mlflow.tracking_uri=sqlite:///$PWD/mlflow.db ray.storage_path=$PWD/ray_results` in the submitting shell"
            )
