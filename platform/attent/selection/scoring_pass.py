"""A scoring pass's loader: built once per run and batch size, its worker processes kept between
passes, the samples of each pass swapped into its sampler (a pass's own DataLoader started its
workers again at every pass)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class PassSampler(Sampler[int]):
    """The current pass's sample indices, set before each pass."""

    def __init__(self):
        self.indices: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class ScoringLoader:
    def __init__(
        self, dataset: Dataset, collate_fn: Callable | None, num_workers: int, multiprocessing_context: str | None
    ):
        self.dataset, self.collate_fn, self.num_workers = dataset, collate_fn, num_workers
        self.multiprocessing_context = multiprocessing_context
        self.sampler = PassSampler()
        self._loader: DataLoader | None = None

    def batches(self, shard: torch.Tensor, batch_size: int, pin_memory: bool = False):
        """(indices, batch) of ``shard`` in batches of ``batch_size``, in its order."""
        if self._loader is None or self._loader.batch_size != batch_size:
            self._loader = DataLoader(
                self.dataset,
                batch_size=batch_size,
                sampler=self.sampler,
                collate_fn=self.collate_fn,
                num_workers=self.num_workers,
                persistent_workers=self.num_workers > 0,
                pin_memory=pin_memory,
                multiprocessing_context=self.multiprocessing_context if self.num_workers else None,
            )
        self.sampler.indices = shard.tolist()
        return zip(shard.split(batch_size), self._loader)
