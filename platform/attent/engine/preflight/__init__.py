"""Checks that refuse a run before anything starts, each naming its fix:

* ``store``: the MLflow tracking store answers and its API accepts us or, for SQLite, can be written;
* ``resources``: the Ray address answers; the workers fit this machine (before a local Ray
  starts); ``cluster``: they fit the connected cluster (after ``ray.init``), or an autoscaler can
  add the nodes, announced as a wait;
* ``check_init_weights``: a local ``train.init_weights`` exists.

A refusal is a ``config.PreflightError`` (a ``ValueError``: the CLI prints it as
``attent <cmd>: error: ...`` and exits 2). Nothing here imports torch; Ray only to size a local
cluster, so the CLI refuses before importing the engine.
"""

from __future__ import annotations

from pathlib import Path

from ...experiment.schema import PreflightError
from .resources import check_local_resources, check_ray_address
from .store import check_tracking


def check_experiment(*cfgs) -> None:
    """Everything that can be refused before Ray starts, for one run or a sweep's trials
    (resolved ExperimentConfigs): the MLflow store, resources, data files (once per distinct
    task section)."""
    for uri in dict.fromkeys(cfg.mlflow.tracking_uri for cfg in cfgs):
        check_tracking(uri)  # seconds, not MLflow's minutes of retries
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
