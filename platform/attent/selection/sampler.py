"""Sharding the selected subset across ranks, the way DistributedSampler shards a dataset, and the
Selector's sampler, which remembers the order it handed out so that ``Selector.update`` knows which
samples each batch holds."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol

import torch
from torch.utils.data import Sampler

from .run_length import shard_size


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
    per_rank = shard_size(order.numel(), world_size, even=not drop_last)
    if drop_last:
        order = order[: per_rank * world_size]
    else:
        padding = per_rank * world_size - order.numel()
        if padding:
            order = torch.cat([order, order.repeat(math.ceil(padding / order.numel()))[:padding]])
    return order[rank::world_size]


class SubsetSource(Protocol):
    subset: torch.Tensor
    epoch: int


class SubsetSampler(Sampler[int]):
    """Yields this rank's share of ``source.subset`` (a Selector), re-read at every iteration.

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
        return shard_size(self.source.subset.numel(), self.world_size, even=not self.drop_last)

    def real_count(self) -> int:
        """Samples of this rank's shard that are no padding (the shard's first ones: padding wraps
        around at the end of the shuffled order, which positions rank + j W >= n hold)."""
        n = self.source.subset.numel()
        if self.drop_last:
            return n // self.world_size
        return max(0, -(-(n - self.rank) // self.world_size))


class RecordingSampler(SubsetSampler):
    """``SubsetSampler`` that remembers the order it last handed out, and how much of it the
    Selector has recorded."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.order = torch.empty(0, dtype=torch.long)  # this rank's indices of the current pass
        self.cursor = 0  # how many of them have been recorded
        self.passes = 0  # times iterated, for a missing-sampler check
        # Samples of the next pass recorded before a mid-epoch checkpoint: the pass still hands out
        # its whole order (a loader that skips batches iterates them too), or with ``skip_resumed``
        # only the rest (for a loop whose batching changed, which cannot skip whole batches);
        # recording goes on after them.
        self.resume_at = 0
        self.skip_resumed = False
        self._weights: tuple | None = None  # ((pass, device, dtype), (the pass's loss weights, component weights))

    def __iter__(self) -> Iterator[int]:
        self.order, self.cursor = self._indices(), self.resume_at
        start = self.resume_at if self.skip_resumed else 0
        self.resume_at, self.skip_resumed = 0, False
        self.passes += 1
        return iter(self.order[start:].tolist())

    def __len__(self) -> int:
        return super().__len__() - (self.resume_at if self.skip_resumed else 0)

    def rewind(self) -> None:
        """A new epoch's pass: nothing of it recorded yet."""
        self.cursor = 0

    def resume(self, skip: bool) -> None:
        """The next pass goes on after the samples recorded before a mid-epoch state (``skip``:
        it hands out only the rest; else its whole order, a loader skipping the batches itself)."""
        self.resume_at, self.skip_resumed = self.cursor, skip

    def recorded(self) -> int:
        """Samples of the pass recorded so far, padding counted once (the epoch's samples trained)."""
        return min(self.cursor, self.real_count())

    def take(self, count: int, indices: torch.Tensor | None = None) -> torch.Tensor:
        """The next ``count`` indices of the pass; or ``indices`` where the caller knows them
        better (the cursor still counts the epoch's samples)."""
        if indices is not None:
            self.cursor += count
            return torch.as_tensor(indices).reshape(-1)
        if self.passes == 0:
            raise RuntimeError(
                "update() before the sampler was iterated: build the DataLoader with "
                "sampler=selector.sampler (or use selector.loader(...))"
            )
        if self.cursor + count > self.order.numel():
            raise RuntimeError(
                f"update() got {count} losses but only {self.order.numel() - self.cursor} of this "
                "epoch's samples are left: one call per batch, losses per sample (no packing), "
                "and a DataLoader drawing from selector.sampler"
            )
        taken = self.order[self.cursor : self.cursor + count]
        self.cursor += count
        return taken

    def weights_of(
        self,
        loss_weights: torch.Tensor,
        component_weights: torch.Tensor,
        like: torch.Tensor,
        start: int,
        indices: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch's loss weights (of the pass's order from ``start``, or of the ``indices`` given)
        and the component weights, on ``like``'s device and dtype: the pass's weights move there
        once per pass, not once per batch."""
        key = (self.passes, like.device, like.dtype)
        if self._weights is None or self._weights[0] != key:
            moved = loss_weights[self.order].to(like.device, like.dtype), component_weights.to(like.device, like.dtype)
            self._weights = key, moved
        weights, components = self._weights[1]
        if indices is not None:
            return loss_weights[indices.cpu()].to(like.device, like.dtype), components
        return weights[start : start + like.shape[0]], components
