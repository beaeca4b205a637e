"""The image tasks' batches (attent.tasks.batches): one stacking of tensor items, one collate of
shipped integers and their preparation, shared by the ViT and masked-autoencoder tasks."""

from __future__ import annotations

import pytest
import torch
from attent.tasks.batches import TensorItemsTask, stack, stack_items
from attent.tasks.mae.downstream import DownstreamTask
from attent.tasks.mae.task import MaskedPretrainingTask
from attent.tasks.vision.task import VisionTask


def test_channels_last_views_stack_channels_last_with_the_values_of_torch_stack():
    rows = torch.arange(2 * 5 * 4 * 3, dtype=torch.uint8).reshape(2, 5, 4, 3)  # a decoded cache's [N, H, W, C]
    views = [row.permute(2, 0, 1) for row in rows]  # [C, H, W], not contiguous
    batch = stack(views)
    assert batch.is_contiguous(memory_format=torch.channels_last) and not batch.is_contiguous()
    assert torch.equal(batch, torch.stack(views))
    plain = [torch.zeros(3, 5, 4), views[1].float()]  # strides differ: torch.stack's layout
    assert stack(plain).is_contiguous() and torch.equal(stack(plain), torch.stack(plain))


def test_items_stack_by_key_with_integer_indices_and_labels():
    items = [{"index": 4, "image": torch.full((1, 2, 2), i, dtype=torch.uint8), "label": 7 - i} for i in range(3)]
    batch = stack_items(items)
    assert list(batch) == ["index", "image", "label"]
    assert batch["index"].dtype == batch["label"].dtype == torch.long and batch["label"].tolist() == [7, 6, 5]
    assert batch["image"].dtype == torch.uint8 and batch["image"][:, 0, 0, 0].tolist() == [0, 1, 2]


class HalvingTask(TensorItemsTask):
    """The least a tensor-items task defines: its preparation (the rest is never called here)."""

    train_dataset = build_model = per_sample_loss = evaluate = None

    def prepare(self, batch):
        return {**batch, "image": batch["image"].float() / 2}


def test_collate_is_the_shipped_batch_prepared():
    items = [{"index": i, "image": torch.full((1, 2, 2), 2 * i, dtype=torch.uint8)} for i in range(2)]
    task = HalvingTask()
    shipped, collated = task.loader_collate(items), task.collate(items)
    assert shipped["image"].dtype == torch.uint8
    assert collated["image"].dtype == torch.float32 and collated["image"][:, 0, 0, 0].tolist() == [0.0, 1.0]


@pytest.mark.parametrize("task", [VisionTask, MaskedPretrainingTask, DownstreamTask])
def test_the_image_tasks_collate_through_the_shared_base_alone(task):
    assert issubclass(task, TensorItemsTask)
    assert {"collate", "loader_collate"} & set(vars(task)) == set()
