"""The per-worker training function that Ray Train's TorchTrainer runs on every rank.

One epoch = teacher.begin_epoch (maybe a scoring pass, maybe a re-selection) -> train on this
rank's shard of the selected subset, feeding the teacher the per-sample losses of the training
forwards -> teacher.end_epoch (all-gather) -> evaluate -> log (rank 0) -> checkpoint.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from ..config import ExperimentConfig
from ..selection import SubsetSampler, Teacher, shard_indices
from ..tasks import Task, build_task
from . import checkpoint, figures
from .lr import lr_factor
from .tracking import RunLogger

TIME_KEYS = ("train", "scoring", "selection", "eval", "checkpoint")


@dataclass
class Progress:
    """Counters that survive restarts (stored in every checkpoint)."""
    next_epoch: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in ("total",) + TIME_KEYS})
    samples_forwarded: int = 0        # training + scoring forwards, all ranks
    samples_backpropagated: int = 0   # training forwards (each also back-propagated)
    optimizer_steps: int = 0
    history: list[dict[str, float]] = field(default_factory=list)  # one row per epoch


def train_loop_per_worker(payload: dict[str, Any]) -> None:
    cfg = ExperimentConfig.model_validate(payload["config"])
    _quiet_ray_train_reports()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    log = (lambda msg: print(f"[attent] {msg}", flush=True)) if rank == 0 else (lambda msg: None)
    setup_start = time.perf_counter()

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    task = build_task(cfg.task, seed=cfg.seed)
    train_set = task.train_dataset()
    num_samples = len(train_set)
    model = ray.train.torch.prepare_model(task.build_model())
    raw_model = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    defaults = task.optimizer_defaults()
    base_lr = cfg.train.lr or defaults.get("lr", 1e-3)
    schedule = cfg.train.schedule or defaults.get("schedule", "cosine")
    warmup = cfg.train.warmup_ratio if cfg.train.warmup_ratio is not None else defaults.get("warmup_ratio", 0.0)
    weight_decay = cfg.train.weight_decay if cfg.train.weight_decay is not None else defaults.get("weight_decay", 0.0)
    global_batch = cfg.train.global_batch_size or defaults.get("global_batch_size")
    accumulation = max(1, math.ceil(global_batch / (cfg.train.batch_size * world))) if global_batch else 1
    optimizer = torch.optim.AdamW(task.trainable_parameters(raw_model), lr=base_lr, weight_decay=weight_decay)

    teacher = Teacher(num_samples, cfg.selection, cfg.train.epochs, seed=cfg.seed, groups=task.group_labels())
    loader = DataLoader(train_set, batch_size=cfg.train.batch_size, collate_fn=task.collate,
                        sampler=SubsetSampler(teacher, rank, world, seed=cfg.seed),
                        num_workers=cfg.train.loader_workers)
    state = Progress()
    restored = ray.train.get_checkpoint()
    if restored:
        with restored.as_directory() as directory:
            saved = checkpoint.load(directory)
        checkpoint.load_trainable_state(raw_model, saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        teacher.load_state_dict(saved["teacher"])
        state = Progress(**saved["progress"])
        log(f"resumed from checkpoint after epoch {state.next_epoch - 1}")
    logger = RunLogger(payload["tracking_uri"], payload["run_id"]) if rank == 0 else None
    if logger and not restored:
        logger.log_metrics({"time_setup_s": time.perf_counter() - setup_start,
                            "num_train_samples": num_samples, "grad_accumulation": accumulation})
    log(f"{cfg.name}: {num_samples} samples, {world} worker(s) on {device}, "
        f"selection {cfg.selection.label()}, {cfg.train.epochs} epochs")

    def amp():
        if cfg.train.precision == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    for epoch in range(state.next_epoch, cfg.train.epochs):
        epoch_start = time.perf_counter()
        # Dropout and other randomness depend on (seed, epoch, rank) only: a resumed run replays it.
        torch.manual_seed(cfg.seed * 7919 + epoch * 104729 + rank)
        spent_before = dict(teacher.seconds)
        scoring = _ScoringPass(task, raw_model, train_set, cfg, rank, world, device)
        teacher.begin_epoch(epoch, score_fn=scoring)
        scored_local = scoring.samples
        subset_checksum = _check_ranks_agree(teacher.subset)

        model.train()
        train_start = time.perf_counter()
        losses_sum, seen_local, steps_local = 0.0, 0, 0
        batches = len(loader)
        for step, batch in enumerate(loader):
            batch = _to_device(batch, device)
            with amp():
                losses = task.per_sample_loss(model, batch)
            teacher.observe(batch["index"], losses)
            weights = teacher.loss_weights[batch["index"].cpu()].to(device, losses.dtype)
            loss = (losses * weights).mean() / accumulation
            update = (step + 1) % accumulation == 0 or step + 1 == batches
            no_sync = model.no_sync() if world > 1 and not update else contextlib.nullcontext()
            with no_sync:
                loss.backward()
            if update:
                progress = (epoch + (step + 1) / batches) / cfg.train.epochs
                for group in optimizer.param_groups:
                    group["lr"] = base_lr * lr_factor(progress, schedule, warmup)
                if cfg.train.grad_clip:
                    torch.nn.utils.clip_grad_norm_(task.trainable_parameters(raw_model), cfg.train.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                steps_local += 1
            losses_sum += float(losses.detach().sum())
            seen_local += losses.numel()
            if rank == 0 and batches >= 20 and (step + 1) % max(1, batches // 4) == 0 and step + 1 < batches:
                log(f"  epoch {epoch + 1}/{cfg.train.epochs}: {step + 1}/{batches} batches, "
                    f"loss {losses_sum / max(seen_local, 1):.4f}")
        teacher.end_epoch()
        train_seconds = time.perf_counter() - train_start

        eval_metrics: dict[str, float] = {}
        eval_seconds = 0.0
        if (epoch + 1) % cfg.train.eval_every == 0 or epoch + 1 == cfg.train.epochs:
            eval_start = time.perf_counter()
            raw_model.eval()
            with torch.no_grad(), amp():
                eval_metrics = task.evaluate(raw_model, rank=rank, world_size=world, progress=log)
            eval_seconds = time.perf_counter() - eval_start

        loss_total, seen, scored = _all_reduce([losses_sum, seen_local, scored_local], device)
        state.samples_backpropagated += int(seen)
        state.samples_forwarded += int(seen + scored)
        state.optimizer_steps += steps_local
        state.seconds["train"] += train_seconds
        state.seconds["eval"] += eval_seconds
        for key in ("scoring", "selection"):
            state.seconds[key] += teacher.seconds[key] - spent_before[key]
        state.seconds["total"] += time.perf_counter() - epoch_start
        row = _epoch_row(epoch, state, teacher, loss_total / max(seen, 1), eval_metrics, num_samples, cfg)
        row["subset_checksum"] = subset_checksum
        state.history.append(row)
        state.next_epoch = epoch + 1
        log(_format_row(row, cfg.train.epochs))

        if logger:
            logger.log_metrics(row, step=epoch)
            if state.next_epoch == cfg.train.epochs:
                _log_final(logger, state, teacher, num_samples, cfg)

        ckpt_start = time.perf_counter()
        tmp = None
        if rank == 0:
            tmp = checkpoint.save({"model": checkpoint.trainable_state(raw_model),
                                   "optimizer": optimizer.state_dict(), "teacher": teacher.state_dict(),
                                   "progress": asdict(state)})
        ray.train.report({k: v for k, v in row.items() if v == v},
                         checkpoint=ray.train.Checkpoint.from_directory(tmp.name) if tmp else None)
        if tmp:
            tmp.cleanup()
        state.seconds["checkpoint"] += time.perf_counter() - ckpt_start
        _maybe_fail(cfg, epoch, rank)


def _quiet_ray_train_reports() -> None:
    """Ray Train logs every report (metrics and all) at INFO under a logger named after its file,
    outside the 'ray.train' hierarchy that LoggingConfig controls; our epoch lines say it better."""
    from ray.train.v2._internal.execution import context
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


class _ScoringPass:
    """The re-scoring pass the teacher asks for: per-sample losses of this rank's shard of the
    whole training set, in eval mode, no gradients. Counts the samples it forwards."""

    def __init__(self, task: Task, model, train_set, cfg: ExperimentConfig, rank: int, world: int, device):
        self.task, self.model, self.device, self.samples = task, model, device, 0
        shard = shard_indices(torch.arange(len(train_set)), rank, world, shuffle=False).tolist()
        self.loader = DataLoader(train_set, batch_size=cfg.train.scoring_batch_size or 2 * cfg.train.batch_size,
                                 sampler=shard, collate_fn=task.collate, num_workers=cfg.train.loader_workers)

    def __call__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            for batch in self.loader:
                batch = _to_device(batch, self.device)
                losses = self.task.per_sample_loss(self.model, batch)
                self.samples += losses.numel()
                yield batch["index"], losses
        self.model.train(was_training)


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _check_ranks_agree(subset: torch.Tensor) -> float:
    """Checksum of the epoch's subset, verified equal on every rank: the teachers' tables and
    generators must never diverge (a silent divergence would train ranks on different data)."""
    checksum = float((subset.double() * 2.0 ** -20).sin().sum() + subset.numel())
    if dist.is_available() and dist.is_initialized():
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, checksum)
        if len(set(gathered)) != 1:
            raise RuntimeError(f"ranks selected different subsets (checksums {gathered})")
    return checksum


def _all_reduce(values: list[float], device: torch.device) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()):
        return values
    tensor = torch.tensor(values, dtype=torch.float64,
                          device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(tensor)
    return tensor.tolist()


def _epoch_row(epoch: int, state: Progress, teacher: Teacher, train_loss: float,
               eval_metrics: dict[str, float], num_samples: int, cfg: ExperimentConfig) -> dict[str, float]:
    row = {"epoch": epoch + 1, "train_loss": train_loss, "selected_ratio": teacher.selected_ratio,
           "samples_forwarded": state.samples_forwarded, "samples_backpropagated": state.samples_backpropagated,
           **{f"time_{k}_s": v for k, v in state.seconds.items()}}
    row.update({f"eval_{k}": v for k, v in eval_metrics.items()})
    return row


def _format_row(row: dict[str, float], epochs: int) -> str:
    evals = "".join(f"{k[5:]} {v:.4f}, " for k, v in row.items() if k.startswith("eval_"))
    return (f"epoch {int(row['epoch'])}/{epochs}: selected {row['selected_ratio']:.0%}, "
            f"train loss {row['train_loss']:.4f}, {evals}elapsed {row['time_total_s']:.1f}s "
            f"(train {row['time_train_s']:.1f}s, scoring {row['time_scoring_s']:.1f}s)")


def _log_final(logger: RunLogger, state: Progress, teacher: Teacher, num_samples: int,
               cfg: ExperimentConfig) -> None:
    full_data = num_samples * cfg.train.epochs
    last = state.history[-1]
    finals = {f"time_{k}_s": v for k, v in state.seconds.items()}
    finals.update({
        "samples_forwarded": state.samples_forwarded, "samples_backpropagated": state.samples_backpropagated,
        "sample_saving": 1.0 - state.samples_backpropagated / full_data,
        "mean_selected_ratio": sum(r["selected_ratio"] for r in state.history) / len(state.history),
        "optimizer_steps": state.optimizer_steps,
        **{k: v for k, v in last.items() if k.startswith("eval_")},
    })
    logger.log_metrics(finals, step=cfg.train.epochs)
    selections = [dict(r.summary(), indices=r.indices.tolist() if cfg.mlflow.log_selected_indices else None)
                  for r in teacher.history]
    logger.log_json({"num_samples": num_samples, "selections": selections}, "selection_history.json")
    logger.log_json(state.history, "epoch_history.json")
    for name, figure in figures.training_figures(state.history, teacher.history, cfg.selection.label()).items():
        logger.log_figure(figure, f"figures/{name}.png")
        figures.close(figure)


def _maybe_fail(cfg: ExperimentConfig, epoch: int, rank: int) -> None:
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
