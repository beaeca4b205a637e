"""A run's training-set size for ``attent plan`` (without its data where something states it),
and what its FLOPs depend on (runs that share it are counted once)."""

from __future__ import annotations

from attent.experiment.schema import ExperimentConfig
from attent.tasks.task import Probe

_SIZE_FIELDS = {"train_limit", "val_limit", "test_limit", "split_seed", "expected_train_samples", "eval"}


def flops_key(cfg: ExperimentConfig, probe: Probe) -> str:
    """What a run's FLOPs per sample depend on: the probe's key, else its task section less
    the fields that size the data."""
    return probe.key or f"{cfg.task.name}:{cfg.task.model_dump_json(exclude=_SIZE_FIELDS)}"


def train_samples(cfg: ExperimentConfig, probe: Probe | None, given: int | None) -> int:
    """The training set's size: ``given`` (``--samples``), else ``task.expected_train_samples``,
    else a stream's rows (``stream:``, its images counted where its folder is here), else the
    probe's (a named data set's published size), else the task built on its data here.

    Raises:
        ValueError: the size is none of these (one line naming ``--samples``).
    """
    for known in (given, cfg.task.expected_train_samples):
        if known is not None:
            return known
    if cfg.stream is not None and cfg.stream.ray_data:
        rows = cfg.stream.local_rows()
        if rows is None:
            raise ValueError(
                f"run {cfg.name!r}: its stream {cfg.stream.path} is not on this machine: set "
                "task.expected_train_samples to its rows, or give --samples"
            )
        return rows
    if probe is not None and probe.train_samples is not None:
        return probe.train_samples
    try:
        cfg.task.check_data()
    except (FileNotFoundError, ValueError):
        raise ValueError(
            f"run {cfg.name!r}: its training set is not on this machine and its size is unknown: set "
            "task.expected_train_samples (a downstream job's in its task: section), or give --samples"
        ) from None
    from attent.tasks.registry import build_task

    try:  # the data is here: the task reads it (Hugging Face offline: nothing fetched)
        return len(build_task(cfg.task, seed=cfg.seed).train_dataset())
    except OSError as exc:
        raise ValueError(
            f"run {cfg.name!r}: counting its training set needs what is not on this machine "
            f"({' '.join(str(exc).split())[:200]}): set task.expected_train_samples, or give --samples"
        ) from None
