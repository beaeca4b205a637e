"""What every integration checks of the train loader a user hands its framework: that it draws
from the selection's sampler; and what the stream integrations share: each rank's share of a
stream. Imports no framework, so each integration can use it."""

from __future__ import annotations

import sys
from itertools import islice
from typing import Any

from torch.utils.data import IterableDataset

ATTRIBUTES = ("sampler", "batch_sampler")  # where a DataLoader (and accelerate's wrapper of one) keeps its sampler


def draws_from(loader: Any, sampler: Any, depth: int = 4) -> bool:
    """Whether ``loader`` draws its samples from ``sampler`` itself (not a copy, not a sampler
    that wraps it).

    Follows ``sampler`` and ``batch_sampler`` attributes down from the loader: a DataLoader's own
    sampler, its batch sampler's, and the shards accelerate wraps them in.

    Args:
        loader: a DataLoader, or a framework's wrapper of one.
        sampler: the selection's sampler (``Selector.sampler``).
        depth: how many attributes deep to look.

    Returns:
        True if ``sampler`` is found at most ``depth`` attributes below ``loader``.

    Examples:
        >>> from torch.utils.data import DataLoader, SequentialSampler
        >>> mine = SequentialSampler(range(8))
        >>> draws_from(DataLoader(range(8), sampler=mine), mine), draws_from(DataLoader(range(8)), mine)
        (True, False)
    """
    if loader is sampler:
        return True
    if depth == 0 or loader is None:
        return False
    return any(draws_from(getattr(loader, name, None), sampler, depth - 1) for name in ATTRIBUTES)


def rank_share(stream: Any, rank: int, world_size: int) -> Any:
    """This rank's items of ``stream``.

    Args:
        stream: the whole stream (an iterable, iterable again and again).
        rank: this process's rank.
        world_size: the number of processes.

    Returns:
        ``stream`` itself on one process; a Hugging Face ``datasets.IterableDataset``'s own split
        (whole shards where they divide evenly, else every world_size-th item); else every
        world_size-th item from the rank-th.
    """
    if world_size == 1:
        return stream
    hf_datasets = sys.modules.get("datasets")
    if hf_datasets is not None and isinstance(stream, hf_datasets.IterableDataset):
        from datasets.distributed import split_dataset_by_node

        return split_dataset_by_node(stream, rank=rank, world_size=world_size)
    return EveryNth(stream, rank, world_size)


class EveryNth(IterableDataset):
    """Every ``step``-th item of ``stream`` from the ``start``-th, iterable again and again.

    Args:
        stream: an iterable, iterable again and again.
        start: the first item's position.
        step: the distance between two items taken.
    """

    def __init__(self, stream: Any, start: int, step: int):
        self.stream, self.start, self.step = stream, start, step

    def __iter__(self):
        return islice(iter(self.stream), self.start, None, self.step)
