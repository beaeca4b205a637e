"""The training recipe that Ray Train's TorchTrainer runs on every rank.

    setup -> [restore] -> per epoch: select -> train_one_epoch -> evaluate -> log -> save

``select`` asks the teacher for the epoch's subset (maybe after a scoring pass); training feeds
the teacher the per-sample losses of its own forwards; ``log`` writes rank 0's MLflow metrics;
``save`` checkpoints through Ray Train. The recipe knows nothing about any particular task.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from .. import contract
from ..config import ExperimentConfig
from ..selection import SubsetSampler, Teacher, shard_indices, training_progress
from ..tasks import build_task
from ..tasks.base import Batch, OptimizerSpec, Task
from . import antk, checkpoint
from .counters import RunCounters
from .lr import lr_factor

if TYPE_CHECKING:  # MLflow and matplotlib load on rank 0 only, when it logs: other ranks start sooner
    from .tracking import RunLogger

Window = list[Batch]  # the micro-batches of one optimiser step
# Scoring batch = this x the training batch, per device type. Scoring keeps no activations for a
# backward pass, so on a GPU a larger batch fits and fills it. On CPU larger batches only spill
# caches: the offline MAE's 4000 samples score in 3.6 s at batch 64-256 and 5.8 s at 512.
SCORING_BATCH_FACTOR = {"cpu": 2, "cuda": 4}
EPOCHS_ENDED_UNIX = "epochs_ended_unix"  # last report only: when the last epoch ended (driver's teardown)


@dataclass(frozen=True)
class WorkerContext:
    """Where this copy of the recipe runs."""
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @classmethod
    def from_ray_train(cls) -> "WorkerContext":
        import ray.train
        import ray.train.torch
        ctx = ray.train.get_context()
        return cls(ctx.get_world_rank(), ctx.get_world_size(), ray.train.torch.get_device())

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[attent] {message}", flush=True)


@dataclass
class EpochStats:
    """One epoch's training, summed over this rank (``all_reduce`` sums over ranks)."""
    loss_sum: float = 0.0
    seen: int = 0        # samples back-propagated
    scored: int = 0      # samples forwarded by scoring passes
    steps: int = 0       # optimiser steps
    component_sums: list[float] = dataclasses.field(default_factory=list)  # per loss component


def resolve_optimizer(spec: OptimizerSpec, cfg: ExperimentConfig) -> OptimizerSpec:
    """The task's defaults with every ``train:`` field the user set on top."""
    train = cfg.train
    chosen = {"lr": train.lr, "weight_decay": train.weight_decay, "betas": train.betas,
              "schedule": train.schedule, "warmup_ratio": train.warmup_ratio,
              "global_batch_size": train.global_batch_size}
    return dataclasses.replace(spec, **{k: v for k, v in chosen.items() if v is not None})


def micro_batch_windows(loader, accumulation: int) -> Iterator[Window]:
    """The loader's batches grouped ``accumulation`` at a time; the last window may be shorter."""
    window: Window = []
    for batch in loader:
        window.append(batch)
        if len(window) == accumulation:
            yield window
            window = []
    if window:
        yield window


class TrainingRecipe:
    """One training run on one rank. ``run()`` is the whole of it; the steps are public so a
    test (or another driver) can call them one at a time on a plain torch set-up."""

    def __init__(self, cfg: ExperimentConfig, ctx: WorkerContext, logger: RunLogger | None = None):
        self.cfg, self.ctx, self.logger = cfg, ctx, logger
        self.counters = RunCounters()
        self.epochs_ended = 0.0  # unix time the latest epoch ended

    # --- setup --------------------------------------------------------------------------------
    def setup(self, wrap_model=lambda model: model) -> None:
        """Task, data, model (``wrap_model``: DDP placement), optimiser, teacher, loader."""
        cfg, ctx = self.cfg, self.ctx
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.task: Task = build_task(cfg.task, seed=cfg.seed)
        self.train_set = self.task.train_dataset()
        self.model = wrap_model(self.task.build_model())
        self.raw_model = getattr(self.model, "module", self.model)
        self.optim = resolve_optimizer(self.task.optimizer_spec(), cfg)
        per_step = cfg.train.batch_size * ctx.world_size
        self.accumulation = max(1, math.ceil(self.optim.global_batch_size / per_step)) \
            if self.optim.global_batch_size else 1
        groups = self.task.parameter_groups(self.raw_model, self.optim.weight_decay)
        self.optimizer = torch.optim.AdamW(groups, lr=self.optim.lr, betas=self.optim.betas,
                                           eps=self.optim.eps)
        self.teacher = Teacher(len(self.train_set), cfg.selection, cfg.train.epochs, seed=cfg.seed,
                               groups=self.task.group_labels(), components=len(self.task.loss_components))
        self.loader = DataLoader(self.train_set, batch_size=cfg.train.batch_size,
                                 collate_fn=self.task.collate, num_workers=cfg.train.loader_workers,
                                 sampler=SubsetSampler(self.teacher, ctx.rank, ctx.world_size, seed=cfg.seed))
        self.antk = antk.tracker_for(cfg, self.task, self.raw_model, ctx.rank, ctx.device)  # None unless antk.enabled, rank 0

    def restore(self, saved: dict[str, Any]) -> None:
        checkpoint.load_trainable_state(self.raw_model, saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.teacher.load_state_dict(saved["teacher"])
        self.counters = RunCounters(**saved["progress"])
        if self.antk and antk.STATE_KEY in saved:  # the kernels of the epochs before the checkpoint
            self.antk.load_state_dict(saved[antk.STATE_KEY])
        self.ctx.log(f"resumed from checkpoint after epoch {self.counters.next_epoch}")

    def amp(self):
        if self.cfg.train.precision == "bf16":
            return torch.autocast(self.ctx.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # --- one epoch ----------------------------------------------------------------------------
    def select(self, epoch: int) -> tuple[float, int]:
        """The teacher prepares the epoch's subset (scoring pass and re-selection when due);
        returns the subset's checksum, equal on every rank, and the samples scored here."""
        scoring = ScoringPass(self, epoch)
        self.teacher.begin_epoch(epoch, score_fn=scoring)
        return check_ranks_agree(self.teacher.subset), scoring.samples

    def train_one_epoch(self, epoch: int) -> EpochStats:
        stats = EpochStats()
        self.model.train()
        windows = math.ceil(len(self.loader) / self.accumulation)
        for number, window in enumerate(micro_batch_windows(self.loader, self.accumulation), 1):
            loss_sum, seen = self.backward_window(window, stats)
            self.optimizer_step(training_progress(epoch, self.cfg.train.epochs, number / windows))
            stats.loss_sum += loss_sum
            stats.seen += seen
            stats.steps += 1
            if windows >= 8 and number % max(1, windows // 4) == 0 and number < windows:
                self.ctx.log(f"  epoch {epoch + 1}/{self.cfg.train.epochs}: {number}/{windows} steps, "
                             f"loss {stats.loss_sum / max(stats.seen, 1):.4f}")
        self.teacher.end_epoch()
        return stats

    def backward_window(self, window: Window, stats: EpochStats | None = None) -> tuple[float, int]:
        """Forward and backward every micro-batch of one optimiser step. Each sample weighs
        1 / (samples in the window), so the accumulated gradient equals that of one batch of the
        whole window, a short last window included. Ranks hold equally long shards (the sampler
        pads), so DDP's average over ranks makes it the mean over all ranks' samples. A task's
        loss components are weighted by the teacher (group baselines) into each sample's loss;
        its score stays their plain sum."""
        in_window = sum(len(batch["index"]) for batch in window)
        loss_sum = 0.0
        for position, batch in enumerate(window):
            batch = to_device(batch, self.ctx.device)
            with self.amp():
                losses = self.task.per_sample_loss(self.model, batch)
            self.teacher.observe(batch["index"], losses)
            losses, scores = self.weigh_components(losses, stats)
            weights = self.teacher.loss_weights[batch["index"].cpu()].to(losses.device, losses.dtype)
            last = position == len(window) - 1
            sync = contextlib.nullcontext() if last or not self.ctx.distributed else self.model.no_sync()
            with sync:
                ((losses * weights).sum() / in_window).backward()
            loss_sum += float(scores.detach().sum())
        return loss_sum, in_window

    def weigh_components(self, losses: torch.Tensor, stats: EpochStats | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(training losses, scores) per sample. [B] losses are both; [B, C] loss components
        are summed into the score and weighted by the teacher into the training loss, and their
        sums kept for the epoch's per-component metrics."""
        if losses.ndim == 1:
            return losses, losses
        if stats is not None:
            sums = losses.detach().float().sum(dim=0).tolist()
            stats.component_sums = [a + b for a, b in zip(stats.component_sums or [0.0] * len(sums), sums)]
        weights = self.teacher.component_weights.to(losses.device, losses.dtype)
        return losses @ weights, losses.sum(dim=1)

    def optimizer_step(self, progress: float) -> None:
        factor = lr_factor(progress, self.optim.schedule, self.optim.warmup_ratio)
        for group in self.optimizer.param_groups:  # lr_scale: e.g. layer-wise lr decay
            group["lr"] = self.optim.lr * factor * group.get("lr_scale", 1.0)
        if self.cfg.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.task.trainable_parameters(self.raw_model), self.cfg.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def evaluate(self, epoch: int) -> dict[str, float]:
        if (epoch + 1) % self.cfg.train.eval_every and epoch + 1 != self.cfg.train.epochs:
            return {}
        self.raw_model.eval()
        with torch.no_grad(), self.amp():
            metrics = self.task.evaluate(self.raw_model, rank=self.ctx.rank, world_size=self.ctx.world_size,
                                         progress=self.ctx.log)
        return {contract.EVAL_PREFIX + k: v for k, v in metrics.items()}

    # --- bookkeeping --------------------------------------------------------------------------
    def record(self, epoch: int, stats: EpochStats, evals: dict[str, float], checksum: float) -> dict[str, float]:
        """Sum the epoch over ranks into the counters; the epoch's metrics row."""
        loss_sum, seen, scored, *component_sums = all_reduce(
            [stats.loss_sum, stats.seen, stats.scored, *stats.component_sums], self.ctx)
        counters = self.counters
        counters.samples_backpropagated += int(seen)
        counters.samples_forwarded += int(seen + scored)
        counters.optimizer_steps += stats.steps
        counters.next_epoch = epoch + 1
        row = {"epoch": epoch + 1, contract.TRAIN_LOSS: loss_sum / max(seen, 1),
               contract.SELECTED_RATIO: self.teacher.selected_ratio,
               contract.SAMPLES_FORWARDED: counters.samples_forwarded,
               contract.SAMPLES_BACKPROPAGATED: counters.samples_backpropagated,
               contract.SUBSET_CHECKSUM: checksum, **counters.time_metrics(), **evals,
               **self.component_metrics(component_sums, seen)}
        counters.history.append(row)
        return row

    def component_metrics(self, sums: list[float], seen: float) -> dict[str, float]:
        """Each loss component's mean training loss this epoch, and its weight in the loss."""
        names = self.task.loss_components
        if not names or not sums:
            return {}
        weights = self.teacher.component_weights.tolist()
        return {**{contract.component_loss_metric(n): s / max(seen, 1) for n, s in zip(names, sums)},
                **{contract.component_weight_metric(n): w for n, w in zip(names, weights)}}

    def export(self) -> None:
        """Rank 0 saves what downstream jobs load (the task's ``export``) as the run's artifact."""
        exported = self.task.export(self.raw_model) if self.ctx.rank == 0 else None
        if exported is None or self.logger is None:
            return
        with tempfile.TemporaryDirectory(prefix="attent-export-") as tmp:
            path = Path(tmp) / contract.PRETRAINED_FILE
            torch.save(exported, path)
            self.logger.log_files([path], contract.PRETRAINED_ARTIFACT)

    def log(self, epoch: int, row: dict[str, float]) -> None:
        self.ctx.log(format_row(row, self.cfg.train.epochs))
        if self.logger is None:
            return
        self.logger.log_metrics(row, step=epoch)
        if epoch + 1 == self.cfg.train.epochs:
            log_final(self.logger, self.counters, self.teacher, len(self.train_set), self.cfg)
            self.export()
            if self.antk:
                self.antk.log_final(self.logger)

    def save(self, epoch: int, row: dict[str, float]) -> None:
        """Report the epoch through Ray Train (a barrier: every rank reports), with a checkpoint
        every ``ray.checkpoint_every`` epochs and after the last one. The last report carries the
        time the epochs ended, from which the driver measures the run's teardown."""
        import ray.train
        last = epoch + 1 == self.cfg.train.epochs
        due = last or (epoch + 1) % self.cfg.ray.checkpoint_every == 0
        with self.counters.timed("checkpoint"):
            tmp = None
            if self.ctx.rank == 0 and due:
                tmp = checkpoint.save({"model": checkpoint.trainable_state(self.raw_model),
                                       "optimizer": self.optimizer.state_dict(),
                                       "teacher": self.teacher.state_dict(), "progress": asdict(self.counters),
                                       **({antk.STATE_KEY: self.antk.state_dict()} if self.antk else {})})
            report = {k: v for k, v in row.items() if v == v}
            if last:
                report[EPOCHS_ENDED_UNIX] = self.epochs_ended
            ray.train.report(report, checkpoint=ray.train.Checkpoint.from_directory(tmp.name) if tmp else None)
            if tmp:
                tmp.cleanup()

    # --- the whole run ------------------------------------------------------------------------
    def run_epoch(self, epoch: int) -> dict[str, float]:
        # Dropout and other randomness depend on (seed, epoch, rank) only: a resumed run replays it.
        torch.manual_seed(self.cfg.seed * 7919 + epoch * 104729 + self.ctx.rank)
        seconds = self.counters.seconds
        with self.counters.timed("total"):
            before = dict(self.teacher.seconds)
            checksum, scored = self.select(epoch)
            with self.counters.timed("train"):
                stats = self.train_one_epoch(epoch)
            for part in ("scoring", "selection"):  # the teacher times its own work
                seconds[part] += self.teacher.seconds[part] - before[part]
            stats.scored = scored
            with self.counters.timed("eval"):
                evals = self.evaluate(epoch)
        return self.record(epoch, stats, evals, checksum)


def train_loop_per_worker(payload: dict[str, Any]) -> None:
    """Ray Train's entry point on every rank: the run, while each node's local rank 0 samples
    the node's system metrics (CPU, memory, GPUs) into the MLflow run."""
    import time
    started = time.perf_counter(), time.time()  # taken first: the monitor's start is no start-up of ours
    with node_system_metrics(payload):
        run_worker(payload, *started)


def run_worker(payload: dict[str, Any], start: float, entered: float) -> None:
    """One rank's run: set-up or restore, then the epochs. ``start`` and ``entered``: when the
    rank entered Ray Train's entry point (perf_counter, unix time)."""
    import time

    import ray.train
    import ray.train.torch
    # Tasks that read MLflow artifacts (a downstream job's pretrained weights) use the run's store.
    os.environ["MLFLOW_TRACKING_URI"] = payload["tracking_uri"]
    cfg = ExperimentConfig.model_validate(payload["config"])
    quiet_ray_train_reports()
    ctx = WorkerContext.from_ray_train()
    logger = None
    if ctx.rank == 0:
        from .tracking import RunLogger
        logger = RunLogger(payload["tracking_uri"], payload["run_id"])
    recipe = TrainingRecipe(cfg, ctx, logger)
    recipe.setup(wrap_model=ray.train.torch.prepare_model)
    restored = ray.train.get_checkpoint()
    if restored:
        with restored.as_directory() as directory:
            recipe.restore(checkpoint.load(directory))
        if logger:  # a restart after a failure, or a re-run resuming: visible on the run
            logger.log_metrics({contract.RESTORED_AT_EPOCH: recipe.counters.next_epoch},
                               step=recipe.counters.next_epoch)
    elif logger:
        logger.log_metrics({contract.TIME_SETUP: time.perf_counter() - start,
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
        recipe.epochs_ended = time.time()
        recipe.log(epoch, row)
        recipe.save(epoch, row)
        maybe_fail(cfg, epoch, ctx.rank)


class ScoringPass:
    """The re-scoring pass the teacher asks for: per-sample losses of this rank's shard of the
    whole training set, in eval mode and the task's precision, no gradients."""

    def __init__(self, recipe: TrainingRecipe, round_: int):
        self.recipe, self.round, self.samples = recipe, round_, 0

    def __call__(self, indices: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        r = self.recipe
        dataset = r.task.scoring_dataset()
        shard = shard_indices(indices, r.ctx.rank, r.ctx.world_size, shuffle=False)
        factor = SCORING_BATCH_FACTOR.get(r.ctx.device.type, 2)
        loader = DataLoader(dataset, batch_size=r.cfg.train.scoring_batch_size or factor * r.cfg.train.batch_size,
                            sampler=shard.tolist(), collate_fn=r.task.collate, num_workers=r.cfg.train.loader_workers)
        was_training = r.raw_model.training
        r.raw_model.eval()
        with torch.inference_mode(), r.amp():
            for batch in loader:
                batch = to_device(batch, r.ctx.device)
                losses = r.task.score(r.raw_model, batch, self.round)
                self.samples += len(batch["index"])
                yield batch["index"], losses
        r.raw_model.train(was_training)


def quiet_ray_train_reports() -> None:
    """Ray Train logs every report (metrics and all) at INFO under a logger named after its file,
    outside the 'ray.train' hierarchy that LoggingConfig controls; our epoch lines say it better."""
    from ray.train.v2._internal.execution import context
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


@contextlib.contextmanager
def node_system_metrics(payload: dict[str, Any]) -> Iterator[None]:
    """MLflow's system metrics monitor of this node, run by its local rank 0 (one per node,
    named by the node's rank) while the body runs, stopped after it whether it failed or not."""
    import ray.train
    context = ray.train.get_context()
    monitor = None
    if context.get_local_rank() == 0:  # one rank per node imports MLflow for it
        from .tracking import start_system_metrics, stop_system_metrics
        monitor = start_system_metrics(payload["tracking_uri"], payload["run_id"], context.get_node_rank())
    try:
        yield
    finally:
        if monitor is not None:
            stop_system_metrics(monitor)


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def check_ranks_agree(subset: torch.Tensor) -> float:
    """Checksum of the epoch's subset, verified equal on every rank: the teachers' tables and
    generators must never diverge (a silent divergence would train ranks on different data)."""
    checksum = float((subset.double() * 2.0 ** -20).sin().sum() + subset.numel())
    if dist.is_available() and dist.is_initialized():
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, checksum)
        if len(set(gathered)) != 1:
            raise RuntimeError(f"ranks selected different subsets (checksums {gathered})")
    return checksum


def all_reduce(values: list[float], ctx: WorkerContext) -> list[float]:
    if not ctx.distributed:
        return values
    device = ctx.device if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def format_row(row: dict[str, float], epochs: int) -> str:
    evals = "".join(f"{k[len(contract.EVAL_PREFIX):]} {v:.4f}, " for k, v in row.items()
                    if k.startswith(contract.EVAL_PREFIX))
    return (f"epoch {int(row['epoch'])}/{epochs}: selected {row[contract.SELECTED_RATIO]:.0%}, "
            f"train loss {row[contract.TRAIN_LOSS]:.4f}, {evals}method cost {row[contract.TIME_METHOD]:.1f}s "
            f"(train {row[contract.time_metric('train')]:.1f}s, scoring {row[contract.time_metric('scoring')]:.1f}s), "
            f"eval {row[contract.time_metric('eval')]:.1f}s")


def log_final(logger: RunLogger, counters: RunCounters, teacher: Teacher, num_samples: int,
              cfg: ExperimentConfig) -> None:
    """End-of-run metrics (step = epochs), selection history, epoch history and figures."""
    from . import figures
    ratios = [row[contract.SELECTED_RATIO] for row in counters.history]
    finals = {**counters.time_metrics(),
              contract.SAMPLES_FORWARDED: counters.samples_forwarded,
              contract.SAMPLES_BACKPROPAGATED: counters.samples_backpropagated,
              contract.SAMPLE_SAVING: 1.0 - counters.samples_backpropagated / (num_samples * cfg.train.epochs),
              contract.MEAN_SELECTED_RATIO: sum(ratios) / len(ratios),
              contract.MAX_SELECTED_RATIO: max(ratios),
              contract.OPTIMIZER_STEPS: counters.optimizer_steps,
              **{k: v for k, v in counters.history[-1].items() if k.startswith(contract.EVAL_PREFIX)}}
    logger.log_metrics(finals, step=cfg.train.epochs)
    selections = [dict(r.summary(), indices=r.indices.tolist() if cfg.mlflow.log_selected_indices else None)
                  for r in teacher.history]
    logger.log_json({"num_samples": num_samples, "selections": selections}, "selection_history.json")
    logger.log_json(counters.history, "epoch_history.json")
    label = cfg.selection.label(cfg.train.epochs)
    for name, figure in figures.training_figures(counters.history, teacher.history, label).items():
        logger.log_figure(figure, f"figures/{name}.png")
        figures.close(figure)


def maybe_fail(cfg: ExperimentConfig, epoch: int, rank: int) -> None:
    """Fault injection: die once (a marker file remembers) after the given epoch's checkpoint."""
    fault = cfg.fault
    if fault.fail_once_after_epoch is None or epoch != fault.fail_once_after_epoch or rank != fault.fail_rank:
        return
    marker = Path(cfg.ray.storage_path) / cfg.name / f".injected-failure-epoch{epoch}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    print(f"[attent] fault injection: rank {rank} exits after epoch {epoch + 1}", flush=True)
    os._exit(1)
