"""Checks that refuse a run before anything starts, each naming its fix:

* ``store``: the MLflow tracking store answers and its API accepts us or, for SQLite, can be written;
  ``permission``: on a server with users, the user may write the run's experiment;
* ``resources``: the Ray address answers; the workers fit this machine (before a local Ray
  starts); ``cluster``: they fit the connected cluster (after ``ray.init``), or an autoscaler can
  add the nodes, announced as a wait;
* ``check_init_weights``: a local ``train.init_weights`` exists;
* ``check_outside_job_copy``: under ``ray job submit --working-dir``, the store and the checkpoints
  do not lie in Ray's temporary copy of the folder (deleted with the job); ``check_store_outside_job_copy``
  the same for the store alone, in ``check_theory`` (``attent theory``'s store);
* ``nodes``, after ``ray.init`` on a cluster of several nodes: the tracking store is not a SQLite file or
  a file store on one machine (every command), and ``ray.storage_path`` is the same folder on every
  node (a marker written by each node and read back by the driver).

``experiment_checks`` lists the checks that need no Ray, each named, for a caller that reports
every problem at once (``attent rehearse``); ``check_experiment`` makes them and the resource
checks, stopping at the first. A refusal is a ``config.PreflightError`` (a ``ValueError``: the CLI prints it as
``attent <cmd>: error: ...`` and exits 2). Nothing here imports torch; Ray only to size a local
cluster, so the CLI refuses before importing the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from ...experiment.schema import PreflightError
from ...experiment.uris import sqlite_file
from .permission import check_can_log
from .resources import check_local_resources, check_ray_address
from .store import check_tracking


def check_experiment(*cfgs) -> None:
    """Everything that can be refused before Ray starts, for one run or a sweep's trials
    (resolved ExperimentConfigs): the first refusal of ``experiment_checks`` (the MLflow store,
    the data files), then the Ray address and the resources."""
    for _, check in experiment_checks(*cfgs):
        check()
    check_ray_address(*cfgs)  # seconds, not ray.init's minutes of retries
    check_local_resources(*cfgs)  # a local Ray that could never host the workers


def experiment_checks(*cfgs) -> list[tuple[str, Callable[[], None]]]:
    """The checks of ``cfgs`` that need no Ray, each with what it checks, in the order a run makes
    them: the job copy, the tracking store and the user's permission on it, the initial weights,
    each distinct task's data (downstream jobs' included; their weights come later). A caller
    that names every problem at once (``attent rehearse``) makes them all; ``check_experiment``
    stops at the first.

    Args:
        cfgs: resolved ExperimentConfigs (one run's, or a sweep's trials).

    Returns:
        (what, check) pairs; a check raises a ``PreflightError`` (or the data's own error) naming
        its fix.
    """
    checks: list[tuple[str, Callable[[], None]]] = [
        ("ray.storage_path", partial(check_outside_job_copy, cfg)) for cfg in cfgs
    ]
    for uri in dict.fromkeys(cfg.mlflow.tracking_uri for cfg in cfgs):
        checks.append(("tracking store", partial(check_tracking, uri)))  # seconds, not MLflow's minutes of retries
    for uri, experiment in dict.fromkeys((cfg.mlflow.tracking_uri, cfg.mlflow.experiment) for cfg in cfgs):
        # a READ user: refused here, not by the driver's first write
        checks.append(("tracking store", partial(check_can_log, uri, experiment)))
    checks += [("train.init_weights", partial(check_init_weights, cfg.train.init_weights)) for cfg in cfgs]
    tasks = [cfg.task for cfg in cfgs] + [
        cfg.downstream_experiment(job, pretrained=None).resolved().task for cfg in cfgs for job in cfg.downstream
    ]
    for task in {task.model_dump_json(): task for task in tasks}.values():
        checks.append((f"data of task {task.name}", task.check_data))
    checks += [("stream.path", partial(check_stream, cfg.stream)) for cfg in cfgs if cfg.stream and cfg.stream.ray_data]
    return checks


def check_stream(stream) -> None:
    """A local stream (``stream:``) holds files of its format (a remote one is read by the driver
    before any worker starts: a wrong one fails there, naming it)."""
    if "://" not in stream.path and not stream.local_files():
        what = "image (a folder of class subfolders)" if stream.format == "image_folder" else f"{stream.format} file"
        raise PreflightError(
            f"stream.path {stream.path} holds no {what}: give one (or drop stream: to train on the task's own data)"
        )


def check_theory(cfg) -> None:
    """What ``attent theory`` (a resolved ``theory.config.TheoryConfig``) is refused for before its first
    run, as an experiment is: a SQLite store inside a job's copy, a store that cannot work, a user who may
    not write the experiment."""
    uri = cfg.mlflow.tracking_uri
    check_store_outside_job_copy(uri, "attent theory")
    check_tracking(uri)
    check_can_log(uri, cfg.mlflow.experiment)


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
    _refuse_job_copy(
        {
            "mlflow.tracking_uri": sqlite_file(cfg.mlflow.tracking_uri or ""),
            "ray.storage_path": None if "://" in storage else Path(storage),
        },
        "give absolute paths, mlflow.tracking_uri=sqlite:////<abs path>/mlflow.db (or a tracking server's URL) "
        "and ray.storage_path=/<abs path>/ray_results, e.g. `attent train FILE "
        "mlflow.tracking_uri=sqlite:///$PWD/mlflow.db ray.storage_path=$PWD/ray_results` in the submitting shell",
    )


def check_store_outside_job_copy(tracking_uri: str, command: str) -> None:
    """``check_outside_job_copy`` for a command that writes only to the tracking store (``attent theory``):
    a SQLite store inside the job's copy is refused the same way."""
    _refuse_job_copy(
        {"mlflow.tracking_uri": sqlite_file(tracking_uri or "")},
        "give an absolute path, mlflow.tracking_uri=sqlite:////<abs path>/mlflow.db (or a tracking server's "
        f"URL), e.g. `{command} FILE mlflow.tracking_uri=sqlite:///$PWD/mlflow.db` in the submitting shell",
    )


def _refuse_job_copy(paths: dict[str, Path | None], fix: str) -> None:
    for key, path in paths.items():
        if path is not None and in_job_copy(path):
            raise PreflightError(
                f"{key} resolves to {path}, inside Ray's temporary copy of `ray job submit --working-dir`, which "
                f"Ray deletes with the job: the run would never reach your store; nothing was run or recorded. "
                f"Fix: {fix}"
            )
