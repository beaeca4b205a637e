"""The training recipe every rank runs, free of Ray and MLflow (``driver`` runs it on Ray Train
and logs it):

    setup -> [restore] -> per epoch: select -> train_one_epoch -> evaluate -> record

``select`` asks the teacher for the epoch's subset (a scoring pass first when one is due);
``train_one_epoch`` feeds the teacher the per-sample losses of its own forwards; ``record`` sums
the epoch over ranks into the run's counters. The recipe knows nothing about any particular task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from .. import contract
from ..config import ExperimentConfig
from ..selection.sampler import SubsetSampler, shard_indices
from ..selection.schedules import training_progress
from ..selection.strategies import subset_checksum
from ..selection.teacher import Teacher
from ..tasks import weights
from ..tasks.registry import build_task
from ..tasks.task import Batch, OptimizerSpec, Task
from . import antk, checkpoint
from .counters import RunCounters, timed
from .lr import lr_factor

# Scoring batch = this x the training batch, per device type. Scoring keeps no activations for a
# backward pass, so on a GPU a larger batch fits and fills it. On CPU larger batches only spill
# caches: the offline MAE's 4000 samples score in 3.6 s at batch 64-256 and 5.8 s at 512.
SCORING_BATCH_FACTOR = {"cpu": 2, "cuda": 4}


@dataclass(frozen=True)
class WorkerContext:
    """Where this copy of the recipe runs."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

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
    seen: int = 0  # samples back-propagated
    scored: int = 0  # samples forwarded by scoring passes
    steps: int = 0  # optimiser steps
    component_sums: list[float] = dataclasses.field(default_factory=list)  # per loss component


def resolve_optimizer(spec: OptimizerSpec, cfg: ExperimentConfig) -> OptimizerSpec:
    """The task's defaults with every ``train:`` field the user set on top."""
    train = cfg.train
    chosen = {
        "lr": train.lr,
        "weight_decay": train.weight_decay,
        "betas": train.betas,
        "schedule": train.schedule,
        "warmup_ratio": train.warmup_ratio,
        "global_batch_size": train.global_batch_size,
    }
    return dataclasses.replace(spec, **{k: v for k, v in chosen.items() if v is not None})


class TrainingRecipe:
    """One training run on one rank. The driver calls ``setup``, maybe ``restore``, then
    ``run_epoch`` per epoch; a test calls the same steps on a plain torch set-up."""

    def __init__(self, cfg: ExperimentConfig, ctx: WorkerContext):
        self.cfg, self.ctx = cfg, ctx
        self.counters = RunCounters()
        self.setup_seconds: dict[str, float] = {}  # the set-up's parts (contract.SETUP_PARTS)

    # --- setup --------------------------------------------------------------------------------
    def setup(self, wrap_model=lambda model: model) -> None:
        """Task, data, model (``train.init_weights`` loaded; ``wrap_model``: DDP placement),
        optimiser, teacher, loader."""
        cfg, ctx = self.cfg, self.ctx
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        with timed(self.setup_seconds, "data"):
            self.task: Task = build_task(cfg.task, seed=cfg.seed)
            self.train_set = self.task.train_dataset()
        with timed(self.setup_seconds, "model"):
            model = self.task.build_model()
            if cfg.train.init_weights:  # before DDP wraps it: every rank starts from the same weights
                self.task.load_weights(model, weights.load_weights(cfg.train.init_weights).state)
            self.model = wrap_model(model)
        self.raw_model = getattr(self.model, "module", self.model)
        self.optim = resolve_optimizer(self.task.optimizer_spec(), cfg)
        per_step = cfg.train.batch_size * ctx.world_size
        self.accumulation = (
            max(1, math.ceil(self.optim.global_batch_size / per_step)) if self.optim.global_batch_size else 1
        )
        groups = self.task.parameter_groups(self.raw_model, self.optim.weight_decay)
        # Gathered once, not per step: a walk of the LoRA model takes 2 ms, ~1 % of an H100 step
        self.trainable = self.task.trainable_parameters(self.raw_model)
        self.optimizer = torch.optim.AdamW(groups, lr=self.optim.lr, betas=self.optim.betas, eps=self.optim.eps)
        self.teacher = Teacher(
            len(self.train_set),
            cfg.selection,
            cfg.train.epochs,
            seed=cfg.seed,
            groups=self.task.group_labels(),
            components=len(self.task.loss_components),
        )
        self.loader = DataLoader(
            self.train_set,
            batch_size=cfg.train.batch_size,
            collate_fn=self.task.collate,
            num_workers=cfg.train.loader_workers,
            sampler=SubsetSampler(self.teacher, ctx.rank, ctx.world_size, seed=cfg.seed),
        )
        self.antk = antk.tracker_for(
            cfg, self.task, self.raw_model, ctx.rank, ctx.device
        )  # None unless antk.enabled, rank 0

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: trainable weights, optimiser, teacher, counters (and kernels)."""
        return {
            "model": checkpoint.trainable_state(self.raw_model),
            "optimizer": self.optimizer.state_dict(),
            "teacher": self.teacher.state_dict(),
            "progress": asdict(self.counters),
            **({antk.STATE_KEY: self.antk.state_dict()} if self.antk else {}),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        checkpoint.load_trainable_state(self.raw_model, saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.teacher.load_state_dict(saved["teacher"])
        self.counters = RunCounters(**saved["progress"])
        if self.antk and antk.STATE_KEY in saved:  # the kernels of the epochs before the checkpoint
            self.antk.load_state_dict(saved[antk.STATE_KEY])
        self.ctx.log(f"resumed from checkpoint after epoch {self.counters.next_epoch}")

    def amp(self, precision: str | None = None):
        if (precision or self.cfg.train.precision) == "bf16":
            return torch.autocast(self.ctx.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # --- one epoch ----------------------------------------------------------------------------
    def run_epoch(self, epoch: int) -> dict[str, float]:
        """Select, train, evaluate, each timed; the epoch's metrics row."""
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

    def select(self, epoch: int) -> tuple[float, int]:
        """The teacher prepares the epoch's subset (scoring pass and re-selection when due);
        returns the subset's checksum, equal on every rank, and the samples scored here."""
        scoring = ScoringPass(self, epoch)
        self.teacher.begin_epoch(epoch, score_fn=scoring)
        return check_ranks_agree(self.teacher.subset), scoring.samples

    def train_one_epoch(self, epoch: int) -> EpochStats:
        """One pass over this rank's shard of the teacher's subset: per-sample losses, which the
        teacher observes (its scores for free), a weighted backward per micro-batch, and every
        ``accumulation`` micro-batches one optimiser step at the learning rate of the progress
        reached."""
        cfg, ctx, teacher = self.cfg, self.ctx, self.teacher
        stats = EpochStats()
        self.model.train()
        steps = math.ceil(len(self.loader) / self.accumulation)
        batches = iter(self.loader)
        for step in range(1, steps + 1):
            window = list(itertools.islice(batches, self.accumulation))  # one optimiser step; the last may be short
            # Each sample weighs 1 / (samples in the window): the accumulated gradient is that of one
            # batch of the whole window, a short last window included. Ranks hold equally long
            # shards (the sampler pads), so DDP's average over ranks makes it the mean over all.
            in_window = sum(len(batch["index"]) for batch in window)
            window_loss = 0.0
            for position, batch in enumerate(window):
                batch = to_device(batch, ctx.device)
                with self.amp():
                    losses = self.task.per_sample_loss(self.model, batch)  # [B], or [B, C] components
                teacher.observe(batch["index"], losses)
                scores = losses
                if losses.ndim == 2:  # components: summed into the score, weighed by the teacher into the loss
                    sums = losses.detach().float().sum(dim=0).tolist()
                    stats.component_sums = [a + b for a, b in zip(stats.component_sums or [0.0] * len(sums), sums)]
                    losses, scores = (
                        losses @ teacher.component_weights.to(losses.device, losses.dtype),
                        losses.sum(dim=1),
                    )
                weights = teacher.loss_weights[batch["index"].cpu()].to(losses.device, losses.dtype)
                last = position == len(window) - 1  # DDP all-reduces the gradients there only
                with contextlib.nullcontext() if last or not ctx.distributed else self.model.no_sync():
                    ((losses * weights).sum() / in_window).backward()
                window_loss += float(scores.detach().sum())
            progress = training_progress(epoch, cfg.train.epochs, step / steps)
            factor = lr_factor(progress, self.optim.schedule, self.optim.warmup_ratio)
            for group in self.optimizer.param_groups:  # lr_scale: e.g. layer-wise lr decay
                group["lr"] = self.optim.lr * factor * group.get("lr_scale", 1.0)
            if cfg.train.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.trainable, cfg.train.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            stats.loss_sum += window_loss
            stats.seen += in_window
            stats.steps += 1
            if steps >= 8 and step % max(1, steps // 4) == 0 and step < steps:
                ctx.log(
                    f"  epoch {epoch + 1}/{cfg.train.epochs}: {step}/{steps} steps, "
                    f"loss {stats.loss_sum / max(stats.seen, 1):.4f}"
                )
        teacher.end_epoch()
        return stats

    def evaluate(self, epoch: int) -> dict[str, float]:
        if (epoch + 1) % self.cfg.train.eval_every and epoch + 1 != self.cfg.train.epochs:
            return {}
        self.raw_model.eval()
        with torch.no_grad(), self.amp():
            metrics = self.task.evaluate(
                self.raw_model, rank=self.ctx.rank, world_size=self.ctx.world_size, progress=self.ctx.log
            )
        return {contract.EVAL_PREFIX + k: v for k, v in metrics.items()}

    def record(self, epoch: int, stats: EpochStats, evals: dict[str, float], checksum: float) -> dict[str, float]:
        """Sum the epoch over ranks into the counters; the epoch's metrics row."""
        loss_sum, seen, scored, *component_sums = all_reduce(
            [stats.loss_sum, stats.seen, stats.scored, *stats.component_sums], self.ctx
        )
        counters = self.counters
        counters.samples_backpropagated += (
            self.teacher.subset.numel()
        )  # distinct: the padding that evens out ranks is not counted
        counters.samples_forwarded += int(seen + scored)
        counters.optimizer_steps += stats.steps
        counters.next_epoch = epoch + 1
        row = {
            "epoch": epoch + 1,
            contract.TRAIN_LOSS: loss_sum / max(seen, 1),
            contract.SELECTED_RATIO: self.teacher.selected_ratio,
            contract.SAMPLES_FORWARDED: counters.samples_forwarded,
            contract.SAMPLES_BACKPROPAGATED: counters.samples_backpropagated,
            contract.SUBSET_CHECKSUM: checksum,
            **counters.time_metrics(),
            **evals,
            **self.component_metrics(component_sums, seen),
            **self.pick_metrics(),
        }
        counters.history.append(row)
        return row

    def final_metrics(self) -> dict[str, float]:
        """The run's end-of-run metrics (logged at step = epochs): its time split, samples,
        savings, selected ratios, optimiser steps and the last epoch's evaluation."""
        counters, epochs = self.counters, self.cfg.train.epochs
        ratios = [row[contract.SELECTED_RATIO] for row in counters.history]
        return {
            **counters.time_metrics(),
            contract.SAMPLES_FORWARDED: counters.samples_forwarded,
            contract.SAMPLES_BACKPROPAGATED: counters.samples_backpropagated,
            contract.SAMPLE_SAVING: 1.0 - counters.samples_backpropagated / (len(self.train_set) * epochs),
            contract.MEAN_SELECTED_RATIO: sum(ratios) / len(ratios),
            contract.MAX_SELECTED_RATIO: max(ratios),
            contract.OPTIMIZER_STEPS: counters.optimizer_steps,
            **{k: v for k, v in counters.history[-1].items() if k.startswith(contract.EVAL_PREFIX)},
        }

    def pick_metrics(self) -> dict[str, float]:
        """How hard the pick in force is and how much it shares with the one before (absent
        without a pick, e.g. full data)."""
        if not self.teacher.history:
            return {}
        last = self.teacher.history[-1]
        return {
            name: value
            for name, value in (
                (contract.SELECTION_HARDNESS, last.hardness),
                (contract.SELECTION_OVERLAP, last.overlap),
                (contract.SCORE_AGREEMENT, last.score_agreement),
            )
            if value == value
        }

    def component_metrics(self, sums: list[float], seen: float) -> dict[str, float]:
        """Each loss component's mean training loss this epoch, and its weight in the loss."""
        names = self.task.loss_components
        if not names or not sums:
            return {}
        weights = self.teacher.component_weights.tolist()
        return {
            **{contract.component_loss_metric(n): s / max(seen, 1) for n, s in zip(names, sums)},
            **{contract.component_weight_metric(n): w for n, w in zip(names, weights)},
        }


class ScoringPass:
    """The re-scoring pass the teacher asks for: per-sample losses of this rank's shard of the
    whole training set, in eval mode and ``train.scoring_precision`` (default: the training
    precision), no gradients."""

    def __init__(self, recipe: TrainingRecipe, round_: int):
        self.recipe, self.round, self.samples = recipe, round_, 0

    def __call__(self, indices: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        r = self.recipe
        dataset = r.task.scoring_dataset()
        shard = shard_indices(indices, r.ctx.rank, r.ctx.world_size, shuffle=False)
        factor = SCORING_BATCH_FACTOR.get(r.ctx.device.type, 2)
        loader = DataLoader(
            dataset,
            batch_size=r.cfg.train.scoring_batch_size or factor * r.cfg.train.batch_size,
            sampler=shard.tolist(),
            collate_fn=r.task.collate,
            num_workers=r.cfg.train.loader_workers,
        )
        was_training = r.raw_model.training
        r.raw_model.eval()
        with torch.inference_mode(), r.amp(r.cfg.train.scoring_precision):
            for batch in loader:
                batch = to_device(batch, r.ctx.device)
                losses = r.task.score(r.raw_model, batch, self.round)
                self.samples += len(batch["index"])
                yield batch["index"], losses
        r.raw_model.train(was_training)


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


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def check_ranks_agree(subset: torch.Tensor) -> float:
    """Checksum of the epoch's subset, verified equal on every rank: the teachers' tables and
    generators must never diverge (a silent divergence would train ranks on different data)."""
    checksum = subset_checksum(subset)
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
