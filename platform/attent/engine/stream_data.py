"""The driver's side of a stream run (``stream:``): the training set as a Ray Data dataset, which
Ray Train splits into equal per-worker shards (``DataConfig``'s streaming split) that the workers
read pass by pass (``stream_epochs``)."""

from __future__ import annotations

import logging
import random
from typing import Any

from ..experiment.schema import IMAGE_SUFFIXES, ExperimentConfig


def stream_datasets(cfg: ExperimentConfig, payload: dict[str, Any]) -> dict[str, Any] | None:
    """Ray Train's ``datasets`` of the run: the training stream under its name, its rows per pass
    written into the workers' ``payload``; None without a stream Ray Data reads.

    Raises:
        ValueError: a stream path with no file Ray Data reads.
    """
    from .worker import STREAM_DATASET, STREAM_ROWS

    if cfg.stream is None or not cfg.stream.ray_data:
        return None
    import ray.data  # a stream run only: Ray Data is heavy

    # one progress line is the run's (``progress``): no bars nor per-execution INFO lines of Ray Data's
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    options = {"include_paths": True, "file_extensions": list(IMAGE_SUFFIXES), **cfg.task.stream_read_options()}
    try:  # read_images: a row per file, the file's path with it (its folder names its class)
        files = sorted(ray.data.read_images(cfg.stream.path, **options).input_files())
    except (FileNotFoundError, ValueError) as error:
        raise ValueError(f"stream.path {cfg.stream.path}: no image Ray Data reads there ({error})") from None
    if not files:
        raise ValueError(f"stream.path {cfg.stream.path} holds no image ({', '.join(IMAGE_SUFFIXES)})")
    if cfg.stream.shuffle_files:  # a folder lists its classes one after the other: a stream of one class at a time
        random.Random(cfg.seed).shuffle(files)
    payload[STREAM_ROWS] = len(files)
    return {STREAM_DATASET: ray.data.read_images(files, **options)}
