"""Downstream jobs on a pretrained encoder: classification (top-1), semantic segmentation
(mIoU) and depth (delta1, abs-rel), fine-tuned with layer-wise lr decay or linear-probed.

The encoder comes from a pretraining run's logged model (``models:/<model_id>``,
``runs:/<id>/model``), its ``pretrained`` artifact (``runs:/<id>/pretrained``), a weights file it
wrote, or a Ray checkpoint directory of the run; only its RGB input is kept. Training images get
the job's ``augmentation`` (``attent.tasks.mae.augment``: the pretraining's crop, large scale
jittering, or the crop then RandAugment); the job's ``img_size`` may differ from the pretraining's
(positions are fixed sin-cos, built for the job's grid).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attent import contract
from attent.tasks import weights
from attent.tasks.batches import TensorItemsTask, stack_items
from attent.tasks.mae import augment, data
from attent.tasks.mae.config import DownstreamTaskConfig
from attent.tasks.mae.files import IGNORE_INDEX
from attent.tasks.mae.metrics import build_metrics
from attent.tasks.mae.model import DownstreamModel, rgb_encoder_state
from attent.tasks.mae.task import load_splits, semseg_class_count
from attent.tasks.task import (
    Batch,
    OptimizerSpec,
    ParamGroup,
    Probe,
    TorchModel,
    decay_groups,
    evaluation_chunks,
    seeded_init,
)


def resolve_pretrained(path: Path, source: str) -> Path:
    """The file holding the pretrained weights in ``path`` (``source``, downloaded)."""
    for candidate in (path, path / contract.PRETRAINED_FILE, path / contract.CHECKPOINT_STATE_FILE):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no pretrained weights at {source!r}: expected a pretraining run's logged model "
        f"(models:/<model_id>), {contract.PRETRAINED_FILE} (its artifact) or "
        f"{contract.CHECKPOINT_STATE_FILE} (its Ray checkpoint)"
    )


def load_encoder_state(source: str) -> tuple[dict[str, torch.Tensor], tuple[str, ...] | None]:
    """(encoder state dict, its modalities or None when unknown) from any accepted source."""
    path = weights.local_copy(source)
    logged = weights.logged_model_weights(path) if path.is_dir() else None
    if logged is not None:  # a logged model: a pretraining run's LoggedEncoder, or a downstream model
        modalities = logged.metadata.get("modalities")
        return encoder_part(logged.state), tuple(modalities) if modalities else None
    saved = torch.load(resolve_pretrained(path, source), map_location="cpu", weights_only=False)
    if "encoder" in saved:  # an export: {"spec", "encoder"}
        return saved["encoder"], tuple(saved["spec"]["modalities"])
    return encoder_part(saved["model"]), None  # a Ray checkpoint of the pretraining run


def encoder_part(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``encoder.`` tensors of a model's state dict, named as the encoder names them."""
    prefix = "encoder."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


class DownstreamTask(TensorItemsTask):
    name = "mae_downstream"

    def __init__(self, config: DownstreamTaskConfig, seed: int):
        self.config, self.seed, self.target = config, seed, config.target
        augmentation = config.augmentation
        self.splits = load_splits(
            config, config.modalities_needed(), augment=augment.data_side(augmentation), seed=seed
        )
        # what training reads: the split, with the job's augmentation on top where it adds one
        self.train_set = (
            self.splits.train if augmentation == "crop" else augment.Augmented(self.splits.train, augmentation)
        )
        self.spec = config.model.spec(("rgb",), config.img_size)
        self.outputs = {
            "classification": len(self.splits.scene_classes),
            "semseg": len(self.splits.semseg_classes),
            "depth": 1,
        }[self.target]

    def train_dataset(self) -> data.MultiModalDataset | augment.Augmented:
        return self.train_set

    def group_labels(self) -> torch.Tensor:
        return self.splits.train.labels

    def describe_data(self) -> list[contract.DatasetDescription]:
        return data.describe_splits(self.splits, self.config.data_path)

    def build_model(self) -> nn.Module:
        typical_depth = self._typical_depth()
        model = seeded_init(
            self.seed,
            lambda: DownstreamModel(self.spec, self.target, self.outputs, self.config.head_hidden, typical_depth),
        )
        if self.config.pretrained:
            self._load_pretrained(model)
        if self.config.mode == "linear_probe":
            model.encoder.requires_grad_(False)
        return model

    @classmethod
    def probe(cls, config: DownstreamTaskConfig) -> Probe:
        """The fine-tuned model (encoder and head, as the job trains them) and its loss on random
        RGB images and targets; class counts from the config or the data's dataset.json, else
        ImageNet-S50's 50 scene classes and MultiMAE's 133 semseg classes."""
        from attent.tasks.mae.files import read_metadata

        task = cls.__new__(cls)  # its loss without its data
        task.config, task.seed, task.target = config, 0, config.target
        task.spec = config.model.spec(("rgb",), config.img_size)
        assumed: tuple[str, ...] = ()
        if config.target == "classification":
            scenes = ((read_metadata(config.data_path) if config.data_path else None) or {}).get("scene_classes")
            outputs = len(scenes) if scenes else 50
            assumed = () if scenes else ("50 scene classes (ImageNet-S50's)",)
        elif config.target == "semseg":
            outputs, assumed = semseg_class_count(config)
        else:
            outputs = 1
        size = config.img_size

        def batch(n: int, device: torch.device) -> Batch:
            targets = {
                "classification": ("label", lambda: torch.randint(0, outputs, (n,), device=device)),
                "semseg": ("semseg", lambda: torch.randint(0, outputs, (n, size, size), device=device)),
                "depth": ("depth", lambda: torch.rand(n, 1, size, size, device=device) * 10),
            }
            key, draw = targets[config.target]
            return {"index": torch.arange(n), "rgb": torch.randn(n, 3, size, size, device=device), key: draw()}

        def build() -> nn.Module:
            model = DownstreamModel(task.spec, config.target, outputs, config.head_hidden)
            if config.mode == "linear_probe":
                model.encoder.requires_grad_(False)
            return model

        return Probe(
            build_model=build,
            batch=batch,
            train_loss=task.per_sample_loss,
            score_loss=lambda model, b: task.score(model, b, 0),
            sample=f"{size} px RGB, {config.target}",
            assumptions=assumed,
            workload="vit",  # a ViT fine-tuned with its head
        )

    def _typical_depth(self, samples: int = 256) -> float:
        """Median valid depth (metres) of up to ``samples`` training images; 1 without depth."""
        if self.target != "depth":
            return 1.0
        train = self.splits.train
        step = max(1, len(train) // samples)
        depths = torch.cat([train[i]["depth"].flatten() for i in range(0, len(train), step)])
        valid = depths[depths > 0]
        return float(valid.median()) if valid.numel() else 1.0

    def _load_pretrained(self, model: DownstreamModel) -> None:
        state, modalities = load_encoder_state(self.config.pretrained)
        if modalities is None:  # a checkpoint: its modalities are the embeddings it holds
            modalities = tuple(
                sorted(
                    {k.split(".")[1] for k in state if k.startswith("embeds.")}, key=("rgb", "depth", "semseg").index
                )
            )
        missing, unexpected = model.encoder.load_state_dict(rgb_encoder_state(state, modalities), strict=False)
        if missing or unexpected:
            raise RuntimeError(
                f"pretrained encoder does not fit task.model ({self.config.model.preset}): "
                f"missing {missing[:4]}, unexpected {unexpected[:4]}"
            )

    def model_to_log(self, model: nn.Module) -> TorchModel:
        """The fine-tuned model: RGB [B, 3, H, W] -> class logits, semseg logits or depth (metres)."""
        return TorchModel(model, {"rgb": stack_items([self.splits.test[0], self.splits.test[1]])["rgb"]})

    def optimizer_spec(self) -> OptimizerSpec:
        # MultiMAE fine-tuning: AdamW (0.9, 0.999), wd 0.05, cosine, warm-up, layer decay 0.75.
        return OptimizerSpec(lr=5e-4, weight_decay=0.05, betas=(0.9, 0.999), schedule="cosine", warmup_ratio=0.1)

    def parameter_groups(self, model: nn.Module, weight_decay: float) -> list[ParamGroup]:
        """Layer-wise lr decay (BEiT / MAE fine-tuning): block i of L gets decay^(L - i), the
        patch embedding decay^(L + 1), the head 1."""
        depth, decay = self.spec.depth, self.config.layer_decay
        layers: dict[int, list[tuple[str, nn.Parameter]]] = {}
        for name, param in model.named_parameters():
            if param.requires_grad:
                layers.setdefault(layer_of(name, depth), []).append((name, param))
        groups = []
        for layer, named in sorted(layers.items()):
            for group in decay_groups(model, weight_decay, named):
                groups.append({**group, "lr_scale": decay ** (depth + 1 - layer)})
        return groups

    def per_sample_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        prediction = model(batch["rgb"]).float()
        if self.target == "classification":
            return F.cross_entropy(prediction, batch["label"], reduction="none")
        if self.target == "semseg":
            ce = F.cross_entropy(prediction, batch["semseg"], reduction="none", ignore_index=IGNORE_INDEX)
            valid = (batch["semseg"] != IGNORE_INDEX).float()
            return ce.sum(dim=(1, 2)) / valid.sum(dim=(1, 2)).clamp_min(1)
        valid = (batch["depth"] > 0).float()
        error = (prediction - batch["depth"]).abs() * valid
        return error.sum(dim=(1, 2, 3)) / valid.sum(dim=(1, 2, 3)).clamp_min(1)

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, *, rank: int, world_size: int, progress: Callable[[str], None] | None = None
    ) -> dict[str, float]:
        """The job's metric on the test split, and as val_<metric> on the validation set when
        one is held out (torchmetrics, summed over ranks)."""
        metrics = self.job_metrics(model, self.splits.test, rank=rank, world_size=world_size)
        if self.splits.val is not None:
            val = self.job_metrics(model, self.splits.val, rank=rank, world_size=world_size)
            metrics.update({f"val_{name}": value for name, value in val.items()})
        return metrics

    def job_metrics(
        self, model: nn.Module, dataset: data.MultiModalDataset, *, rank: int, world_size: int
    ) -> dict[str, float]:
        """The job's metric on one evaluation set, this rank scoring every world_size-th item."""
        device = next(model.parameters()).device
        metrics = build_metrics(self.target, num_classes=self.outputs).to(device)
        chunks = evaluation_chunks(
            len(dataset), rank=rank, world_size=world_size, batch_size=self.config.eval_batch_size
        )
        target = {"classification": "label", "semseg": "semseg", "depth": "depth"}[self.target]
        for chunk in chunks:
            batch = {k: v.to(device) for k, v in stack_items([dataset[i] for i in chunk]).items()}
            metrics.update(model(batch["rgb"]).float(), batch[target])
        return metrics.compute()


def layer_of(name: str, depth: int) -> int:
    """Layer number of a parameter for layer decay: 0 embeddings, i + 1 block i, depth + 1 the
    rest (final norm, head)."""
    if name.startswith("encoder.blocks."):
        return int(name.split(".")[2]) + 1
    if name.startswith("encoder.") and not name.startswith("encoder.norm"):
        return 0
    return depth + 1
