"""The training recipe every rank runs, free of Ray and MLflow (``driver`` runs it on Ray Train
and logs it):

    setup -> [restore] -> per epoch: select -> train_one_epoch -> evaluate -> record

The selection is ``attent.Selector``, the one users put in their own loops: ``select`` begins
its epoch (a scoring pass and a re-selection where the plan says so); ``train_one_epoch`` hands it
each batch's per-sample losses through ``update``, back-propagates the weighed losses it returns
and ends the epoch; ``record`` reads the epoch's sums over ranks from it. The learning rate reads
the plan's training progress (``Plan.progress``), the clock every integration shares. The recipe keeps what is the engine's: devices, DDP and ``no_sync``,
accumulation windows, the learning-rate schedule, evaluation and the run's counters. It knows
nothing about any particular task.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from .. import contract
from ..experiment.schema import ExperimentConfig
from ..selection.resume import folded, rank_part, with_rank_part
from ..selection.run_length import optimiser_steps
from ..selection.selector import Selector
from ..tasks import weights
from ..tasks.registry import build_task
from ..tasks.task import Batch, Task
from . import antk, checkpoint
from .counters import RunCounters, timed
from .lr import lr_factor, resolve_optimizer
from .preemption import INSIDE_EPOCH, InsideEpoch, set_rng_state
from .stream_epochs import StreamEpochs, stream_rows


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


class TrainingRecipe:
    """One training run on one rank. The driver calls ``setup``, maybe ``restore``, then
    ``run_epoch`` per epoch; a test calls the same steps on a plain torch set-up."""

    def __init__(self, cfg: ExperimentConfig, ctx: WorkerContext, stream: tuple[Any, int] | None = None):
        self.cfg, self.ctx = cfg, ctx
        self.stream = stream  # stream: Ray Data's (this rank's shard, the rows of a pass over all shards)
        self.counters = RunCounters()
        self.setup_seconds: dict[str, float] = {}  # the set-up's parts (contract.SETUP_PARTS)
        self.checkpointed_at = time.monotonic()  # rank 0's clock of ray.checkpoint_minutes
        # called after each optimiser step with (epoch, step, steps): the engine's preemption check
        self.after_step: Callable[[int, int, int], None] | None = None
        self.resume: InsideEpoch | None = None  # where a checkpoint taken inside an epoch goes on

    # --- setup --------------------------------------------------------------------------------
    def setup(self, wrap_model=lambda model: model) -> None:
        """Task, data, model (``train.init_weights`` loaded; ``wrap_model``: DDP placement),
        optimiser, selector, loader."""
        cfg, ctx = self.cfg, self.ctx
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        with timed(self.setup_seconds, "data"):
            self.task: Task = build_task(cfg.task, seed=cfg.seed)
            self.train_set = (
                self.task.train_dataset() if cfg.stream is None else stream_rows(cfg, ctx, self.task, self.stream)
            )
        expected = cfg.task.expected_train_samples
        if expected is not None and not cfg.stream and expected != len(self.train_set) and ctx.rank == 0:
            logging.getLogger(__name__).warning(
                "task.expected_train_samples is %d but the training set holds %d: attent plan priced "
                "another run; correct the field",
                expected,
                len(self.train_set),
            )
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
        on_gpu = ctx.device.type == "cuda"
        fused = cfg.train.fused_optimizer if cfg.train.fused_optimizer is not None else on_gpu
        self.optimizer = torch.optim.AdamW(
            groups, lr=self.optim.lr, betas=self.optim.betas, eps=self.optim.eps, fused=fused or None
        )
        if cfg.train.tf32 and on_gpu:  # opt-in: TF32 matmuls round fp32 inputs to 10 bits of mantissa
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        if cfg.train.compile:  # the training forward; the scoring pass and evaluation stay eager
            self.model = torch.compile(self.model)
        workers = loader_workers(cfg, ctx)
        start = LOADER_START if workers else None  # DataLoader takes no start method without processes
        if workers:  # the fork server imports these once, and each loader process forks from it with them
            multiprocessing.set_forkserver_preload(["torch", type(self.train_set).__module__])
        self.selector = self._build_selector(workers, start)
        # pinned batches copy to the GPU asynchronously; persistent workers start once, not per epoch
        self.loader = self.selector.loader(
            cfg.train.batch_size,
            num_workers=workers,
            pin_memory=on_gpu,
            persistent_workers=workers > 0,
            multiprocessing_context=start,
        )
        self.antk = antk.tracker_for(
            cfg, self.task, self.raw_model, ctx.rank, ctx.device
        )  # None unless antk.enabled, rank 0

    def _build_selector(self, workers: int, start: str | None) -> Selector | StreamEpochs:
        """The run's selector over the training set, scoring with the raw (uncompiled) model and
        ``workers`` loader processes started by ``start``, on this rank's share; of a stream, its
        pools (Ray Train's shards are equal: the rows over the ranks, rounded down)."""
        cfg, ctx = self.cfg, self.ctx
        if cfg.stream:
            shard_rows = len(self.train_set) // ctx.world_size
            return StreamEpochs(
                self.train_set,
                shard_rows,
                cfg,
                model=self.raw_model,
                loss_fn=self.scoring_loss,
                collate_fn=self.task.loader_collate,
                rank=ctx.rank,
            )
        return Selector(
            self.train_set,
            selection=cfg.selection,
            epochs=cfg.train.epochs,
            seed=cfg.seed,
            model=self.raw_model,
            loss_fn=self.scoring_loss,
            collate_fn=self.task.loader_collate,
            score_dataset=self.task.scoring_dataset(),
            score_batch_size=cfg.train.scoring_batch_size,  # None: sized from the training batch
            score_num_workers=workers,
            score_multiprocessing_context=start,
            groups=self.task.group_labels(),
            components=self.task.loss_components,
            rank=ctx.rank,
            world_size=ctx.world_size,
        )

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: trainable weights, optimiser, selector, counters (and kernels)."""
        return {
            "model": checkpoint.trainable_state(self.raw_model),
            "optimizer": self.optimizer.state_dict(),
            "selector": self.selector.state_dict(),
            "progress": asdict(self.counters),
            **({antk.STATE_KEY: self.antk.state_dict()} if self.antk else {}),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """The state of a checkpoint, taken between epochs or inside one (``INSIDE_EPOCH``)."""
        checkpoint.load_trainable_state(self.raw_model, saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.counters = RunCounters(**saved["progress"])
        inside = saved.get(INSIDE_EPOCH)
        selector = self._selector_state(saved["selector"], inside)
        # refuses, in one line, a format it cannot read; inside an epoch the pass skips what was trained
        self.selector.load_state_dict(selector, skip_trained=inside is not None)
        if self.antk and antk.STATE_KEY in saved:  # the kernels of the epochs before the checkpoint
            self.antk.load_state_dict(saved[antk.STATE_KEY])
        at = f"epoch {self.counters.next_epoch}"
        if self.resume:  # on another number of ranks than the checkpoint's, the epoch ends at its step
            at = f"step {self.resume.step} of epoch {self.resume.epoch + 1}{', which ends there' * self.resume.folded}"
        self.ctx.log(f"resumed from checkpoint after {at}")

    def _selector_state(self, state: dict[str, Any], inside: dict[str, Any] | None) -> dict[str, Any]:
        """This rank's Selector state; from a checkpoint taken inside an epoch, also where the
        epoch goes on (``resume``): at its next step on as many ranks, else ended there."""
        if inside is None:
            return state
        parts = inside["ranks"]
        if inside["world_size"] == self.ctx.world_size:
            mine = parts[self.ctx.rank]
            self.resume = InsideEpoch(inside["epoch"], inside["step"], mine["rng"])
            return mine["selector"] if self.cfg.stream else with_rank_part(state, mine["selector"])
        if self.cfg.stream:  # each rank's place in its own shard: no other split of the rows goes on from it
            raise ValueError(
                f"a stream run's checkpoint from inside epoch {inside['epoch'] + 1} resumes on the "
                f"{inside['world_size']} workers that wrote it, not {self.ctx.world_size}: set ray.num_workers to it"
            )
        self.resume = InsideEpoch(inside["epoch"], inside["step"], None, folded=True)
        return folded(state, [part["selector"] for part in parts], self.ctx.rank)

    def selection_part(self) -> dict[str, Any]:
        """This rank's part of the selection's state inside an epoch (a preemption's checkpoint)."""
        return self.selector.state_dict() if self.cfg.stream else rank_part(self.selector)

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
            before = dict(self.selector.seconds)
            self.select(epoch)
            with self.counters.timed("train"):
                steps = self.train_one_epoch(epoch)
            for part in ("scoring", "selection"):  # the selector times its own work
                spent = self.selector.seconds[part] - before[part]
                seconds[part] += spent
                seconds["train"] -= spent if self.cfg.stream else 0.0  # a stream's pools are scored inside the steps
            with self.counters.timed("eval"):
                evals = self.evaluate(epoch)
        return self.record(epoch, steps, evals)

    def select(self, epoch: int) -> None:
        """The selector prepares the epoch's subset (scoring pass and re-selection when due),
        the same on every rank."""
        self.selector.begin_epoch(epoch)

    def scoring_loss(self, model: torch.nn.Module, batch: Batch, round_: int | None = None) -> torch.Tensor:
        """A scoring pass's per-sample losses (the selector's ``loss_fn``), in
        ``train.scoring_precision`` (default: the training precision); the pass's round (which
        seeds a task's masks) is the epoch it opens unless ``round_`` is given."""
        batch = to_device(batch, self.ctx.device)
        round_ = self.selector.epoch if round_ is None else round_
        with self.amp(self.cfg.train.scoring_precision):
            return self.task.score_of(self.task.score(model, batch, round_), batch)

    def train_one_epoch(self, epoch: int) -> int:
        """One pass over this rank's shard of the epoch's subset (``train_step`` by
        ``train_step``), the selector's epoch ended after it. Restored inside the epoch, the pass
        goes on after the checkpoint's step, with the generators as they were there. Returns the
        epoch's optimiser steps (those before the checkpoint included)."""
        self.model.train()
        resume, self.resume = self.resume, None
        done = resume.step if resume else 0
        if resume and resume.folded:  # another world size: what was trained is the epoch
            self.selector.end_epoch()
            return done
        # restored inside the epoch, the loader holds the batches after the checkpoint's steps
        steps = done + optimiser_steps(len(self.loader), self.accumulation)
        batches = iter(self.loader)
        if resume:  # after iter(): it draws the loader's seed from the generator
            set_rng_state(resume.rng, self.ctx.device)
        for step in range(done + 1, steps + 1):
            self.train_step(epoch, step, steps, batches)
            if self.after_step is not None:
                self.after_step(epoch, step, steps)
        self.selector.end_epoch()  # the epoch's scores and sums merged across ranks
        return steps

    def train_step(self, epoch: int, step: int, steps: int, batches) -> None:
        """One optimiser step on the next ``accumulation`` micro-batches of ``batches``:
        per-sample losses, which the selector records (its scores for free) and weighs, a backward
        per micro-batch, then the step at the learning rate of the progress reached."""
        cfg, ctx, selector = self.cfg, self.ctx, self.selector
        window = list(itertools.islice(batches, self.accumulation))  # one optimiser step; the last may be short
        # Each sample weighs 1 / (samples in the window): the accumulated gradient is that of one
        # batch of the whole window, a short last window included. Ranks hold equally long
        # shards (the sampler pads), so DDP's average over ranks makes it the mean over all.
        in_window = sum(len(batch["index"]) for batch in window)
        for position, batch in enumerate(window):
            # DDP all-reduces the gradients at the window's last micro-batch only: the forward
            # too must run inside no_sync, where DDP decides whether the backward syncs
            last = position == len(window) - 1
            with contextlib.nullcontext() if last or not ctx.distributed else self.model.no_sync():
                batch = to_device(batch, ctx.device)
                with self.amp():
                    losses = self.task.per_sample_loss(self.model, batch)  # [B], or [B, C] components
                scores = self.task.score_of(losses, batch)
                # recorded as scores; components and loss weights applied to what is trained on
                losses = selector.update(scores, train_losses=None if scores is losses else losses)
                (losses.sum() / in_window).backward()
        if not selector.step_finite():  # a NaN or inf loss: stopped there, or (nonfinite: skip) no step
            self.optimizer.zero_grad(set_to_none=True)
            return
        progress = selector.plan.progress(epoch, step / steps)
        floor = self.optim.min_lr / self.optim.lr if self.optim.lr else 0.0  # lr 0: tests that freeze weights
        factor = lr_factor(progress, self.optim.schedule, self.optim.warmup_ratio, floor)
        for group in self.optimizer.param_groups:  # lr_scale: e.g. layer-wise lr decay
            group["lr"] = self.optim.lr * factor * group.get("lr_scale", 1.0)
        if cfg.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.trainable, cfg.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if steps >= 8 and step % max(1, steps // 4) == 0 and step < steps:
            loss = selector.metrics()[contract.TRAIN_LOSS]  # this rank's so far
            ctx.log(f"  epoch {epoch + 1}/{cfg.train.epochs}: {step}/{steps} steps, loss {loss:.4f}")

    def evaluate(self, epoch: int) -> dict[str, float]:
        if epoch not in self.cfg.train.evaluation_epochs():
            return {}
        self.raw_model.eval()
        with torch.no_grad(), self.amp():
            metrics = self.task.evaluate(
                self.raw_model, rank=self.ctx.rank, world_size=self.ctx.world_size, progress=self.ctx.log
            )
        return {contract.EVAL_PREFIX + k: v for k, v in metrics.items()}

    def record(self, epoch: int, steps: int, evals: dict[str, float]) -> dict[str, float]:
        """The epoch's metrics row: the selector's sums over ranks, into the run's counters."""
        selection = self.selector.metrics()
        counters = self.counters
        counters.samples_backpropagated = selection[contract.SAMPLES_BACKPROPAGATED]
        counters.samples_forwarded = selection[contract.SAMPLES_FORWARDED]
        counters.optimizer_steps += steps
        counters.next_epoch = epoch + 1
        components = [contract.component_loss_metric(n) for n in self.task.loss_components] + [
            contract.component_weight_metric(n) for n in self.task.loss_components
        ]
        picks = (contract.SELECTION_HARDNESS, contract.SELECTION_OVERLAP, contract.SCORE_AGREEMENT)
        row = {
            "epoch": epoch + 1,
            **{
                name: selection[name]
                for name in (
                    contract.TRAIN_LOSS,
                    contract.SELECTED_RATIO,
                    contract.SAMPLES_FORWARDED,
                    contract.SAMPLES_BACKPROPAGATED,
                    contract.SUBSET_CHECKSUM,
                )
            },
            contract.LEARNING_RATE: self.optimizer.param_groups[0]["lr"]
            / self.optimizer.param_groups[0].get("lr_scale", 1.0),
            **counters.time_metrics(),
            **evals,
            **{name: selection[name] for name in components},
            **{name: selection[name] for name in picks if selection[name] == selection[name]},  # NaN: no pick yet
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


# How loader processes start. A Ray worker runs Ray's threads beside the training: a process forked from it can
# start with a lock one of them held, and wait for it for ever (seen in a rehearsal: a loader process asleep on a
# futex since its fork, its rank's peer waiting in DDP's broadcast). A fork server forks from a process of one thread.
LOADER_START = "forkserver"


def loader_workers(cfg: ExperimentConfig, ctx: WorkerContext) -> int:
    """``train.loader_workers``, else on a GPU the CPUs Ray gives the worker but one (the training
    process's), on the CPU none."""
    if cfg.train.loader_workers is not None:
        return cfg.train.loader_workers
    return max(0, int(cfg.ray.cpus_per_worker) - 1) if ctx.device.type == "cuda" else 0


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
