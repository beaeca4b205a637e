"""The optimiser's settings (``resolve_optimizer``) and the learning rate as a function of
training progress measured in epochs.

Why epochs and not optimiser steps: with AtteNT an epoch shrinks to the selected subset, so the
number of steps is not known in advance and changes with the ratio schedule. Defining warmup and
decay over epoch progress keeps the learning-rate curve of a selection run the same as that of
the full-data run it is compared with; only the number of updates per epoch differs. It also
makes the schedule stateless: a resumed run recomputes it exactly.
"""

from __future__ import annotations

import dataclasses
import math

from ..experiment.schema import ExperimentConfig
from ..tasks.task import OptimizerSpec


def lr_factor(progress: float, schedule: str, warmup_ratio: float = 0.0, floor: float = 0.0) -> float:
    """Multiplier of the base learning rate at progress in [0, 1]; ``floor``: the share of the base
    rate the decay ends at (min_lr / lr), as MAE's schedule decays to its min_lr."""
    if warmup_ratio > 0 and progress < warmup_ratio:
        return max(progress / warmup_ratio, 1e-3)
    if schedule == "constant":
        return 1.0
    rest = (progress - warmup_ratio) / max(1.0 - warmup_ratio, 1e-12)
    rest = min(max(rest, 0.0), 1.0)
    if schedule == "cosine":
        decayed = 0.5 * (1.0 + math.cos(math.pi * rest))
    elif schedule == "linear":
        decayed = 1.0 - rest
    else:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}")
    return floor + (1.0 - floor) * decayed if floor else decayed


def resolve_optimizer(spec: OptimizerSpec, cfg: ExperimentConfig) -> OptimizerSpec:
    """The task's defaults with every ``train:`` field the user set on top; ``base_lr`` scaled by
    the global batch / 256 (MAE's convention)."""
    train = cfg.train
    lr = train.lr
    if train.base_lr is not None:
        global_batch = train.global_batch_size or train.batch_size * max(1, cfg.ray.max_workers)
        lr = train.base_lr * global_batch / 256
    chosen = {
        "lr": lr,
        "min_lr": train.min_lr if "min_lr" in train.model_fields_set else None,
        "weight_decay": train.weight_decay,
        "betas": train.betas,
        "schedule": train.schedule,
        "warmup_ratio": train.warmup_ratio,
        "global_batch_size": train.global_batch_size,
    }
    return dataclasses.replace(spec, **{k: v for k, v in chosen.items() if v is not None})
