"""Image classification with a ViT trained from scratch (Fashion-MNIST, digits, image folders)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import (BaseModel, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)
from torch import nn

from attent.data import vision as data
from attent.models.vit import PRESETS, ViTConfig, build_vit, vit_config
from attent.tasks.base import Batch, Task


class VisionModelConfig(BaseModel):
    """A ViT preset plus optional architecture overrides."""
    model_config = ConfigDict(extra="forbid")

    preset: str = "vit_tiny_cpu"  # a name in attent.models.vit.PRESETS
    patch_size: int | None = Field(None, gt=0)  # overrides the preset's patch size (pixels)
    embed_dim: int | None = Field(None, gt=0)  # overrides the preset's token width
    depth: int | None = Field(None, gt=0)  # overrides the preset's number of blocks
    num_heads: int | None = Field(None, gt=0)  # overrides the preset's attention heads
    mlp_ratio: float | None = Field(None, gt=0)  # overrides the preset's MLP width / embed_dim
    drop_path_rate: float = 0.0  # stochastic depth of the last block (0 for small data)

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str) -> str:
        if preset not in PRESETS:
            raise ValueError(f"unknown ViT preset {preset!r}; choose one of {sorted(PRESETS)}")
        return preset

    def overrides(self) -> dict[str, Any]:
        """The architecture fields set here, to apply on top of the preset."""
        return self.model_dump(exclude={"preset"}, exclude_none=True)


class VisionTaskConfig(BaseModel):
    """The ``task:`` section of an experiment config for image classification."""
    model_config = ConfigDict(extra="forbid")

    name: Literal["vision"] = "vision"  # selects this task
    dataset: Literal["fashion_mnist", "digits", "image_folder"] = "fashion_mnist"  # which images
    data_path: str | None = None  # fashion_mnist idx folder or image_folder root; None: defaults
    download: bool = False  # fashion_mnist: fetch it with torchvision when not found locally
    train_limit: int | None = None  # class-stratified random subset of the train set; None: all
    test_limit: int | None = None  # class-stratified random subset of the test set; None: all
    split_seed: int = 0  # seeds the limits and digits/folder splits: the same data for every run
    test_fraction: float = Field(0.2, gt=0, lt=1)  # test share for digits / unsplit image folders
    img_size: int | None = None  # resize to this square size; None: native (28 / 8), folder: set it
    color_mode: Literal["grayscale", "rgb"] | None = None  # image_folder channels; None: rgb
    model: VisionModelConfig = Field(default_factory=VisionModelConfig)  # the ViT
    eval_batch_size: int = Field(512, gt=0)  # test images per forward pass in evaluate
    label_smoothing: float = Field(0.0, ge=0, lt=1)  # of the training loss (the test loss has none)

    @field_validator("train_limit", "test_limit", "img_size")
    @classmethod
    def _positive(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value <= 0:
            raise ValueError(f"{info.field_name}={value} must be a positive number, "
                             f"or null for the default (all images / native size)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> VisionTaskConfig:
        if self.dataset == "image_folder":
            if self.data_path is None or self.img_size is None:
                raise ValueError("dataset: image_folder needs data_path (the folder of class "
                                 "subfolders) and img_size (the square size to resize to)")
        elif self.color_mode == "rgb":
            raise ValueError(f"{self.dataset} is grayscale; drop color_mode: rgb")
        if self.dataset == "digits" and self.data_path is not None:
            raise ValueError("digits ships with scikit-learn; drop data_path")
        if self.download and self.dataset != "fashion_mnist":
            raise ValueError("download only applies to dataset: fashion_mnist; drop it")
        self.vit_config(num_classes=1)  # a patch size or head count that does not fit fails here
        return self

    @property
    def image_size(self) -> int:
        return self.img_size or data.NATIVE_IMG_SIZE[self.dataset]

    @property
    def in_chans(self) -> int:
        return 3 if self.dataset == "image_folder" and self.color_mode != "grayscale" else 1

    def vit_config(self, num_classes: int) -> ViTConfig:
        return vit_config(self.model.preset, img_size=self.image_size, in_chans=self.in_chans,
                          num_classes=num_classes, **self.model.overrides())

    def check_data(self) -> None:
        """Raise FileNotFoundError saying how to get the data if it is missing (downloads
        Fashion-MNIST once here when ``download`` is set, so workers do not race to)."""
        if self.dataset == "fashion_mnist":
            data.ensure_fashion_mnist(self.data_path, self.download)
        elif self.dataset == "image_folder":
            data.check_image_folder(self.data_path)


def load_splits(config: VisionTaskConfig) -> data.ImageSplits:
    """The configured train / test sets, limited as configured."""
    if config.dataset == "fashion_mnist":
        splits = data.load_fashion_mnist(config.data_path, download=config.download,
                                         img_size=config.image_size)
    elif config.dataset == "digits":
        splits = data.load_digits(img_size=config.image_size, test_fraction=config.test_fraction,
                                  seed=config.split_seed)
    else:
        splits = data.load_image_folder(config.data_path, img_size=config.image_size,
                                        in_chans=config.in_chans,
                                        test_fraction=config.test_fraction, seed=config.split_seed)
    return splits.limited(config.train_limit, config.test_limit, config.split_seed)


class VisionTask(Task):
    """ViT classification; each image's cross-entropy is the training loss and the AtteNT score."""

    name = "vision"

    def __init__(self, config: VisionTaskConfig, seed: int):
        self.config, self.seed = config, seed
        self.splits = load_splits(config)

    def train_dataset(self) -> data.ImageDataset:
        return self.splits.train

    def collate(self, items: list[dict[str, Any]]) -> Batch:
        return data.collate(items)

    def group_labels(self) -> torch.Tensor:
        return self.splits.train.labels

    def build_model(self) -> nn.Module:
        # Seeded locally: the same seed gives the same initial weights whatever ran before.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return build_vit(self.config.vit_config(self.splits.num_classes))

    def optimizer_defaults(self) -> dict[str, Any]:
        # AdamW as in DeiT / MAE fine-tuning, with the higher lr small ViTs from scratch tolerate.
        return {"lr": 1e-3, "weight_decay": 0.05, "betas": (0.9, 0.999)}

    def per_sample_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        device = next(model.parameters()).device
        logits = model(batch["image"].to(device, non_blocking=True))
        return F.cross_entropy(logits.float(), batch["label"].to(device, non_blocking=True),
                               reduction="none", label_smoothing=self.config.label_smoothing)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, *, rank: int, world_size: int,
                 progress: Callable[[str], None] | None = None) -> dict[str, float]:
        """Test accuracy and mean cross-entropy; each rank scores every world_size-th image."""
        distributed = world_size > 1
        if distributed and not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"evaluate(world_size={world_size}) needs an initialised "
                               f"torch.distributed process group to sum the shards")
        test, batch_size = self.splits.test, self.config.eval_batch_size
        device = next(model.parameters()).device
        shard = range(rank, len(test), world_size)
        chunks = [shard[i:i + batch_size] for i in range(0, len(shard), batch_size)]
        totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
        for done, chunk in enumerate(chunks, 1):
            batch = data.collate([test[i] for i in chunk])
            labels = batch["label"].to(device)
            logits = model(batch["image"].to(device)).float()
            totals[0] += F.cross_entropy(logits, labels, reduction="sum")
            totals[1] += (logits.argmax(dim=-1) == labels).sum()
            totals[2] += len(chunk)
            if progress is not None:
                progress(f"evaluated {done}/{len(chunks)} test batches")
        if distributed:
            dist.all_reduce(totals)
        loss_sum, correct, count = totals.tolist()
        return {"test_accuracy": correct / count, "test_loss": loss_sum / count}
