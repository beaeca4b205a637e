"""The Selector's sampler: this rank's shard of the epoch's subset, remembered in the order the
DataLoader got it, so that ``Selector.update`` knows which samples each batch holds."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..selection.sampler import SubsetSampler


class RecordingSampler(SubsetSampler):
    """``SubsetSampler`` that remembers the order it last handed out, so that ``Selector.update``
    knows which samples each batch holds."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.order = torch.empty(0, dtype=torch.long)  # this rank's indices of the current pass
        self.cursor = 0  # how many of them update() has consumed
        self.passes = 0  # times iterated, for a missing-sampler check
        # Samples of the next pass trained on before a mid-epoch checkpoint: the pass still hands
        # out its whole order (a loader that skips batches iterates them too), update() goes on
        # after them.
        self.resume_at = 0

    def __iter__(self) -> Iterator[int]:
        self.order, self.cursor, self.resume_at = self._indices(), self.resume_at, 0
        self.passes += 1
        return iter(self.order.tolist())

    def take(self, count: int) -> torch.Tensor:
        """The next ``count`` indices of the pass."""
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
