"""The vision task's config section (pydantic and the standard library only: configs validate
without importing torch or timm)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from attent.tasks import cache
from attent.tasks.config import STAND_IN, TaskConfig, at_most
from attent.tasks.vision import files
from attent.tasks.vision.files import NATIVE_IMG_SIZE
from attent.tasks.vit import PRESETS, ViTConfig, vit_config


class VisionModelConfig(BaseModel):
    """A ViT preset plus optional architecture overrides."""

    model_config = ConfigDict(extra="forbid")

    preset: str = "vit_tiny_cpu"  # a name in attent.tasks.vit.PRESETS
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


class VisionTaskConfig(TaskConfig):
    """The ``task:`` section of an experiment config for image classification."""

    path_fields: ClassVar[tuple[str, ...]] = ("data_path",)
    stream_formats: ClassVar[tuple[str, ...]] = ("image_folder",)

    name: Literal["vision"] = "vision"  # selects this task
    dataset: Literal["fashion_mnist", "digits", "image_folder"] = "fashion_mnist"  # which images
    data_path: str | None = None  # fashion_mnist idx folder or image_folder root; None: defaults
    download: bool = False  # fashion_mnist: fetch it with torchvision when not found locally
    val_limit: int | None = None  # class-stratified validation images held out of the train set; None: no validation
    train_limit: int | None = None  # class-stratified random subset of the rest of the train set; None: all
    test_limit: int | None = None  # class-stratified random subset of the test set; None: all
    split_seed: int | None = None  # seeds digits/folder split, validation, limits; None: the run's seed, int: fixed
    test_fraction: float = Field(0.2, gt=0, lt=1)  # test share for digits / unsplit image folders
    img_size: int | None = None  # resize to this square size; None: native (28 / 8), folder: set it
    color_mode: Literal["grayscale", "rgb"] | None = None  # image_folder channels; None: rgb
    model: VisionModelConfig = Field(default_factory=VisionModelConfig)  # the ViT
    eval_batch_size: int = Field(512, gt=0)  # test / validation images per forward pass in evaluate
    label_smoothing: float = Field(0.0, ge=0, lt=1)  # of the training loss (the test loss has none)
    # image_folder: the decoded cache (`attent data cache`) to read: auto, <data_path>/.attent-cache/
    # <img_size>px when there (else the files); required, refused without it; a folder; null, the files
    cache_path: str | None = cache.AUTO

    def rehearsal_fields(self) -> dict[str, Any]:
        """The same images and ViT preset, on a few of them and at the stand-in width and depth."""
        fields: dict[str, Any] = {
            "train_limit": at_most(self.train_limit, STAND_IN.train_samples),
            "test_limit": at_most(self.test_limit, STAND_IN.test_samples),
            "eval_batch_size": min(self.eval_batch_size, STAND_IN.test_samples),
            "model": {"embed_dim": STAND_IN.width, "depth": STAND_IN.depth, "num_heads": STAND_IN.heads},
        }
        if self.val_limit:
            fields["val_limit"] = at_most(self.val_limit, STAND_IN.test_samples)
        return fields

    @field_validator("val_limit", "train_limit", "test_limit", "img_size")
    @classmethod
    def _positive(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value <= 0:
            raise ValueError(
                f"{info.field_name}={value} must be a positive number, "
                f"or null for the default (no validation / all images / native size)"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> VisionTaskConfig:
        if self.dataset == "image_folder":
            if self.data_path is None or self.img_size is None:
                raise ValueError(
                    "dataset: image_folder needs data_path (the folder of class "
                    "subfolders) and img_size (the square size to resize to)"
                )
        elif self.color_mode == "rgb":
            raise ValueError(f"{self.dataset} is grayscale; drop color_mode: rgb")
        if self.dataset == "digits" and self.data_path is not None:
            raise ValueError("digits ships with scikit-learn; drop data_path")
        if self.download and self.dataset != "fashion_mnist":
            raise ValueError("download only applies to dataset: fashion_mnist; drop it")
        if self.dataset != "image_folder" and self.cache_path not in (cache.AUTO, None):
            raise ValueError(f"{self.dataset} is read from arrays in memory, not files: drop cache_path")
        self.vit_config(num_classes=1)  # a patch size or head count that does not fit fails here
        return self

    @property
    def image_size(self) -> int:
        return self.img_size or NATIVE_IMG_SIZE[self.dataset]

    @property
    def in_chans(self) -> int:
        return 3 if self.dataset == "image_folder" and self.color_mode != "grayscale" else 1

    def stream_read_options(self) -> dict[str, Any]:
        """Ray Data's ``read_images`` in the task's channels (native size: ``stream_item`` resizes)."""
        return {"mode": "L" if self.in_chans == 1 else "RGB"}

    def vit_config(self, num_classes: int) -> ViTConfig:
        return vit_config(
            self.model.preset,
            img_size=self.image_size,
            in_chans=self.in_chans,
            num_classes=num_classes,
            **self.model.overrides(),
        )

    def data_files(self) -> list[tuple[Path, str]]:
        if self.dataset != "image_folder":
            return []  # digits and Fashion-MNIST are packed arrays, checked when loaded
        root = files.check_image_folder(self.data_path)
        folders = [root / "train", root / "test"] if files.has_train_test(root) else [root]
        return [(Path(path), "image") for folder in folders for path in files.scan_classes(folder)[1]]

    def with_absolute_paths(self, base: Path) -> VisionTaskConfig:
        config = super().with_absolute_paths(base)
        return config.model_copy(update={"cache_path": cache.absolute(config.cache_path, base)})

    def check_data(self) -> None:
        """Raise FileNotFoundError saying how to get the data if it is missing (downloads
        Fashion-MNIST once here when ``download`` is set, so workers do not race to), or the
        decoded cache ``cache_path`` requires."""
        if self.dataset == "fashion_mnist":
            files.ensure_fashion_mnist(self.data_path, self.download)
        elif self.dataset == "image_folder":
            files.check_image_folder(self.data_path)
            cache.check_config(self.cache_path, self.data_path, self.image_size)
