"""Config sections of the masked-autoencoder tasks (pydantic and the standard library only:
configs validate without importing torch or timm).

    mae             RGB masked autoencoder: a fixed share of patches hidden
    multimae        RGB + depth + semseg: a visible-token budget split across modalities by a
                    Dirichlet draw per sample (MultiMAE)
    mae_downstream  fine-tune or linear-probe a pretrained encoder on RGB: classification,
                    semantic segmentation or depth
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from attent.tasks import cache as decoded
from attent.tasks.config import STAND_IN, TaskConfig, at_most, is_relative_path
from attent.tasks.mae import files
from attent.tasks.vit import PRESETS

Modality = Literal["rgb", "depth", "semseg"]
Target = Literal["classification", "semseg", "depth"]
# a downstream job's training augmentation (attent.tasks.mae.augment): the pretraining's crop and
# flip, large scale jittering (the paper's for NYUv2), or the crop then RandAugment (ImageNet-S50)
Augmentation = Literal["crop", "lsj", "rand_augment"]
MLFLOW_ARTIFACT_SCHEMES = ("runs:/", "models:/", "mlflow-artifacts:/")
NORM_RGB = "norm_rgb"  # the extra decoder of normalised RGB patches (MultiMAE's name)


@dataclass(frozen=True)
class MaskedAutoencoderSpec:
    """Shape of the model (built by ``model.MaskedAutoencoder``); saved beside exported weights."""

    modalities: tuple[str, ...]
    img_size: int
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    decoder_dim: int
    decoder_depth: int
    decoder_heads: int
    semseg_classes: int = 0
    class_embed_dim: int = 32
    drop_path_rate: float = 0.0
    semseg_stride: int = 1  # semseg enters and leaves at img_size / semseg_stride px (MultiMAE: 4)
    decoder: str = "joint"  # "joint": self-attention over [context; queries]; "cross_attention": MultiMAE's
    global_tokens: int = 0  # learned tokens beside the patches in the encoder (MultiMAE: 1)
    extra_norm_pix: bool = False  # a second RGB decoder, on normalised patches (MultiMAE's norm_rgb)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The decoders' names: one per modality, then ``norm_rgb`` with ``extra_norm_pix``."""
        return self.modalities + (NORM_RGB,) if self.extra_norm_pix else self.modalities

    @staticmethod
    def source(output: str) -> str:
        """The modality whose tokens and hidden patches a decoder reads."""
        return "rgb" if output == NORM_RGB else output

    @property
    def grid(self) -> int:
        return self.img_size // self.patch_size

    def pixel_patch(self, modality: str) -> int:
        """Pixels a side of one patch of ``modality`` at the size it enters and leaves at."""
        return self.patch_size // self.semseg_stride if modality == "semseg" else self.patch_size

    @property
    def patches(self) -> int:
        return self.grid**2

    def channels(self, modality: str) -> int:
        """Values predicted per pixel: 3 for RGB, 1 for depth, one logit per class for semseg."""
        return {"rgb": 3, NORM_RGB: 3, "depth": 1, "semseg": self.semseg_classes}[modality]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MaskedModelConfig(BaseModel):
    """Encoder (a ViT preset of the vision task, with overrides) and the light decoders."""

    model_config = ConfigDict(extra="forbid")

    preset: str = "vit_tiny_cpu"  # encoder shape, a name in attent.tasks.vit.PRESETS
    patch_size: int | None = Field(None, gt=0)  # overrides the preset's patch size (pixels)
    embed_dim: int | None = Field(None, gt=0)  # overrides the preset's token width
    depth: int | None = Field(None, gt=0)  # overrides the preset's number of encoder blocks
    num_heads: int | None = Field(None, gt=0)  # overrides the preset's attention heads
    mlp_ratio: float | None = Field(None, gt=0)  # overrides the preset's MLP width / embed_dim
    decoder_dim: int = Field(64, gt=0)  # width of each modality's decoder (MultiMAE: 256)
    decoder_depth: int = Field(1, ge=1)  # blocks per decoder (MultiMAE: 2)
    decoder_heads: int = Field(4, gt=0)  # attention heads per decoder block (MultiMAE: 8)
    class_embed_dim: int = Field(32, gt=0)  # semseg input: embedding per class id (MultiMAE: 64)
    drop_path_rate: float = Field(0.0, ge=0, lt=1)  # stochastic depth of the last encoder block
    # semseg in and out at img_size / semseg_stride px, a patch of patch_size / semseg_stride pixels a side
    # (MultiMAE: 4, 56 x 56 maps at 224 px); 1: at the image's size
    semseg_stride: int = Field(1, ge=1)
    # each decoder: joint, self-attention over [the encoded context; its queries]; cross_attention,
    # MultiMAE's: its queries attend to the context once (then an MLP), then decoder_depth self-attention blocks
    decoder: Literal["joint", "cross_attention"] = "joint"
    # learned tokens appended to the encoder's patch tokens, in the decoders' context too, never a
    # patch's prediction (MultiMAE: 1, its default); downstream they are read and dropped
    global_tokens: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _fits(self) -> MaskedModelConfig:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown ViT preset {self.preset!r}; choose one of {sorted(PRESETS)}")
        shape = self.encoder_shape()
        if shape["embed_dim"] % shape["num_heads"] or self.decoder_dim % self.decoder_heads:
            raise ValueError("num_heads must divide embed_dim and decoder_heads decoder_dim")
        if shape["patch_size"] % self.semseg_stride:
            raise ValueError(f"semseg_stride={self.semseg_stride} must divide patch_size={shape['patch_size']}")
        return self

    def encoder_shape(self) -> dict[str, Any]:
        overrides = self.model_dump(
            include={"patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio"}, exclude_none=True
        )
        return {**PRESETS[self.preset], **overrides}

    def spec(
        self, modalities: tuple[str, ...], img_size: int, semseg_classes: int = 0, *, extra_norm_pix: bool = False
    ) -> MaskedAutoencoderSpec:
        if img_size % self.encoder_shape()["patch_size"]:
            raise ValueError(f"patch_size={self.encoder_shape()['patch_size']} does not divide img_size={img_size}")
        return MaskedAutoencoderSpec(
            modalities=tuple(modalities),
            img_size=img_size,
            **self.encoder_shape(),
            decoder_dim=self.decoder_dim,
            decoder_depth=self.decoder_depth,
            decoder_heads=self.decoder_heads,
            semseg_classes=semseg_classes,
            class_embed_dim=self.class_embed_dim,
            drop_path_rate=self.drop_path_rate,
            semseg_stride=self.semseg_stride,
            decoder=self.decoder,
            global_tokens=self.global_tokens,
            extra_norm_pix=extra_norm_pix,
        )


class MultiModalDataConfig(TaskConfig):
    """Where the images are and how much of them to use (the MultiMAE folder layout)."""

    path_fields: ClassVar[tuple[str, ...]] = ("data_path",)

    data_path: str  # <root>/<split>/{rgb,depth,semseg}/<class>/<name>.png (`attent data scenes`)
    img_size: int = Field(32, gt=0)  # square size the images are resized to
    num_semseg_classes: int | None = Field(None, gt=0)  # None: from <root>/dataset.json
    val_limit: int | None = Field(None, gt=0)  # class-stratified validation samples held out of train; None: none
    train_limit: int | None = Field(None, gt=0)  # class-stratified subset of the rest of the train split; None: all
    test_limit: int | None = Field(None, gt=0)  # class-stratified subset of the test split; None: all
    split_seed: int | None = None  # seeds validation and limits; None: the run's seed, an int: fixed for all runs
    cache: bool | None = None  # without a decoded cache: decode every image into memory first; None: when small
    # the decoded cache (`attent data cache`) to read: auto, <data_path>/.attent-cache/<img_size>px
    # when there (else the files); required, refused without it; a folder; null, the files
    cache_path: str | None = decoded.AUTO
    eval_batch_size: int = Field(256, gt=0)  # test / validation images per forward pass in evaluate
    model: MaskedModelConfig = Field(default_factory=MaskedModelConfig)  # encoder (+ decoders)

    def modalities_needed(self) -> tuple[str, ...]:
        raise NotImplementedError

    def rehearsal_fields(self) -> dict[str, Any]:
        """The same folders, modalities and image size, on a few images, with an encoder and
        decoders of the preset's family at the stand-in width and depth."""
        fields: dict[str, Any] = {
            "train_limit": at_most(self.train_limit, STAND_IN.train_samples),
            "test_limit": at_most(self.test_limit, STAND_IN.test_samples),
            "eval_batch_size": min(self.eval_batch_size, STAND_IN.test_samples),
            "model": {
                "embed_dim": STAND_IN.width,
                "depth": STAND_IN.depth,
                "num_heads": STAND_IN.heads,
                "decoder_dim": STAND_IN.width // 2,
                "decoder_heads": STAND_IN.heads,
                "class_embed_dim": min(self.model.class_embed_dim, STAND_IN.channels),
            },
        }
        if self.val_limit:
            fields["val_limit"] = at_most(self.val_limit, STAND_IN.test_samples)
        return fields

    def data_files(self) -> list[tuple[Path, str]]:
        root = Path(self.data_path).expanduser()
        return [
            (root / split / modality / relative, f"{modality} image")
            for split, samples in files.scan_root(root, modalities=self.modalities_needed()).items()
            for sample in samples
            for modality, relative in sample.items()
        ]

    def with_absolute_paths(self, base: Path):
        config = super().with_absolute_paths(base)
        return config.model_copy(update={"cache_path": decoded.absolute(config.cache_path, base)})

    def check_data(self) -> None:
        files.check_multimodal_root(self.data_path, modalities=self.modalities_needed())
        decoded.check_config(self.cache_path, self.data_path, self.img_size)
        names = (files.read_metadata(self.data_path) or {}).get("semseg_classes")
        if self.num_semseg_classes is None and "semseg" in self.modalities_needed() and not names:
            raise ValueError(
                f"{self.data_path} has no dataset.json listing semseg_classes: set task.num_semseg_classes"
            )
        if names and self.num_semseg_classes not in (None, len(names)):  # the loader refuses it: say so before Ray
            raise ValueError(
                f"task.num_semseg_classes={self.num_semseg_classes} but {self.data_path}/dataset.json names "
                f"{len(names)} semseg classes: set it to {len(names)} (a downstream job: in its own task section)"
            )


class MaskedPretrainingConfig(MultiModalDataConfig):
    """What mae and multimae share: masking, targets, and the downstream jobs they hand over to."""

    norm_pix_loss: bool = True  # RGB target: each patch's pixels standardised (MAE's better target)
    # MultiMAE's (its default): beside the RGB decoder's plain pixels (norm_pix_loss false), a second
    # decoder predicts the normalised patches; both losses count as RGB's (one loss component per modality)
    extra_norm_pix_loss: bool = False
    # k-NN probe at each evaluation: the test scenes classified by their k nearest training scenes
    # in the RGB encoder's mean-pooled features (cosine, similarity-weighted votes); 0: off
    knn_neighbours: int = Field(0, ge=0)
    knn_train_limit: int = Field(2000, gt=0)  # training scenes the probe compares with (the first ones)

    @model_validator(mode="after")
    def _one_normalised_target(self) -> MaskedPretrainingConfig:
        if self.extra_norm_pix_loss and (self.norm_pix_loss or "rgb" not in self.modality_names()):
            raise ValueError(
                "extra_norm_pix_loss adds a decoder of normalised RGB patches beside the RGB decoder's plain "
                "pixels: set norm_pix_loss: false (and keep rgb among the modalities)"
            )
        return self

    def modality_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def modalities_needed(self) -> tuple[str, ...]:
        return self.modality_names()

    def visible_budget(self, patches: int) -> int:
        """Tokens the encoder sees per sample, over all modalities."""
        raise NotImplementedError

    def rehearsal_fields(self) -> dict[str, Any]:
        """The data and model's stand-in (``MultiModalDataConfig``), the k-NN probe on a few scenes."""
        return {**super().rehearsal_fields(), "knn_train_limit": min(self.knn_train_limit, STAND_IN.train_samples)}

    def downstream_task(self, job: dict[str, Any], *, pretrained: str | None) -> dict[str, Any]:
        """The ``task:`` section of a downstream job: this data and encoder, the job's fields on top."""
        inherited = self.model_dump(
            include={"data_path", "img_size", "num_semseg_classes", "split_seed", "cache", "eval_batch_size", "model"}
        )
        task = {**inherited, "name": "mae_downstream", "pretrained": pretrained, **job}
        if "cache_path" not in job:  # the pretraining's decoded cache where the job reads its data at its size
            same = all(task[key] == inherited[key] for key in ("data_path", "img_size"))
            task["cache_path"] = self.cache_path if same else decoded.AUTO
        if isinstance(job.get("model"), dict):  # the job's model fields (e.g. drop_path_rate) on the encoder's
            task["model"] = {**inherited["model"], **job["model"]}
        return task


class MAETaskConfig(MaskedPretrainingConfig):
    """The ``task:`` section of RGB masked-autoencoder pretraining (MAE)."""

    name: Literal["mae"] = "mae"  # selects this task
    mask_ratio: float = Field(0.75, gt=0, lt=1)  # share of patches hidden (MAE: 0.75)

    def modality_names(self) -> tuple[str, ...]:
        return ("rgb",)

    def visible_budget(self, patches: int) -> int:
        return max(1, round((1 - self.mask_ratio) * patches))


class MultiMAETaskConfig(MaskedPretrainingConfig):
    """The ``task:`` section of Multi-Modal MAE pretraining."""

    name: Literal["multimae"] = "multimae"  # selects this task
    modalities: tuple[Modality, ...] = ("rgb", "depth", "semseg")  # inputs and reconstruction targets
    visible_tokens: int | None = Field(None, gt=0)  # budget over all modalities; None: 1/6 of all
    # tokens (MultiMAE: 98 of 3 x 196)
    alpha: float | None = Field(1.0, gt=0)  # Dirichlet concentration of the split; null: even split

    @model_validator(mode="after")
    def _distinct(self) -> MultiMAETaskConfig:
        if len(set(self.modalities)) != len(self.modalities) or not self.modalities:
            raise ValueError(f"modalities must be distinct and not empty, got {list(self.modalities)}")
        return self

    def modality_names(self) -> tuple[str, ...]:
        return tuple(self.modalities)

    def visible_budget(self, patches: int) -> int:
        total = patches * len(self.modalities)
        budget = self.visible_tokens or max(1, round(total / 6))
        if budget > total:
            raise ValueError(
                f"visible_tokens={budget} exceeds the {total} tokens of "
                f"{len(self.modalities)} modalities x {patches} patches"
            )
        return budget


class DownstreamTaskConfig(MultiModalDataConfig):
    """The ``task:`` section of a downstream job on a pretrained encoder (from RGB, as MultiMAE's
    single-modality fine-tuning)."""

    path_fields: ClassVar[tuple[str, ...]] = ("data_path", "pretrained")

    name: Literal["mae_downstream"] = "mae_downstream"  # selects this task
    target: Target = "classification"  # scene class (top-1), semseg (mIoU) or depth (delta1)
    mode: Literal["finetune", "linear_probe"] = "finetune"  # train everything, or the head only
    pretrained: str | None = None  # a pretraining run's logged model (models:/<model_id>), runs:/<id>/pretrained,
    # a weights file or a Ray checkpoint directory; None: random initialisation (the from-scratch reference)
    layer_decay: float = Field(0.75, gt=0, le=1)  # finetune: lr x decay^(depth - layer) per block
    head_hidden: int | None = Field(None, gt=0)  # dense heads: a hidden 3x3 conv of this width; None: linear
    # training augmentation: crop (the pretraining's random resized crop + flip), lsj (large scale
    # jittering, scale 0.1-2: the paper's for NYUv2 semseg and depth) or rand_augment (the crop, then
    # RandAugment 2 ops at magnitude 9 on RGB: the paper's Rand(9, 0.5) for ImageNet-S50)
    augmentation: Augmentation = "crop"

    def modalities_needed(self) -> tuple[str, ...]:
        return ("rgb",) if self.target == "classification" else ("rgb", self.target)

    def rehearsal_fields(self) -> dict[str, Any]:
        """The data and encoder's stand-in, with a dense head's hidden conv at the stand-in width
        (at 256 channels it costs more than the stand-in encoder at full resolution)."""
        fields = super().rehearsal_fields()
        if self.head_hidden:
            fields["head_hidden"] = min(self.head_hidden, STAND_IN.channels)
        return fields

    def with_absolute_paths(self, base: Path) -> DownstreamTaskConfig:
        if self.pretrained and self.pretrained.startswith(MLFLOW_ARTIFACT_SCHEMES):
            return self.model_copy(
                update={
                    "data_path": str((base / self.data_path).resolve())
                    if is_relative_path(self.data_path)
                    else self.data_path,
                    "cache_path": decoded.absolute(self.cache_path, base),
                }
            )
        return super().with_absolute_paths(base)

    def check_data(self) -> None:
        super().check_data()
        local = self.pretrained and not self.pretrained.startswith(MLFLOW_ARTIFACT_SCHEMES)
        if local and not Path(self.pretrained).expanduser().exists():
            raise FileNotFoundError(
                f"pretrained weights {self.pretrained!r} do not exist: give a pretraining "
                "run's model as models:/<model_id> or runs:/<run_id>/pretrained, or a weights file"
            )
