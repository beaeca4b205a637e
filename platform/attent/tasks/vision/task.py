"""Image classification with a ViT trained from scratch (Fashion-MNIST, digits, image folders)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attent.contract import DATASET_EVAL, DATASET_TRAIN, DATASET_VALIDATION, DatasetDescription
from attent.tasks.batches import TensorItemsTask, stack_items
from attent.tasks.task import (
    Batch,
    OptimizerSpec,
    Probe,
    TorchModel,
    data_seed,
    evaluation_chunks,
    seeded_init,
    sum_over_ranks,
)
from attent.tasks.vision import data, folder
from attent.tasks.vision.config import VisionTaskConfig
from attent.tasks.vit import build_vit


def load_splits(config: VisionTaskConfig, seed: int) -> data.ImageSplits:
    """The configured train / validation / test sets, limited as configured; ``seed`` (the
    run's, unless ``split_seed`` fixes it) draws the digits / folder split, the validation set
    and the limits."""
    seed = data_seed(config.split_seed, seed)
    if config.dataset == "fashion_mnist":
        splits = data.load_fashion_mnist(config.data_path, download=config.download, img_size=config.image_size)
    elif config.dataset == "digits":
        splits = data.load_digits(img_size=config.image_size, test_fraction=config.test_fraction, seed=seed)
    else:
        splits = folder.load_image_folder(
            config.data_path,
            img_size=config.image_size,
            in_chans=config.in_chans,
            test_fraction=config.test_fraction,
            seed=seed,
            cache_path=config.cache_path,
        )
    return splits.limited(config.train_limit, config.test_limit, seed, val_limit=config.val_limit)


class VisionTask(TensorItemsTask):
    """ViT classification; each image's cross-entropy is the training loss and the AtteNT score."""

    name = "vision"

    def __init__(self, config: VisionTaskConfig, seed: int):
        self.config, self.seed = config, seed
        self.splits = load_splits(config, seed)
        self._train_set = self.splits.train.with_integers()  # the engine's loaders ship uint8

    def train_dataset(self) -> data.ImageDataset:
        return self._train_set

    def prepare(self, batch: Batch) -> Batch:
        """uint8 images -> normalised float at img_size, on the batch's device (a float batch,
        prepared already, passes: a probe's, which has no data and so no statistics)."""
        if batch["image"].is_floating_point():
            return batch
        return data.model_inputs(batch, self.splits.train.stats, self.config.image_size)

    def stream_item(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        """A row of Ray Data's ``read_images(..., include_paths=True)`` (``image``: uint8 [H, W(, C)],
        ``path``: the file, whose folder names its class) as a stored training item: uint8
        [C, img_size, img_size] resized as the map-style items are, the label the class's index.

        Raises:
            ValueError: a file in a folder that names none of the task's classes.
        """
        folder = Path(row["path"]).parent.name
        if folder not in self._class_index:
            raise ValueError(
                f"{row['path']}: its folder {folder!r} names none of the classes {list(self.splits.classes)}: "
                "give stream.path a folder of the task's class subfolders"
            )
        pixels = torch.from_numpy(np.atleast_3d(np.array(row["image"], dtype=np.uint8)))
        image = data.resize_uint8(pixels.permute(2, 0, 1).contiguous(), self.config.image_size)
        return {"index": index, "image": image, "label": self._class_index[folder]}

    @functools.cached_property
    def _class_index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.splits.classes)}

    def group_labels(self) -> torch.Tensor:
        return self.splits.train.labels

    def describe_data(self) -> list[DatasetDescription]:
        """The train, validation (when held out) and test sets, after any limits, from where
        their images were read."""
        source = data.data_source(self.config.dataset, self.config.data_path)
        splits = (
            ("train", DATASET_TRAIN, self.splits.train),
            ("val", DATASET_VALIDATION, self.splits.val),
            ("test", DATASET_EVAL, self.splits.test),
        )
        return [
            DatasetDescription(f"{self.config.dataset}-{split}", source, context, len(images), data.fingerprint(images))
            for split, context, images in splits
            if images is not None
        ]

    def build_model(self) -> nn.Module:
        return seeded_init(self.seed, lambda: build_vit(self.config.vit_config(self.splits.num_classes)))

    @classmethod
    def probe(cls, config: VisionTaskConfig) -> Probe:
        """The ViT at the configured size on random normalised images; the class count of the
        named data sets, or of an image folder's classes where it is here (the head is a small
        share of the work: under 0.1 % of a ViT-B/16's)."""
        task = cls.__new__(cls)  # its losses without its data
        task.config, task.seed = config, 0
        classes, assumed = {"digits": 10, "fashion_mnist": 10}.get(config.dataset), ()
        if classes is None:
            from pathlib import Path

            from attent.tasks.vision import files

            root = Path(config.data_path).expanduser()
            classes_dir = root / "train" if files.has_train_test(root) else root
            classes = sum(d.is_dir() for d in classes_dir.iterdir()) if classes_dir.is_dir() else 0
            if classes < 2:
                classes, assumed = 1000, ("1,000 classes (the image folder is not here)",)
        size, channels = config.image_size, config.in_chans

        def batch(n: int, device: torch.device) -> Batch:
            return {
                "index": torch.arange(n, device=device),
                "image": torch.randn(n, channels, size, size, device=device),
                "label": torch.randint(0, classes, (n,), device=device),
            }

        return Probe(
            build_model=lambda: build_vit(config.vit_config(classes)),
            batch=batch,
            train_loss=task.per_sample_loss,
            score_loss=lambda model, b: task.score(model, b, 0),
            sample=f"{size} px, {channels} channel(s)",
            assumptions=assumed,
            workload="vit",
        )

    def optimizer_spec(self) -> OptimizerSpec:
        # AdamW as in DeiT / MAE fine-tuning, with the higher lr small ViTs from scratch tolerate.
        return OptimizerSpec(lr=1e-3, weight_decay=0.05, betas=(0.9, 0.999), schedule="cosine")

    def per_sample_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        device = next(model.parameters()).device
        logits = model(self._image(batch, device))
        return F.cross_entropy(
            logits.float(),
            batch["label"].to(device, non_blocking=True),
            reduction="none",
            label_smoothing=self.config.label_smoothing,
        )

    def kernel_output(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The logit of the true class: a model output, as the NTK's f is. Not the loss, whose
        gradient is the logits' weighted by the softmax's errors, so its kernel shrinks as the
        model fits and would read as drift."""
        device = next(model.parameters()).device
        logits = model(self._image(batch, device)).float()
        return logits.gather(1, batch["label"].to(device)[:, None]).squeeze(1)

    def _image(self, batch: Batch, device: torch.device) -> torch.Tensor:
        """The batch's model input on the model's device (uint8 moved first, then prepared)."""
        moved = {"image": batch["image"].to(device, non_blocking=True)}
        return self.prepare(moved)["image"]

    def model_to_log(self, model: nn.Module) -> TorchModel:
        """The classifier: images [B, C, H, W] as the data prepares them -> class logits."""
        test = self.splits.test
        return TorchModel(model, {"image": stack_items([test[0], test[1]])["image"]})

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, *, rank: int, world_size: int, progress: Callable[[str], None] | None = None
    ) -> dict[str, float]:
        """Test accuracy and mean cross-entropy, and the validation set's when one is held out;
        each rank scores every world_size-th image of each."""
        metrics = self.accuracy_and_loss(
            model, self.splits.test, "test", rank=rank, world_size=world_size, progress=progress
        )
        if self.splits.val is not None:
            metrics.update(
                self.accuracy_and_loss(
                    model, self.splits.val, "val", rank=rank, world_size=world_size, progress=progress
                )
            )
        return metrics

    def accuracy_and_loss(
        self,
        model: nn.Module,
        images: data.ImageDataset,
        split: str,
        *,
        rank: int,
        world_size: int,
        progress: Callable[[str], None] | None = None,
    ) -> dict[str, float]:
        """{<split>_accuracy, <split>_loss} of one evaluation set, summed over the ranks' shards."""
        device = next(model.parameters()).device
        chunks = evaluation_chunks(
            len(images), rank=rank, world_size=world_size, batch_size=self.config.eval_batch_size
        )
        totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
        for done, chunk in enumerate(chunks, 1):
            batch = stack_items([images[i] for i in chunk])
            labels = batch["label"].to(device)
            logits = model(batch["image"].to(device)).float()
            totals[0] += F.cross_entropy(logits, labels, reduction="sum")
            totals[1] += (logits.argmax(dim=-1) == labels).sum()
            totals[2] += len(chunk)
            if progress is not None:
                progress(f"evaluated {done}/{len(chunks)} {split} batches")
        sum_over_ranks(totals, world_size)
        loss_sum, correct, count = totals.tolist()
        return {f"{split}_accuracy": correct / count, f"{split}_loss": loss_sum / count}
