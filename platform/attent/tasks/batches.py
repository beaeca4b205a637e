"""Batches of tensor items: what the image tasks (ViT classification, the masked autoencoders)
share between their datasets and the engine's loaders.

Their items are dicts of tensors plus an integer ``"index"`` (and ``"label"``); a batch stacks
each key. Their training and scoring sets yield the stored integers (uint8 images, a quarter of
float32's bytes through the loader's queue and the host-to-device copy), and the task's
``prepare`` makes the model inputs of a batch of them on its device (``TensorItemsTask``).
"""

from __future__ import annotations

from typing import Any

import torch

from attent.tasks.task import Batch, Task

LONG_KEYS = ("index", "label")  # integers per item, batched as LongTensor[B]


def stack(values: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack``, in the items' own memory order.

    Channels-last [C, H, W] views (rows of a decoded cache) stack into a channels-last batch with
    one plain copy, not a strided one; any other tensors as ``torch.stack`` stacks them.

    Args:
        values: tensors of one shape and dtype, one per item.

    Returns:
        The batch [B, ...], channels-last where every item is.

    Examples:
        >>> views = [torch.zeros(4, 4, 3).permute(2, 0, 1) for _ in range(2)]  # [3, 4, 4], channels-last
        >>> batch = stack(views)
        >>> tuple(batch.shape), batch.is_contiguous(memory_format=torch.channels_last)
        ((2, 3, 4, 4), True)
    """
    first = values[0]
    if first.ndim == 3 and not first.is_contiguous() and first.permute(1, 2, 0).is_contiguous():
        if all(v.stride() == first.stride() for v in values):
            return torch.stack([v.permute(1, 2, 0) for v in values]).permute(0, 3, 1, 2)
    return torch.stack(values)


def stack_items(items: list[dict[str, Any]]) -> Batch:
    """Items -> a batch: each key stacked (``stack``), ``"index"`` and ``"label"`` as LongTensor[B].

    Args:
        items: dicts with the same keys, their tensors of one shape per key.

    Returns:
        The batch, its keys in the first item's order.

    Examples:
        >>> batch = stack_items([{"index": 3, "image": torch.zeros(1, 2, 2)}, {"index": 1, "image": torch.ones(1, 2, 2)}])
        >>> batch["index"].tolist(), tuple(batch["image"].shape)
        ([3, 1], (2, 1, 2, 2))
    """
    batch = {}
    for key in items[0]:
        values = [item[key] for item in items]
        batch[key] = torch.tensor(values, dtype=torch.long) if key in LONG_KEYS else stack(values)
    return batch


class TensorItemsTask(Task):
    """A task whose items are dicts of tensors (``stack_items`` batches them): its loaders ship
    the items as its datasets yield them (the image tasks' training sets: the stored integers),
    and its ``prepare`` (by default the identity) makes the model inputs of them on the device."""

    def loader_collate(self, items: list[dict[str, Any]]) -> Batch:
        """Items -> the batch the engine's loaders ship: the items stacked, their dtypes kept."""
        return stack_items(items)

    def collate(self, items: list[dict[str, Any]]) -> Batch:
        """Items -> the model inputs: the shipped batch, prepared where it is (a loop that
        collates on the host and moves the batch itself gets the same values)."""
        return self.prepare(self.loader_collate(items))
