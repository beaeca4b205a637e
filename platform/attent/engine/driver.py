"""A run on Ray Train, recorded in MLflow: the driver's side (connect to Ray, open or resume the
MLflow run, start the TorchTrainer, close the run, then any downstream jobs). The workers' side
around the recipe (system metrics, per-epoch logs and checkpoints, final artifacts): ``worker``.
How a run meets faults (deterministic failures, a dead driver, injected failures): ``faults``.

What ``attent train`` and every sweep or benchmark trial run: ``run_pipeline(cfg)``, which opens
the run's one ``tracking.TrackingSession`` (one client of the store, the experiment) and hands it
on to the training run and its downstream jobs. The checks that refuse a run before anything
starts (``preflight.check_experiment``) are the caller's, so that the CLI refuses before importing
Ray; this module checks only what needs Ray (resources of the connected cluster; on several nodes,
a store and a storage path they all reach).

``ray.num_workers: 0`` runs Ray Train's local mode: the training function in this process (a
sweep or benchmark trial's own process), with the same ``ray.train`` API but no controller,
placement group, worker actor or process group, and no Ray cluster needed. What local mode lacks
is done here: checkpoints (``worker``), and ``ray.max_failures`` restarts from the latest one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from mlflow.entities import Metric
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from .. import contract
from ..experiment.files import flatten
from ..experiment.schema import DownstreamJob, ExperimentConfig
from . import faults, progress, ray_process
from .credentials import client_env
from .dashboard import add_to_training_view
from .preflight.cluster import check_cluster_resources
from .preflight.nodes import check_shared_across_nodes
from .preflight.resources import worker_bundle
from .stream_data import stream_datasets
from .tracking import RunLogger, TrackingSession
from .worker import EPOCHS_ENDED_UNIX, LOCAL_MODE, ON_EPOCH, TRACKING_CLIENT, train_loop_per_worker

TRAIN_POLL_ENV, TRAIN_POLL_SECONDS = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25"
# One machine has no spot preemption to watch for: Train's watcher is one more actor process per
# run (a Python interpreter importing Ray Train) that a local Ray does without.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


@dataclass
class TrainResult:
    run_id: str
    metrics: dict[str, Any]  # rank 0's last report (final epoch)
    wallclock_s: float  # driver's view: Ray scheduling, worker start-up and training
    resumed: bool


@dataclass
class PipelineResult:
    training: TrainResult
    downstream: dict[str, float] = field(default_factory=dict)  # downstream.<job>.<metric> -> value


def run_pipeline(cfg: ExperimentConfig, tracking: TrackingSession | None = None, **train_options) -> PipelineResult:
    """``train(cfg)``, then ``cfg.downstream`` on its weights, in one tracking session: ``tracking``
    (a sweep trial's or a benchmark's, of ``cfg``'s store and experiment), else one opened here."""
    cfg = cfg.resolved()
    tracking = TrackingSession.serving(tracking, cfg)
    training = train(cfg, tracking=tracking, **train_options)
    result = PipelineResult(training)
    if cfg.downstream:
        console = train_options.get("console", progress.DEFAULT_CONSOLE)
        result.downstream = run_downstream(cfg, training.run_id, console, tracking=tracking)
    return result


def train(
    cfg: ExperimentConfig,
    *,
    parent_run_id: str | None = None,
    role: str = contract.ROLE_RUN,
    extra_tags: dict[str, str] | None = None,
    callbacks: list | None = None,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    console: progress.Console = progress.DEFAULT_CONSOLE,
    tracking: TrackingSession | None = None,
) -> TrainResult:
    """One training run on Ray Train, recorded as one MLflow run. Re-running with the same name
    and storage path resumes from the latest checkpoint into the same MLflow run. ``callbacks``:
    Ray Train's (a sweep trial's ``TuneReportCallback``), which run for real workers only;
    ``on_epoch``: called in local mode with each epoch's reported metrics instead (a sweep
    trial's ``tune.report``). ``console``: what the terminal shows (by default everything Ray
    prints; the CLI's is one progress line, the rest in the run's log). ``tracking``: the
    pipeline's session, used if it is of this run's store and experiment (else one of its own)."""
    cfg = cfg.resolved()
    tracking = TrackingSession.serving(tracking, cfg)
    with faults.run_lock(cfg):  # a second driver of this run refuses while this one lives
        # before the libraries' output goes to the run's log: this line is for the terminal
        tracking.close_runs_of_dead_drivers()
        log_file = progress.log_path(cfg.ray.storage_path, cfg.name)
        with progress.captured_output(console, log_file) as terminal:
            name = (extra_tags or {}).get(contract.TAG_RUN_NAME, cfg.name)
            line = progress.RunProgress(
                console,
                terminal,
                name,
                cfg.train.epochs,
                log_file,
                phase="setting up" if cfg.ray.num_workers == 0 else "starting Ray workers",
            )
            return _train(cfg, tracking, parent_run_id, role, extra_tags, callbacks, on_epoch, line)


def worker_env_vars(console: progress.Console) -> dict[str, str]:
    """The Train workers' environment. Under a quiet console the Hugging Face libraries draw no
    progress bars: a bar's carriage-return updates reach Ray's log forwarding only when the worker
    ends a line or dies, so an interrupted run printed them on the terminal after its log closed."""
    env = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
    if console.quiet:
        env |= {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    return env


def _train(
    cfg: ExperimentConfig,
    tracking: TrackingSession,
    parent_run_id: str | None,
    role: str,
    extra_tags: dict[str, str] | None,
    callbacks: list | None,
    on_epoch: Callable | None,
    line: progress.RunProgress,
) -> TrainResult:
    local = cfg.ray.num_workers == 0
    try:
        ray_init_s = 0.0 if local else ensure_ray(cfg)  # before the MLflow run: the cluster check needs Ray
        if not local:
            check_cluster_resources(cfg)
            check_shared_across_nodes(cfg)  # on several nodes: the store and ray.storage_path reach them all
        run_id, resumed = tracking.start_or_resume_run(
            cfg, role=role, parent_run_id=parent_run_id, extra_tags=extra_tags
        )
        run = tracking.run(run_id)  # the run's one handle from here to its end
    except BaseException:
        line.close(ok=False)
        raise
    faults.clear_fatal(cfg)  # a failure noted by an earlier attempt is not this one's
    ok = False
    start = time.perf_counter() - ray_init_s  # the wall-clock still counts Ray's start-up
    try:
        line.follow(run)
        payload = _worker_payload(cfg, run_id, on_epoch, tracking)
        if local:
            # the level LoggingConfig gives workers, here Train's loggers in this process: no INFO
            # lines per report nor "Running in local mode" per run
            logging.getLogger("ray.train").setLevel(logging.WARNING)
        trainer = build_trainer(cfg, payload, callbacks, line.console)
        try:
            result = fit_locally(trainer, cfg, line) if local else trainer.fit()
        except Exception:
            fault = faults.take_fatal(cfg)  # a deterministic failure a worker noted: one line, not Ray's traceback
            if fault:
                raise fault from None
            raise
        fault = faults.take_fatal(cfg)  # the restarted workers stopped at once on the note
        if fault:
            raise fault
        wallclock, teardown = time.perf_counter() - start, time.time()
        metrics = dict(result.metrics or {})
        teardown -= metrics.pop(EPOCHS_ENDED_UNIX, teardown)
        if not resumed:  # a resumed run's epochs partly ran before this driver started
            run.client.log_batch(run_id, metrics=driver_metrics(run, wallclock, ray_init_s, teardown, metrics))
        ok = True
        return TrainResult(run_id, metrics, wallclock, resumed)
    finally:
        line.close(run, ok)
        if line.log_file is not None:  # the run's log, beside its metrics (small: the libraries' lines)
            with contextlib.suppress(Exception):
                run.log_files([line.log_file], "logs")
        run.finish(ok)


def _worker_payload(
    cfg: ExperimentConfig, run_id: str, on_epoch: Callable | None, tracking: TrackingSession
) -> dict[str, Any]:
    """The ``train_loop_config`` every worker receives: the run's config, its MLflow run, when the
    fit started and which driver started it; in local mode also ``on_epoch`` and the session's
    client (in-process: a callable travels as it is, and so does the client)."""
    payload = {
        "config": cfg.model_dump(mode="json"),
        "run_id": run_id,
        "tracking_uri": cfg.mlflow.tracking_uri,
        "fit_started_unix": time.time(),
        "driver": faults.driver_identity(),
    }
    if cfg.ray.num_workers == 0:
        payload |= {LOCAL_MODE: True, ON_EPOCH: on_epoch, TRACKING_CLIENT: tracking.client}
    return payload


def build_trainer(
    cfg: ExperimentConfig, payload: dict, callbacks: list | None, console: progress.Console
) -> TorchTrainer:
    """Ray Train's trainer of the run: its workers from ``ray:`` (none in local mode), quiet logs."""
    local = cfg.ray.num_workers == 0
    datasets = stream_datasets(cfg, payload)  # before the payload travels: it carries the stream's rows
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=payload,
        datasets=datasets,
        scaling_config=ScalingConfig(
            num_workers=cfg.ray.num_workers,
            use_gpu=cfg.ray.use_gpu,
            resources_per_worker=None if local else worker_bundle(cfg),
            placement_strategy=cfg.ray.placement_strategy,
        ),
        run_config=RunConfig(
            name=cfg.name,
            storage_path=cfg.ray.storage_path,
            callbacks=None if local else callbacks,
            failure_config=FailureConfig(max_failures=cfg.ray.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.ray.checkpoints_to_keep),
            # Train's per-report INFO lines would drown the epoch summaries; Train V2's print
            # patch would echo every worker print twice.
            logging_config=LoggingConfig(log_level="WARNING"),
            worker_runtime_env={"env_vars": worker_env_vars(console)},
        ),
    )


def fit_locally(trainer: TorchTrainer, cfg: ExperimentConfig, line: progress.RunProgress):
    """``trainer.fit()`` in Ray Train's local mode, with what its controller would add: torch
    given the threads of one worker's CPUs (a Ray worker gets OMP_NUM_THREADS from its bundle),
    and up to ``ray.max_failures`` restarts (-1: no limit) from the run's latest checkpoint after
    a failure that is not deterministic (``faults.NOT_RETRYABLE``, noted by the worker)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(cfg.ray.cpus_per_worker)))
    restarts = 0
    try:
        while True:
            try:
                return trainer.fit()
            except Exception as error:
                if (
                    isinstance(error, faults.NOT_RETRYABLE)
                    or faults.recorded_fatal(cfg)
                    or restarts == cfg.ray.max_failures
                ):
                    raise
                restarts += 1
                limit = "no limit" if cfg.ray.max_failures < 0 else f"of {cfg.ray.max_failures}"
                line.event(
                    f"{cfg.name} failed ({type(error).__name__}: {error}); restarting from its latest "
                    f"checkpoint in this process (restart {restarts} {limit}, ray.max_failures)"
                )
    finally:
        torch.set_num_threads(threads)


def ensure_ray(cfg: ExperimentConfig) -> float:
    """Connect to ``ray.address`` / $RAY_ADDRESS, or start a local Ray; returns seconds spent."""
    if ray.is_initialized():
        return 0.0
    start = time.perf_counter()
    if cfg.ray.address or os.environ.get("RAY_ADDRESS"):
        use_cluster_token()
    # Ray Train's controller polls its workers every 2 s by default, and a report after a
    # checkpoint waits for that poll: short epochs paid ~0.5 s each and every run ~5 s more
    # teardown (measured: 5.6 s -> 0.07 s of reports, 6.1 s -> 1.1 s of teardown at 0.25 s).
    # A local Ray started here passes the setting to the controller; on a cluster, set it in the
    # job's runtime env (README).
    os.environ.setdefault(TRAIN_POLL_ENV, TRAIN_POLL_SECONDS)
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if not address:
        os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
    # Each process of this job is told its own local cluster and given this driver's MLflow
    # credentials, which a worker on a `ray start` node would not otherwise have (ray_process).
    remote = (cfg.mlflow.tracking_uri or "").lower().startswith(("http://", "https://"))
    hook = ray_process.setup_hook(client_env() if remote else {}, local=not address)
    setup = {"runtime_env": {"worker_process_setup_hook": hook}} if hook else {}
    ray.init(address=cfg.ray.address, log_to_driver=True, configure_logging=True, logging_level="WARNING", **setup)
    return time.perf_counter() - start


def use_cluster_token() -> None:
    """`ray start` enables token auth by default and writes ~/.ray/auth_token, but a driver that
    connects with ray.init(address=...) only sends it with RAY_AUTH_MODE=token; Ray's helper
    sets that (and refreshes Ray's cached config) when a token exists and no mode was chosen."""
    try:
        from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    except ImportError:  # a Ray without token auth
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def driver_metrics(
    run: RunLogger, wallclock: float, ray_init_s: float, teardown_s: float, metrics: dict[str, Any]
) -> list[Metric]:
    """The run's fixed cost, split: before the first epoch (Ray init, worker start, the worker's
    set-up) and after the last (final logs and checkpoint, worker shutdown)."""
    logged = run.get().data.metrics
    startup = ray_init_s + logged.get(contract.TIME_WORKER_START, 0.0) + logged.get(contract.TIME_SETUP, 0.0)
    now = int(time.time() * 1000)
    values = {
        contract.TIME_WALLCLOCK: wallclock,
        contract.TIME_RAY_INIT: ray_init_s,
        contract.TIME_STARTUP: startup,
        contract.TIME_TEARDOWN: teardown_s,
        # Ray's fixed cost: everything the driver waited for that was not an epoch (nor a kernel)
        contract.TIME_RAY_OVERHEAD: wallclock
        - float(metrics.get(contract.TIME_TOTAL, 0.0))
        - float(metrics.get(contract.TIME_ANTK, 0.0)),
    }
    return [Metric(k, v, now, 0) for k, v in values.items()]


# --- downstream jobs ----------------------------------------------------------------------------
# Each is a Ray Train run of its own, an MLflow child of the pretraining run (tagged with its id and
# the job's name), loading the pretraining run's ``pretrained`` artifact. The pretraining run then
# receives each job's final metrics as ``downstream.<job>.<metric>``, so a table reads one row per
# pretraining configuration. Jobs that already finished (a resumed sweep, a re-run) are read back.


def run_downstream(
    cfg: ExperimentConfig,
    pretraining_run_id: str,
    console: progress.Console = progress.DEFAULT_CONSOLE,
    tracking: TrackingSession | None = None,
) -> dict[str, float]:
    """Every downstream job of ``cfg`` on the weights of ``pretraining_run_id``; their final
    metrics, also logged on the pretraining run. One tracking session for them all: ``tracking``
    (the pipeline's), else one opened here."""
    tracking = TrackingSession.serving(tracking, cfg)
    check_exported(tracking, pretraining_run_id)
    finals: dict[str, float] = {}
    for job in cfg.downstream:
        job_cfg = job_experiment(cfg, job, pretraining_run_id)
        print(
            f"[attent] downstream job {job.name}: {job_cfg.task.name}, {job_cfg.train.epochs} epochs, "
            f"on run {pretraining_run_id}",
            flush=True,
        )
        done = tracking.latest_run(job_cfg)
        if done is not None and done.info.status == "FINISHED":
            metrics = dict(done.data.metrics)
        else:
            metrics = train(
                job_cfg,
                parent_run_id=pretraining_run_id,
                role=contract.ROLE_DOWNSTREAM,
                extra_tags={contract.TAG_PRETRAINING_RUN: pretraining_run_id, contract.TAG_DOWNSTREAM_JOB: job.name},
                console=console,
                tracking=tracking,
            ).metrics
        finals.update(
            {
                contract.downstream_metric(job.name, k[len(contract.EVAL_PREFIX) :]): float(v)
                for k, v in metrics.items()
                if k.startswith(contract.EVAL_PREFIX)
            }
        )
    now = int(time.time() * 1000)
    client = tracking.client
    client.log_batch(pretraining_run_id, metrics=[Metric(k, v, now, cfg.train.epochs) for k, v in finals.items()])
    # the dashboard's training view gains the downstream.* columns now, not at the next run
    add_to_training_view(client, client.get_run(pretraining_run_id).info.experiment_id, finals)
    return finals


def job_experiment(cfg: ExperimentConfig, job: DownstreamJob, pretraining_run_id: str) -> ExperimentConfig:
    """The experiment of one downstream job on the weights of ``pretraining_run_id``. Named after
    that run and the job's settings: a re-run reuses (or resumes) only the same job on the same
    weights; a changed job trains anew."""
    pretrained = f"runs:/{pretraining_run_id}/{contract.PRETRAINED_ARTIFACT}"
    job_cfg = cfg.downstream_experiment(job, pretrained=pretrained).resolved()
    settings = contract.identity_hash(flatten(job_cfg))[:6]
    return job_cfg.model_copy(update={"name": f"{job_cfg.name}-{pretraining_run_id[:8]}-{settings}"})


def check_exported(tracking: TrackingSession, run_id: str) -> None:
    """Refuse, before any worker starts, a run that does not exist or exported no weights."""
    from mlflow.exceptions import MlflowException

    client = tracking.client
    try:
        client.get_run(run_id)
    except MlflowException:
        raise ValueError(
            f"no MLflow run {run_id!r} in {tracking.tracking_uri}: give the pretraining run's id "
            "(attent train prints it; the MLflow UI shows it)"
        ) from None
    if not client.list_artifacts(run_id, contract.PRETRAINED_ARTIFACT):
        raise FileNotFoundError(
            f"run {run_id} has no {contract.PRETRAINED_ARTIFACT}/ artifact: it did "
            "not finish, or its task exports no weights for downstream jobs"
        )
