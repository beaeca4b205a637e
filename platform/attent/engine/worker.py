"""A run's Ray Train worker: set-up or restore, then per epoch the recipe's epoch, its log line and
metrics (rank 0), its report and checkpoint; meanwhile each node's local rank 0 samples the
node's system metrics (CPU, memory, GPUs) into the MLflow run. The driver's side: ``driver``.

In Ray Train's local mode (``ray.num_workers: 0``) the same function runs in the calling
process as the only rank: Ray Train persists no checkpoint there, so this module writes them
itself where Ray Train would (``checkpoint.run_storage``), and a sweep trial's Tune reports, which
Train's callbacks make for real workers, are made here (``on_epoch``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch

from .. import contract
from ..experiment.schema import ExperimentConfig
from . import checkpoint, faults, logged_models, preemption
from .counters import timed
from .recipe import TrainingRecipe, WorkerContext
from .system_metrics import start_system_metrics, stop_system_metrics
from .tracking import RunLogger, process_client

EPOCHS_ENDED_UNIX = "epochs_ended_unix"  # last report only: when the last epoch ended (driver's teardown)
LOCAL_MODE = "local_mode"  # payload key: the run is Ray Train's local mode (this process)
ON_EPOCH = "on_epoch"  # payload key, local mode: called with each epoch's reported metrics
STREAM_DATASET = "train"  # Ray Train's name of the training stream (stream:)
STREAM_ROWS = "stream_rows"  # payload key: the rows of one pass over the training stream
TRACKING_CLIENT = "tracking_client"  # payload key, local mode: the driver's MLflow client (this process's)


def train_loop_per_worker(payload: dict[str, Any]) -> None:
    """Ray Train's entry point on every rank (and, in local mode, in the driver's process)."""
    started, entered = time.perf_counter(), time.time()  # first: the monitor's start is no start-up of ours
    cfg = ExperimentConfig.model_validate(payload["config"])
    if not payload.get(LOCAL_MODE):  # in local mode the driver is this process
        faults.watch_driver(payload.get("driver"))
    if faults.recorded_fatal(cfg):  # a restart after a failure that would only repeat: stop, the driver says why
        return
    # Tasks that read MLflow artifacts (a downstream job's pretrained weights) use the run's store;
    # in local mode this process is the caller's, whose environment is given back afterwards.
    with environment(MLFLOW_TRACKING_URI=payload["tracking_uri"]):
        try:
            train_run(payload, cfg, started, entered)
        except faults.NOT_RETRYABLE as error:
            faults.record_fatal(cfg, error)
            raise


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """These environment variables while the body runs, then as they were."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def train_run(payload: dict[str, Any], cfg: ExperimentConfig, started: float, entered: float) -> None:
    """Set-up or restore, then the epochs (``train_loop_per_worker``'s body)."""
    local = bool(payload.get(LOCAL_MODE))
    if local:
        context, train_report = local_train_api()
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if cfg.ray.use_gpu and torch.cuda.is_available()
            else torch.device("cpu")
        )  # one rank: what prepare_model does for it is a move to the device
        wrap_model = lambda model: model.to(device)  # noqa: E731
    else:
        context, train_report = ray.train.get_context(), ray.train.report
        device, wrap_model = ray.train.torch.get_device(), ray.train.torch.prepare_model
    ctx = WorkerContext(context.get_world_rank(), context.get_world_size(), device)
    # Ray Train logs every report at INFO under a logger named after its file, outside the
    # 'ray.train' hierarchy that LoggingConfig controls; our epoch lines say it better.
    # (Local mode's per-report INFO lines are under 'ray.train', which the driver quiets.)
    from ray.train.v2._internal.execution import context as train_context

    logging.getLogger(train_context.__file__).setLevel(logging.WARNING)
    if local:  # the run's own folder, where Ray Train would persist its checkpoints
        storage = checkpoint.run_storage(cfg.ray.storage_path, cfg.name)
    else:
        ray_storage = context.get_storage()
        storage = ray_storage.storage_filesystem, ray_storage.experiment_fs_path
    tracking: dict[str, float] = {}  # set-up seconds of the MLflow logger and monitor
    with node_system_metrics(payload, context, tracking):
        with timed(tracking, "tracking"):
            logger = run_logger(payload) if ctx.rank == 0 else None
        shard = stream_shard(payload, context) if cfg.stream and cfg.stream.ray_data else None
        recipe = TrainingRecipe(cfg, ctx, stream=shard)
        recipe.setup(wrap_model=wrap_model)
        start_or_restore(recipe, ctx, logger, storage, tracking, started, entered, payload)
        mode = "Ray Train's local mode" if local else f"{ctx.world_size} worker(s)"
        ctx.log(
            f"{cfg.name}: {len(recipe.train_set)} samples, {mode} on {ctx.device}, "
            f"selection {recipe.selector.plan.label}, {cfg.train.epochs} epochs"
        )
        # local mode trains in the driver's process, whose signals are the command's own
        flag = None if local else watch_preemption(recipe, train_report)
        train_epochs(recipe, logger, train_report, storage if local else None, payload.get(ON_EPOCH), flag)


def stream_shard(payload: dict[str, Any], context) -> tuple[Any, int]:
    """This rank's Ray Data shard of the training stream (Ray Train splits it, equal shares) and
    the rows of one pass over the whole stream (the driver counted them)."""
    from ray.train.v2._internal.data_integration.interfaces import DatasetShardMetadata
    from ray.train.v2._internal.execution.train_fn_utils import get_train_fn_utils

    metadata = DatasetShardMetadata(dataset_name=STREAM_DATASET, world_rank=context.get_world_rank())
    return get_train_fn_utils().get_dataset_shard(metadata), payload[STREAM_ROWS]


def train_epochs(
    recipe: TrainingRecipe,
    logger: RunLogger | None,
    train_report: Callable,
    local_storage: tuple | None,
    on_epoch: Callable[[dict], None] | None,
    flag: preemption.StopFlag | None,
) -> None:
    """The epochs from the restored one: each one's row logged (rank 0) and reported, with its
    checkpoint when due or when a preemption notice came during it (then a SIGTERM'd run stops)."""
    cfg, ctx = recipe.cfg, recipe.ctx
    for epoch in range(recipe.counters.next_epoch, cfg.train.epochs):
        row = recipe.run_epoch(epoch)
        if recipe.antk:  # after the epoch's time split: the kernel's time is its own (time_antk_s)
            row.update(recipe.antk.track(epoch))
        epochs_ended = time.time()
        ctx.log(format_row(row, cfg.train.epochs))
        last = epoch + 1 == cfg.train.epochs
        if logger:
            logger.log_metrics(row, step=epoch)
            if last:
                log_final(logger, recipe)
        notice = flag.at_epoch_end() if flag else preemption.GO_ON
        report(
            recipe, epoch, row, epochs_ended, train_report, local_storage, on_epoch, force=notice != preemption.GO_ON
        )
        if notice == preemption.EXIT and not last:
            raise preemption.Preempted(f"SIGTERM: the run stopped after epoch {epoch + 1}, checkpointed")
        faults.maybe_fail(cfg, epoch, ctx.rank)


def watch_preemption(recipe: TrainingRecipe, train_report: Callable) -> preemption.StopFlag:
    """SIGTERM and Ray's drain notice turned into a checkpoint at the next optimiser step
    (``preemption``): the handler installed, the ranks' flag, the recipe's step hook."""
    ctx = recipe.ctx
    failed = preemption.install_sigterm_flag()
    if failed:
        ctx.log(
            f"SIGTERM will not be caught on rank 0 ({failed}): a preemption loses what was trained since the last checkpoint"
        )
    flag = preemption.StopFlag(ctx.distributed)
    injected = faults.sigterm_injection(recipe.cfg)  # tests: a SIGTERM at a given step

    def after_step(epoch: int, step: int, steps: int) -> None:
        faults.maybe_sigterm(injected, epoch, step, ctx.rank, preemption.SIGTERM_RECEIVED)
        notice = flag.after_step()
        if notice == preemption.GO_ON:
            return
        started = time.perf_counter()
        inside = preemption.inside_epoch_state(recipe, flag, epoch, step)  # every rank's part, on rank 0
        persist(recipe, {**recipe.state_dict(), preemption.INSIDE_EPOCH: inside} if inside else None, {}, train_report)
        spent, seconds = time.perf_counter() - started, recipe.counters.seconds
        # the epoch's timers run: its checkpoint is counted as one, not as training (a drain's run goes on)
        seconds["checkpoint"] += spent
        seconds["train"] -= spent
        seconds["total"] -= spent
        where = f"after step {step}/{steps} of epoch {epoch + 1}"
        if notice == preemption.EXIT:
            ctx.log(
                f"SIGTERM: checkpoint {where}; the workers stop (Ray Train restarts them while ray.max_failures allows)"
            )
            raise preemption.Preempted(f"SIGTERM: the run stopped {where}, checkpointed")
        ctx.log(f"Ray's drain notice: checkpoint {where}; training goes on until Ray Train restarts it")

    recipe.after_step = after_step
    return flag


def start_or_restore(
    recipe: TrainingRecipe,
    ctx: WorkerContext,
    logger: RunLogger | None,
    storage,
    tracking: dict[str, float],
    started: float,
    entered: float,
    payload: dict[str, Any],
) -> None:
    """The newest intact checkpoint restored, and the restart recorded on the run (the epoch it
    resumes at, its ranks); else the first start's set-up time and data recorded."""
    state, skipped = checkpoint.load_newest_intact(*storage)
    if state is not None:
        for path, why in skipped:
            ctx.log(f"skipped checkpoint {path}: {why}")
        recipe.restore(state)
        if logger:  # a restart after a failure, or a re-run resuming: visible on the run
            logger.log_metrics(
                {
                    contract.RESTORED_AT_EPOCH: recipe.counters.next_epoch,
                    # a checkpoint taken inside that epoch (preemption): the optimiser steps it had
                    **({contract.RESTORED_AT_STEP: recipe.resume.step} if recipe.resume else {}),
                    # an elastic run may go on with other ranks: the accumulation keeps its global batch
                    contract.RANKS: ctx.world_size,
                    contract.GRAD_ACCUMULATION: recipe.accumulation,
                },
                step=recipe.counters.next_epoch,
            )
            if skipped:
                logger.set_tag(contract.TAG_SKIPPED_CHECKPOINTS, "; ".join(f"{p}: {why}" for p, why in skipped))
    elif logger:
        setup = time.perf_counter() - started
        parts = {**tracking, **recipe.setup_seconds}
        parts["other"] = setup - sum(parts.values())
        logger.log_metrics(
            {
                contract.TIME_SETUP: setup,
                **{contract.setup_metric(k): v for k, v in parts.items()},
                # the driver's clock: one machine, or nodes kept in sync by NTP
                contract.TIME_WORKER_START: max(0.0, entered - payload["fit_started_unix"]),
                contract.NUM_TRAIN_SAMPLES: len(recipe.train_set),
                contract.GRAD_ACCUMULATION: recipe.accumulation,
                contract.RANKS: ctx.world_size,
            }
        )
        logger.log_datasets(recipe.task.describe_data())  # once per run: a restart restores instead


def run_logger(payload: dict[str, Any]) -> RunLogger:
    """Rank 0's handle of the run: on the driver's client in local mode (the same process), else
    on this worker process's one client of the store, kept across the runs and restarts it trains."""
    uri = payload["tracking_uri"]
    client = payload.get(TRACKING_CLIENT) or process_client(uri)
    return RunLogger(uri, payload["run_id"], client=client)


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


def local_train_api():
    """(context, report) of Ray Train's local mode. Ray 2.60's public ``ray.train.get_context``
    and ``ray.train.report`` refuse in a process that holds a Tune session ("deprecated when
    running in a function passed to Ray Tune"), which is where a sweep trial's local-mode run
    trains; they are these same utilities behind that check."""
    from ray.train.v2._internal.execution.train_fn_utils import get_train_fn_utils

    utils = get_train_fn_utils()
    return utils.get_context(), utils.report


def report(
    recipe: TrainingRecipe,
    epoch: int,
    row: dict[str, float],
    epochs_ended: float,
    train_report: Callable = ray.train.report,
    local_storage: tuple | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    force: bool = False,
) -> None:
    """Report the epoch through Ray Train (a barrier: every rank reports), with a checkpoint
    every ``ray.checkpoint_every`` epochs (else once ``ray.checkpoint_minutes`` have passed since
    the last one, as rank 0 counts them), after the last one, and when ``force``d. The last report
    carries the time the epochs ended, from which the driver measures the run's teardown. In local
    mode (``local_storage``: the run's filesystem and folder) the checkpoint is persisted here."""
    cfg = recipe.cfg
    last = epoch + 1 == cfg.train.epochs
    every, minutes = cfg.ray.checkpoint_every, cfg.ray.checkpoint_minutes
    since = time.monotonic() - recipe.checkpointed_at
    due = force or last or ((epoch + 1) % every == 0 if every else since >= 60 * minutes)
    with recipe.counters.timed("checkpoint"):
        metrics = {k: v for k, v in row.items() if v == v}
        if last:
            metrics[EPOCHS_ENDED_UNIX] = epochs_ended
        persist(
            recipe, recipe.state_dict() if recipe.ctx.rank == 0 and due else None, metrics, train_report, local_storage
        )
    if on_epoch is not None:
        on_epoch(metrics)


def persist(
    recipe: TrainingRecipe,
    state: dict[str, Any] | None,
    metrics: dict[str, float],
    train_report: Callable,
    local_storage: tuple | None = None,
) -> None:
    """Report ``metrics`` through Ray Train (every rank calls it), with rank 0's checkpoint of
    ``state`` (None: no checkpoint), which in local mode is persisted here into ``local_storage``."""
    cfg = recipe.cfg
    saved = checkpoint.save(state) if state is not None else None
    if saved and local_storage:
        checkpoint.persist(saved.name, *local_storage, keep=cfg.ray.checkpoints_to_keep)
    handed = saved and not local_storage
    train_report(metrics, checkpoint=ray.train.Checkpoint.from_directory(saved.name) if handed else None)
    if saved:
        saved.cleanup()
        recipe.checkpointed_at = time.monotonic()


def log_final(logger: RunLogger, recipe: TrainingRecipe) -> None:
    """End-of-run metrics (step = epochs), the trained model (linked to them), selection and
    epoch histories, figures, the weights downstream jobs load, and the kernels when tracked."""
    cfg, counters, selector = recipe.cfg, recipe.counters, recipe.selector
    num_samples = len(recipe.train_set)
    logger.log_metrics(recipe.final_metrics(), step=cfg.train.epochs)
    log_model(logger, recipe)  # after the final metrics: MLflow links those of the model's step to it
    selections = [
        dict(r.summary(), indices=r.indices.tolist() if cfg.mlflow.log_selected_indices else None)
        for r in selector.history
    ]
    logger.log_json({"num_samples": num_samples, "selections": selections}, "selection_history.json")
    logger.log_json(counters.history, "epoch_history.json")
    logger.log_json(recipe.selector.plan.summary(), "plan.json")  # the plan the run followed, epoch by epoch
    from . import figures  # matplotlib: only here, not in the driver nor at a worker's start

    label = recipe.selector.plan.label
    for name, figure in figures.training_figures(counters.history, selector.history, label).items():
        logger.log_figure(figure, f"figures/{name}.png")
    exported = recipe.task.export(recipe.raw_model)
    if exported is not None:
        with tempfile.TemporaryDirectory(prefix="attent-export-") as tmp:
            path = Path(tmp) / contract.PRETRAINED_FILE
            torch.save(exported, path)
            logger.log_files([path], contract.PRETRAINED_ARTIFACT)
    if recipe.antk:
        recipe.antk.log_final(logger)


def log_model(logger: RunLogger, recipe: TrainingRecipe) -> None:
    """The trained model as the run's MLflow logged model (``logged_models``), its cost logged as
    ``time_model_log_s``. A model that fails to log does not fail the finished run (its weights
    are in the run's last checkpoint): the reason is printed and tagged."""
    cfg = recipe.cfg
    started = time.perf_counter()
    try:
        model_id = logged_models.log_trained_model(
            recipe.task,
            recipe.raw_model,
            run_id=logger.run_id,
            step=cfg.train.epochs,
            registered_model=cfg.mlflow.registered_model,
            client=logger.client,
        )
    except Exception as error:  # noqa: BLE001 -- export, flavour and store errors alike
        reason = f"{type(error).__name__}: {error}"
        recipe.ctx.log(f"the trained model was not logged in MLflow ({reason})")
        logger.set_tag(contract.TAG_MODEL_LOG_ERROR, reason)
        return
    if model_id is not None:
        logger.log_metrics({contract.TIME_MODEL_LOG: time.perf_counter() - started}, step=cfg.train.epochs)
        recipe.ctx.log(f"logged the trained model as models:/{model_id}")


def format_row(row: dict[str, float], epochs: int) -> str:
    """An epoch's metrics row as the one line a run prints per epoch."""
    evals = "".join(
        f"{k[len(contract.EVAL_PREFIX) :]} {v:.4f}, " for k, v in row.items() if k.startswith(contract.EVAL_PREFIX)
    )
    return (
        f"epoch {int(row['epoch'])}/{epochs}: selected {row[contract.SELECTED_RATIO]:.0%}, "
        f"train loss {row[contract.TRAIN_LOSS]:.4f}, {evals}method cost {row[contract.TIME_METHOD]:.1f}s "
        f"(train {row[contract.time_metric('train')]:.1f}s, scoring {row[contract.time_metric('scoring')]:.1f}s), "
        f"eval {row[contract.time_metric('eval')]:.1f}s"
    )
