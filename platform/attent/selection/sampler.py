"""Sharding the selected subset across ranks, the way DistributedSampler shards a dataset."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol

import torch
from torch.utils.data import Sampler


def shard_indices(
    subset: torch.Tensor,
    rank: int,
    world_size: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
) -> torch.Tensor:
    """This rank's share of ``subset``: shuffled by (seed, epoch), identical order on every rank,
    padded by wrapping around (or trimmed with drop_last) so all ranks get the same count."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    order = subset
    if shuffle:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = subset[torch.randperm(subset.numel(), generator=g)]
    if drop_last:
        per_rank = order.numel() // world_size
        order = order[: per_rank * world_size]
    else:
        per_rank = math.ceil(order.numel() / world_size)
        padding = per_rank * world_size - order.numel()
        if padding:
            order = torch.cat([order, order.repeat(math.ceil(padding / order.numel()))[:padding]])
    return order[rank::world_size]


class SubsetSource(Protocol):
    subset: torch.Tensor
    epoch: int


class SubsetSampler(Sampler[int]):
    """Yields this rank's share of ``source.subset`` (a Teacher), re-read at every iteration.

    Pass it as ``DataLoader(sampler=...)`` and do not let Ray's ``prepare_data_loader`` add a
    DistributedSampler (``add_dist_sampler=False``): this sampler already shards.
    """

    def __init__(
        self,
        source: SubsetSource,
        rank: int = 0,
        world_size: int = 1,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ):
        self.source, self.rank, self.world_size = source, rank, world_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last

    def _indices(self) -> torch.Tensor:
        return shard_indices(
            self.source.subset,
            self.rank,
            self.world_size,
            epoch=self.source.epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices().tolist())

    def __len__(self) -> int:
        n = self.source.subset.numel()
        return n // self.world_size if self.drop_last else math.ceil(n / self.world_size)
