"""Driver side of a training run: validate, open the MLflow run, start Ray Train, close the run."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from .. import contract
from ..config import ExperimentConfig
from . import preflight
from .loop import EPOCHS_ENDED_UNIX, train_loop_per_worker
from .tracking import client_for, finish_run, start_or_resume_run


@dataclass
class TrainResult:
    run_id: str
    metrics: dict[str, Any]     # rank 0's last report (final epoch)
    wallclock_s: float          # driver's view: Ray scheduling, worker start-up and training
    resumed: bool


check_experiment = preflight.check_experiment


TRAIN_POLL_ENV, TRAIN_POLL_SECONDS = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25"


def ensure_ray(cfg: ExperimentConfig) -> float:
    """Connect to ``ray.address`` / $RAY_ADDRESS, or start a local Ray; returns seconds spent."""
    if ray.is_initialized():
        return 0.0
    start = time.perf_counter()
    if cfg.ray.address or os.environ.get("RAY_ADDRESS"):
        _use_cluster_token()
    # Ray Train's controller polls its workers every 2 s by default, and a report after a
    # checkpoint waits for that poll: short epochs paid ~0.5 s each and every run ~5 s more
    # teardown (measured: 5.6 s -> 0.07 s of reports, 6.1 s -> 1.1 s of teardown at 0.25 s).
    # A local Ray started here passes the setting to the controller; on a cluster, set it in the
    # job's runtime env (README).
    os.environ.setdefault(TRAIN_POLL_ENV, TRAIN_POLL_SECONDS)
    ray.init(address=cfg.ray.address, log_to_driver=True, configure_logging=True, logging_level="WARNING")
    return time.perf_counter() - start


def _use_cluster_token() -> None:
    """`ray start` enables token auth by default and writes ~/.ray/auth_token, but a driver that
    connects with ray.init(address=...) only sends it with RAY_AUTH_MODE=token; Ray's helper
    sets that (and refreshes Ray's cached config) when a token exists and no mode was chosen."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available)
    except ImportError:  # a Ray without token auth
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def train(cfg: ExperimentConfig, *, parent_run_id: str | None = None, role: str = "run",
          extra_tags: dict[str, str] | None = None, callbacks: list | None = None,
          checked: bool = False) -> TrainResult:
    """One training run on Ray Train, recorded as one MLflow run. Re-running with the same name
    and storage path resumes from the latest checkpoint into the same MLflow run."""
    cfg = cfg.resolved()
    if not checked:  # the CLI checks before importing this module, to refuse fast
        check_experiment(cfg)
    ray_init_s = ensure_ray(cfg)  # before the MLflow run: the cluster check needs Ray
    preflight.check_cluster_resources(cfg)
    run_id, resumed = start_or_resume_run(cfg, role=role, parent_run_id=parent_run_id, extra_tags=extra_tags)
    ok = False
    start = time.perf_counter() - ray_init_s  # the wall-clock still counts Ray's start-up
    try:
        resources = {"CPU": cfg.ray.cpus_per_worker, **(cfg.ray.resources_per_worker or {})}
        if cfg.ray.use_gpu:
            resources["GPU"] = 1
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"config": cfg.model_dump(mode="json"), "run_id": run_id,
                               "tracking_uri": cfg.mlflow.tracking_uri, "fit_started_unix": time.time()},
            scaling_config=ScalingConfig(num_workers=cfg.ray.num_workers, use_gpu=cfg.ray.use_gpu,
                                         resources_per_worker=resources,
                                         placement_strategy=cfg.ray.placement_strategy),
            run_config=RunConfig(
                name=cfg.name, storage_path=cfg.ray.storage_path, callbacks=callbacks,
                failure_config=FailureConfig(max_failures=cfg.ray.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=cfg.ray.checkpoints_to_keep),
                # Train's per-report INFO lines would drown the epoch summaries; Train V2's print
                # patch would echo every worker print twice.
                logging_config=LoggingConfig(log_level="WARNING"),
                worker_runtime_env={"env_vars": {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}}),
        )
        result = trainer.fit()
        wallclock, teardown = time.perf_counter() - start, time.time()
        metrics = dict(result.metrics or {})
        teardown -= metrics.pop(EPOCHS_ENDED_UNIX, teardown)
        if not resumed:  # a resumed run's epochs partly ran before this driver started
            client_for(cfg.mlflow.tracking_uri).log_batch(
                run_id, metrics=_driver_metrics(cfg, run_id, wallclock, ray_init_s, teardown, metrics))
        ok = True
        return TrainResult(run_id, metrics, wallclock, resumed)
    finally:
        finish_run(cfg.mlflow.tracking_uri, run_id, ok)


def _driver_metrics(cfg: ExperimentConfig, run_id: str, wallclock: float, ray_init_s: float,
                    teardown_s: float, metrics: dict[str, Any]):
    """The run's fixed cost, split: before the first epoch (Ray init, worker start, the worker's
    set-up) and after the last (final logs and checkpoint, worker shutdown)."""
    from mlflow.entities import Metric
    logged = client_for(cfg.mlflow.tracking_uri).get_run(run_id).data.metrics
    startup = ray_init_s + logged.get(contract.TIME_WORKER_START, 0.0) + logged.get(contract.TIME_SETUP, 0.0)
    now = int(time.time() * 1000)
    values = {contract.TIME_WALLCLOCK: wallclock, contract.TIME_RAY_INIT: ray_init_s,
              contract.TIME_STARTUP: startup, contract.TIME_TEARDOWN: teardown_s,
              # Ray's fixed cost: everything the driver waited for that was not an epoch (nor a kernel)
              contract.TIME_RAY_OVERHEAD: wallclock - float(metrics.get(contract.TIME_TOTAL, 0.0))
              - float(metrics.get(contract.TIME_ANTK, 0.0))}
    return [Metric(k, v, now, 0) for k, v in values.items()]
