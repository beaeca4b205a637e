"""The driver's side of a stream run (``stream:``): the training set as a Ray Data dataset, which
Ray Train splits into equal per-worker shards (``DataConfig``'s streaming split) that the workers
read pass by pass (``stream_epochs``)."""

from __future__ import annotations

import logging
import random
from typing import Any

from ..experiment.schema import STREAM_SUFFIXES, ExperimentConfig


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
    stream = cfg.stream
    suffixes = list(STREAM_SUFFIXES[stream.format])
    read = {"image_folder": ray.data.read_images, "jsonl": ray.data.read_json, "parquet": ray.data.read_parquet}[
        stream.format
    ]
    # read_images: a row per file, with the file's path (its folder names its class)
    options = {"file_extensions": suffixes, **({"include_paths": True} if stream.format == "image_folder" else {})}
    options |= cfg.task.stream_read_options()
    try:
        files = sorted(read(stream.path, **options).input_files())
    except (FileNotFoundError, ValueError) as error:
        raise ValueError(f"stream.path {stream.path}: no {stream.format} file Ray Data reads there ({error})") from None
    if not files:
        raise ValueError(f"stream.path {stream.path} holds no {stream.format} file ({', '.join(suffixes)})")
    if stream.shuffle_files:  # a folder lists its classes one after the other: a stream of one class at a time
        random.Random(cfg.seed).shuffle(files)
    dataset = read(files, **options)
    # an image a row; else the records counted (Parquet from its metadata, JSON lines by a read)
    payload[STREAM_ROWS] = len(files) if stream.format == "image_folder" else dataset.count()
    return {STREAM_DATASET: dataset}
