"""A run on Ray Train, recorded in MLflow: the driver's side (connect to Ray, open or resume the
MLflow run, start the TorchTrainer, close the run, then any downstream jobs) and the worker's
entry point around the recipe (system metrics, per-epoch logs and checkpoints, final artifacts).
How a run meets faults (deterministic failures, a dead driver, injected failures): ``faults``.

What ``attent train`` and every sweep or benchmark trial run: ``run_pipeline(cfg)``. The checks
that refuse a run before anything starts (``preflight.check_experiment``) are the caller's, so
that the CLI refuses before importing Ray; this module checks only what needs Ray (resources of
the connected cluster).
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ray
import ray.train
import ray.train.torch
import torch
from mlflow.entities import Metric
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from .. import contract
from ..config import DownstreamJob, ExperimentConfig, flatten
from . import checkpoint, faults, models, progress, ray_process
from .counters import timed
from .dashboard import add_to_training_view
from .preflight.resources import check_cluster_resources, worker_bundle
from .recipe import TrainingRecipe, WorkerContext, format_row
from .tracking import (RunLogger, client_for, close_runs_of_dead_drivers_in, finish_run, latest_run,
                       start_or_resume_run, start_system_metrics, stop_system_metrics)

EPOCHS_ENDED_UNIX = "epochs_ended_unix"  # last report only: when the last epoch ended (driver's teardown)
TRAIN_POLL_ENV, TRAIN_POLL_SECONDS = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25"
# One machine has no spot preemption to watch for: Train's watcher is one more actor process per
# run (a Python interpreter importing Ray Train) that a local Ray does without.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


@dataclass
class TrainResult:
    run_id: str
    metrics: dict[str, Any]     # rank 0's last report (final epoch)
    wallclock_s: float          # driver's view: Ray scheduling, worker start-up and training
    resumed: bool


@dataclass
class PipelineResult:
    training: TrainResult
    downstream: dict[str, float] = field(default_factory=dict)  # downstream.<job>.<metric> -> value


# --- the driver ---------------------------------------------------------------------------------

def run_pipeline(cfg: ExperimentConfig, **train_options) -> PipelineResult:
    """``train(cfg)``, then ``cfg.downstream`` on its weights."""
    training = train(cfg, **train_options)
    result = PipelineResult(training)
    if cfg.downstream:
        result.downstream = run_downstream(cfg, training.run_id, train_options.get("console", progress.Console()))
    return result


def train(cfg: ExperimentConfig, *, parent_run_id: str | None = None, role: str = contract.ROLE_RUN,
          extra_tags: dict[str, str] | None = None, callbacks: list | None = None,
          console: progress.Console = progress.Console()) -> TrainResult:
    """One training run on Ray Train, recorded as one MLflow run. Re-running with the same name
    and storage path resumes from the latest checkpoint into the same MLflow run. ``callbacks``:
    Ray Train's (a sweep trial's ``TuneReportCallback``). ``console``: what the terminal shows
    (by default everything Ray prints; the CLI's is one progress line, the rest in the run's log)."""
    cfg = cfg.resolved()
    with faults.run_lock(cfg):  # a second driver of this run refuses while this one lives
        # before the libraries' output goes to the run's log: this line is for the terminal
        close_runs_of_dead_drivers_in(cfg.mlflow.tracking_uri, cfg.mlflow.experiment)
        log_file = progress.log_path(cfg.ray.storage_path, cfg.name)
        with progress.captured_output(console, log_file) as terminal:
            name = (extra_tags or {}).get(contract.TAG_RUN_NAME, cfg.name)
            line = progress.RunProgress(console, terminal, name, cfg.train.epochs, log_file)
            return _train(cfg, parent_run_id, role, extra_tags, callbacks, line)


def worker_env_vars(console: progress.Console) -> dict[str, str]:
    """The Train workers' environment. Under a quiet console the Hugging Face libraries draw no
    progress bars: a bar's carriage-return updates reach Ray's log forwarding only when the worker
    ends a line or dies, so an interrupted run printed them on the terminal after its log closed."""
    env = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
    if console.quiet:
        env |= {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    return env


def _train(cfg: ExperimentConfig, parent_run_id: str | None, role: str, extra_tags: dict[str, str] | None,
           callbacks: list | None, line: progress.RunProgress) -> TrainResult:
    try:
        ray_init_s = ensure_ray(cfg)  # before the MLflow run: the cluster check needs Ray
        check_cluster_resources(cfg)
        run_id, resumed = start_or_resume_run(cfg, role=role, parent_run_id=parent_run_id, extra_tags=extra_tags)
    except BaseException:
        line.close(ok=False)
        raise
    faults.clear_fatal(cfg)  # a failure noted by an earlier attempt is not this one's
    ok = False
    start = time.perf_counter() - ray_init_s  # the wall-clock still counts Ray's start-up
    try:
        line.follow(cfg.mlflow.tracking_uri, run_id)
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"config": cfg.model_dump(mode="json"), "run_id": run_id,
                               "tracking_uri": cfg.mlflow.tracking_uri, "fit_started_unix": time.time(),
                               "driver": faults.driver_identity()},
            scaling_config=ScalingConfig(num_workers=cfg.ray.num_workers, use_gpu=cfg.ray.use_gpu,
                                         resources_per_worker=worker_bundle(cfg),
                                         placement_strategy=cfg.ray.placement_strategy),
            run_config=RunConfig(
                name=cfg.name, storage_path=cfg.ray.storage_path, callbacks=callbacks,
                failure_config=FailureConfig(max_failures=cfg.ray.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=cfg.ray.checkpoints_to_keep),
                # Train's per-report INFO lines would drown the epoch summaries; Train V2's print
                # patch would echo every worker print twice.
                logging_config=LoggingConfig(log_level="WARNING"),
                worker_runtime_env={"env_vars": worker_env_vars(line.console)}),
        )
        try:
            result = trainer.fit()
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
            client_for(cfg.mlflow.tracking_uri).log_batch(
                run_id, metrics=driver_metrics(cfg, run_id, wallclock, ray_init_s, teardown, metrics))
        ok = True
        return TrainResult(run_id, metrics, wallclock, resumed)
    finally:
        line.close(cfg.mlflow.tracking_uri, run_id, ok)
        if line.log_file is not None:  # the run's log, beside its metrics (small: the libraries' lines)
            with contextlib.suppress(Exception):
                client_for(cfg.mlflow.tracking_uri).log_artifact(run_id, str(line.log_file), "logs")
        finish_run(cfg.mlflow.tracking_uri, run_id, ok)


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
    # Each process of this job is told its own cluster (``ray_process.own_cluster``).
    hook = f"{ray_process.__name__}.{ray_process.own_cluster.__name__}"
    local = {} if address else {"runtime_env": {"worker_process_setup_hook": hook}}
    ray.init(address=cfg.ray.address, log_to_driver=True, configure_logging=True, logging_level="WARNING", **local)
    return time.perf_counter() - start


def use_cluster_token() -> None:
    """`ray start` enables token auth by default and writes ~/.ray/auth_token, but a driver that
    connects with ray.init(address=...) only sends it with RAY_AUTH_MODE=token; Ray's helper
    sets that (and refreshes Ray's cached config) when a token exists and no mode was chosen."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available)
    except ImportError:  # a Ray without token auth
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def driver_metrics(cfg: ExperimentConfig, run_id: str, wallclock: float, ray_init_s: float,
                   teardown_s: float, metrics: dict[str, Any]) -> list[Metric]:
    """The run's fixed cost, split: before the first epoch (Ray init, worker start, the worker's
    set-up) and after the last (final logs and checkpoint, worker shutdown)."""
    logged = client_for(cfg.mlflow.tracking_uri).get_run(run_id).data.metrics
    startup = ray_init_s + logged.get(contract.TIME_WORKER_START, 0.0) + logged.get(contract.TIME_SETUP, 0.0)
    now = int(time.time() * 1000)
    values = {contract.TIME_WALLCLOCK: wallclock, contract.TIME_RAY_INIT: ray_init_s,
              contract.TIME_STARTUP: startup, contract.TIME_TEARDOWN: teardown_s,
              # Ray's fixed cost: everything the driver waited for that was not an epoch (nor a kernel)
              contract.TIME_RAY_OVERHEAD: wallclock - float(metrics.get(contract.TIME_TOTAL, 0.0))
              - float(metrics.get(contract.TIME_ANTK, 0.0))}
    return [Metric(k, v, now, 0) for k, v in values.items()]


# --- downstream jobs ----------------------------------------------------------------------------
# Each is a Ray Train run of its own, an MLflow child of the pretraining run (tagged with its id and
# the job's name), loading the pretraining run's ``pretrained`` artifact. The pretraining run then
# receives each job's final metrics as ``downstream.<job>.<metric>``, so a table reads one row per
# pretraining configuration. Jobs that already finished (a resumed sweep, a re-run) are read back.

def run_downstream(cfg: ExperimentConfig, pretraining_run_id: str,
                   console: progress.Console = progress.Console()) -> dict[str, float]:
    """Every downstream job of ``cfg`` on the weights of ``pretraining_run_id``; their final
    metrics, also logged on the pretraining run."""
    check_exported(cfg.mlflow.tracking_uri, pretraining_run_id)
    finals: dict[str, float] = {}
    for job in cfg.downstream:
        job_cfg = job_experiment(cfg, job, pretraining_run_id)
        print(f"[attent] downstream job {job.name}: {job_cfg.task.name}, {job_cfg.train.epochs} epochs, "
              f"on run {pretraining_run_id}", flush=True)
        done = latest_run(job_cfg)
        if done is not None and done.info.status == "FINISHED":
            metrics = dict(done.data.metrics)
        else:
            metrics = train(job_cfg, parent_run_id=pretraining_run_id, role=contract.ROLE_DOWNSTREAM,
                            extra_tags={contract.TAG_PRETRAINING_RUN: pretraining_run_id,
                                        contract.TAG_DOWNSTREAM_JOB: job.name}, console=console).metrics
        finals.update({contract.downstream_metric(job.name, k[len(contract.EVAL_PREFIX):]): float(v)
                       for k, v in metrics.items() if k.startswith(contract.EVAL_PREFIX)})
    now = int(time.time() * 1000)
    client = client_for(cfg.mlflow.tracking_uri)
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


def check_exported(tracking_uri: str, run_id: str) -> None:
    """Refuse, before any worker starts, a run that does not exist or exported no weights."""
    from mlflow.exceptions import MlflowException
    client = client_for(tracking_uri)
    try:
        client.get_run(run_id)
    except MlflowException:
        raise ValueError(f"no MLflow run {run_id!r} in {tracking_uri}: give the pretraining run's id "
                         "(attent train prints it; the MLflow UI shows it)") from None
    if not client.list_artifacts(run_id, contract.PRETRAINED_ARTIFACT):
        raise FileNotFoundError(f"run {run_id} has no {contract.PRETRAINED_ARTIFACT}/ artifact: it did "
                                "not finish, or its task exports no weights for downstream jobs")


# --- the workers ----------------------------------------------------------------------------------

def train_loop_per_worker(payload: dict[str, Any]) -> None:
    """Ray Train's entry point on every rank: set-up or restore, then per epoch the recipe's
    epoch, its log line and metrics (rank 0), its report and checkpoint; meanwhile each node's
    local rank 0 samples the node's system metrics (CPU, memory, GPUs) into the MLflow run."""
    started, entered = time.perf_counter(), time.time()  # first: the monitor's start is no start-up of ours
    # Tasks that read MLflow artifacts (a downstream job's pretrained weights) use the run's store.
    os.environ["MLFLOW_TRACKING_URI"] = payload["tracking_uri"]
    cfg = ExperimentConfig.model_validate(payload["config"])
    faults.watch_driver(payload.get("driver"))
    if faults.recorded_fatal(cfg):  # a restart after a failure that would only repeat: stop, the driver says why
        return
    try:
        train_run(payload, cfg, started, entered)
    except faults.NOT_RETRYABLE as error:
        faults.record_fatal(cfg, error)
        raise


def train_run(payload: dict[str, Any], cfg: ExperimentConfig, started: float, entered: float) -> None:
    """Set-up or restore, then the epochs (``train_loop_per_worker``'s body)."""
    context = ray.train.get_context()
    ctx = WorkerContext(context.get_world_rank(), context.get_world_size(), ray.train.torch.get_device())
    # Ray Train logs every report at INFO under a logger named after its file, outside the
    # 'ray.train' hierarchy that LoggingConfig controls; our epoch lines say it better.
    from ray.train.v2._internal.execution import context as train_context
    logging.getLogger(train_context.__file__).setLevel(logging.WARNING)
    tracking: dict[str, float] = {}  # set-up seconds of the MLflow logger and monitor
    with node_system_metrics(payload, context, tracking):
        with timed(tracking, "tracking"):
            logger = RunLogger(payload["tracking_uri"], payload["run_id"]) if ctx.rank == 0 else None
        recipe = TrainingRecipe(cfg, ctx)
        recipe.setup(wrap_model=ray.train.torch.prepare_model)
        storage = context.get_storage()  # the run's folder, where Ray Train persists its checkpoints
        state, skipped = checkpoint.load_newest_intact(storage.storage_filesystem, storage.experiment_fs_path)
        if state is not None:
            for path, why in skipped:
                ctx.log(f"skipped checkpoint {path}: {why}")
            recipe.restore(state)
            if logger:  # a restart after a failure, or a re-run resuming: visible on the run
                logger.log_metrics({contract.RESTORED_AT_EPOCH: recipe.counters.next_epoch},
                                   step=recipe.counters.next_epoch)
                if skipped:
                    logger.set_tag(contract.TAG_SKIPPED_CHECKPOINTS, "; ".join(f"{p}: {why}" for p, why in skipped))
        elif logger:
            setup = time.perf_counter() - started
            parts = {**tracking, **recipe.setup_seconds}
            parts["other"] = setup - sum(parts.values())
            logger.log_metrics({contract.TIME_SETUP: setup, **{contract.setup_metric(k): v for k, v in parts.items()},
                                # the driver's clock: one machine, or nodes kept in sync by NTP
                                contract.TIME_WORKER_START: max(0.0, entered - payload["fit_started_unix"]),
                                contract.NUM_TRAIN_SAMPLES: len(recipe.train_set),
                                contract.GRAD_ACCUMULATION: recipe.accumulation})
            logger.log_datasets(recipe.task.describe_data())  # once per run: a restart restores instead
        ctx.log(f"{cfg.name}: {len(recipe.train_set)} samples, {ctx.world_size} worker(s) on {ctx.device}, "
                f"selection {cfg.selection.label(cfg.train.epochs)}, {cfg.train.epochs} epochs")
        for epoch in range(recipe.counters.next_epoch, cfg.train.epochs):
            row = recipe.run_epoch(epoch)
            if recipe.antk:  # after the epoch's time split: the kernel's time is its own (time_antk_s)
                row.update(recipe.antk.track(epoch))
            epochs_ended = time.time()
            ctx.log(format_row(row, cfg.train.epochs))
            if logger:
                logger.log_metrics(row, step=epoch)
                if epoch + 1 == cfg.train.epochs:
                    log_final(logger, recipe)
            report(recipe, epoch, row, epochs_ended)
            faults.maybe_fail(cfg, epoch, ctx.rank)


@contextlib.contextmanager
def node_system_metrics(payload: dict[str, Any], context, seconds: dict[str, float]) -> Iterator[None]:
    """MLflow's system metrics monitor of this node, run by its local rank 0 (one per node,
    named by the node's rank) while the body runs, stopped after it whether it failed or not.
    Its start's seconds go to ``seconds["tracking"]``."""
    monitor = None
    if context.get_local_rank() == 0:
        with timed(seconds, "tracking"):
            monitor = start_system_metrics(payload["tracking_uri"], payload["run_id"], context.get_node_rank())
    try:
        yield
    finally:
        if monitor is not None:
            stop_system_metrics(monitor)


def report(recipe: TrainingRecipe, epoch: int, row: dict[str, float], epochs_ended: float) -> None:
    """Report the epoch through Ray Train (a barrier: every rank reports), with a checkpoint
    every ``ray.checkpoint_every`` epochs and after the last one. The last report carries the
    time the epochs ended, from which the driver measures the run's teardown."""
    cfg = recipe.cfg
    last = epoch + 1 == cfg.train.epochs
    due = last or (epoch + 1) % cfg.ray.checkpoint_every == 0
    with recipe.counters.timed("checkpoint"):
        saved = checkpoint.save(recipe.state_dict()) if recipe.ctx.rank == 0 and due else None
        metrics = {k: v for k, v in row.items() if v == v}
        if last:
            metrics[EPOCHS_ENDED_UNIX] = epochs_ended
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(saved.name) if saved else None)
        if saved:
            saved.cleanup()


def log_final(logger: RunLogger, recipe: TrainingRecipe) -> None:
    """End-of-run metrics (step = epochs), the trained model (linked to them), selection and
    epoch histories, figures, the weights downstream jobs load, and the kernels when tracked."""
    cfg, counters, teacher = recipe.cfg, recipe.counters, recipe.teacher
    num_samples = len(recipe.train_set)
    logger.log_metrics(recipe.final_metrics(), step=cfg.train.epochs)
    log_model(logger, recipe)  # after the final metrics: MLflow links those of the model's step to it
    selections = [dict(r.summary(), indices=r.indices.tolist() if cfg.mlflow.log_selected_indices else None)
                  for r in teacher.history]
    logger.log_json({"num_samples": num_samples, "selections": selections}, "selection_history.json")
    logger.log_json(counters.history, "epoch_history.json")
    from . import figures  # matplotlib: only here, not in the driver nor at a worker's start
    label = cfg.selection.label(cfg.train.epochs)
    for name, figure in figures.training_figures(counters.history, teacher.history, label).items():
        logger.log_figure(figure, f"figures/{name}.png")
        figures.close(figure)
    exported = recipe.task.export(recipe.raw_model)
    if exported is not None:
        with tempfile.TemporaryDirectory(prefix="attent-export-") as tmp:
            path = Path(tmp) / contract.PRETRAINED_FILE
            torch.save(exported, path)
            logger.log_files([path], contract.PRETRAINED_ARTIFACT)
    if recipe.antk:
        recipe.antk.log_final(logger)


def log_model(logger: RunLogger, recipe: TrainingRecipe) -> None:
    """The trained model as the run's MLflow logged model (``models``), its cost logged as
    ``time_model_log_s``. A model that fails to log does not fail the finished run (its weights
    are in the run's last checkpoint): the reason is printed and tagged."""
    cfg = recipe.cfg
    started = time.perf_counter()
    try:
        model_id = models.log_trained_model(recipe.task, recipe.raw_model, run_id=logger.run_id,
                                            step=cfg.train.epochs, registered_model=cfg.mlflow.registered_model)
    except Exception as error:  # noqa: BLE001 -- export, flavour and store errors alike
        reason = f"{type(error).__name__}: {error}"
        recipe.ctx.log(f"the trained model was not logged in MLflow ({reason})")
        logger.set_tag(contract.TAG_MODEL_LOG_ERROR, reason)
        return
    if model_id is not None:
        logger.log_metrics({contract.TIME_MODEL_LOG: time.perf_counter() - started}, step=cfg.train.epochs)
        recipe.ctx.log(f"logged the trained model as models:/{model_id}")
