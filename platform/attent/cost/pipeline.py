"""The input pipeline's own rate (``attent plan --measure``): the task's real loader on its data
here, as the engine builds it (its dataset, its ``loader_collate``, the run's batch and loader
processes), for a few batches, without a model."""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader

from attent.experiment.schema import ExperimentConfig


def loader_processes(cfg: ExperimentConfig, device_type: str) -> int:
    """The run's loader worker processes, as the engine sets them (``engine.recipe.loader_workers``):
    ``train.loader_workers``, else on a GPU the worker's CPUs but one, on the CPU none."""
    if cfg.train.loader_workers is not None:
        return cfg.train.loader_workers
    return max(0, int(cfg.ray.cpus_per_worker) - 1) if device_type == "cuda" else 0


def measure_loader(
    cfg: ExperimentConfig, device_type: str, *, batches: int = 8, min_seconds: float = 0.5
) -> tuple[float, int] | None:
    """(samples/s, loader processes) of the run's training loader on this machine, after one
    untimed batch (its processes starting): at least ``batches`` batches and ``min_seconds``,
    in random order as the sampler draws them. None where the data is not here."""
    from attent.tasks.registry import build_task

    try:
        cfg.task.check_data()
        task = build_task(cfg.task, seed=cfg.seed)
        dataset = task.train_dataset()
    except (FileNotFoundError, ValueError, OSError, ImportError):
        return None
    workers = loader_processes(cfg, device_type)
    loader = DataLoader(
        dataset,
        batch_size=cfg.train.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(cfg.seed),
        num_workers=workers,
        collate_fn=task.loader_collate,
        persistent_workers=workers > 0,
    )
    iterator, samples = iter(loader), 0
    next(iterator)
    start = time.perf_counter()
    for done in range(1, 10_000):
        try:
            batch = next(iterator)
        except StopIteration:  # a small set: round again
            iterator = iter(loader)
            continue
        samples += len(batch["index"])
        if done >= batches and time.perf_counter() - start >= min_seconds:
            break
    return samples / (time.perf_counter() - start), workers
