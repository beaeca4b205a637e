"""Masked-autoencoder pretraining (MAE on RGB; Multi-Modal MAE on RGB + depth + semseg).

A sample's loss is the sum of its per-modality reconstruction losses on its own hidden patches;
with several modalities the task reports them as loss components (the group baselines weight
them, the engine logs them). Training masks are fresh random draws on augmented images; scoring
and evaluation masks are seeded by (sample index, round) on the plain images.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from attent.contract import DatasetDescription
from attent.tasks.batches import TensorItemsTask, stack_items
from attent.tasks.mae import data, masking
from attent.tasks.mae.config import MaskedPretrainingConfig
from attent.tasks.mae.losses import reconstruction_losses, standardize_depth
from attent.tasks.mae.model import MaskedAutoencoder
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

EVAL_ROUND = -1  # the seeded masks of evaluation: the same for every evaluation of a run
KERNEL_MASK_INDEX = 2**32 - 1  # kernel_output's masks: seeded by (seed, this, round 0), no real sample's


def load_splits(config, modalities: tuple[str, ...], *, augment: bool, seed: int) -> data.MultiModalSplits:
    """The configured train / validation / test splits, limited as configured; ``seed`` (the
    run's, unless ``split_seed`` fixes it) draws the validation set and the limits."""
    splits = data.load_multimodal(
        config.data_path,
        modalities=modalities,
        img_size=config.img_size,
        augment=augment,
        cache=config.cache,
        num_semseg_classes=config.num_semseg_classes,
        cache_path=config.cache_path,
    )
    return splits.limited(
        config.train_limit, config.test_limit, data_seed(config.split_seed, seed), val_limit=config.val_limit
    )


def semseg_class_count(config) -> tuple[int, tuple[str, ...]]:
    """(classes, the assumption made where neither the config nor the data's dataset.json says):
    MultiMAE's pseudo labels have COCO's 133 panoptic classes."""
    from attent.tasks.mae.files import read_metadata

    if config.num_semseg_classes is not None:
        return config.num_semseg_classes, ()
    listed = (read_metadata(config.data_path) if config.data_path else None) or {}
    if listed.get("semseg_classes"):
        return len(listed["semseg_classes"]), ()
    return 133, ("133 semseg classes (MultiMAE's COCO pseudo labels; task.num_semseg_classes sets it)",)


def encoder_inputs(batch: Batch, modalities: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """What the patch embeddings read: RGB as normalised, depth standardised per image, labels."""
    prepare = {
        "rgb": lambda b: b["rgb"],
        "depth": lambda b: standardize_depth(b["depth"]),
        "semseg": lambda b: b["semseg"],
    }
    return {m: prepare[m](batch) for m in modalities}


class LoggedEncoder(nn.Module):
    """A pretraining run's logged model: the encoder over its modalities as the data holds them
    (RGB normalised, depth in metres, semseg class ids), given in the order of ``modalities``,
    every token visible -> the encoded tokens [B, M * N, D], modality after modality."""

    def __init__(self, encoder: nn.Module, modalities: tuple[str, ...]):
        super().__init__()
        self.encoder, self.modalities = encoder, modalities

    # one parameter per modality (at most three), not ``*inputs``: torch.export traces a fixed list
    def forward(
        self, first: torch.Tensor, second: torch.Tensor | None = None, third: torch.Tensor | None = None
    ) -> torch.Tensor:
        inputs = dict(zip(self.modalities, (first, second, third)))
        return self.encoder(encoder_inputs(inputs, self.modalities))


class MaskedPretrainingTask(TensorItemsTask):
    """Tasks ``mae`` and ``multimae`` (their configs decide the modalities and the budget)."""

    name = "multimae"

    def __init__(self, config: MaskedPretrainingConfig, seed: int):
        self.splits = load_splits(config, config.modality_names(), augment=True, seed=seed)
        self._shape(config, seed, len(self.splits.semseg_classes))
        self.depth_unit_m = self.splits.train.fmt.depth_unit_m  # stored depth integers -> metres
        # what the engine's loaders read: the stored integers, made model inputs on the device
        self._train_set = self.splits.train.with_integers()
        self._scoring_set = self._train_set.without_augmentation()

    def _shape(self, config: MaskedPretrainingConfig, seed: int, semseg_classes: int) -> None:
        """What the model and the losses need of the data: its semseg class count."""
        self.config, self.seed = config, seed
        self.modalities = config.modality_names()
        self.spec = config.model.spec(
            self.modalities, config.img_size, semseg_classes, extra_norm_pix=config.extra_norm_pix_loss
        )
        self.budget = config.visible_budget(self.spec.patches)
        self.alpha = getattr(config, "alpha", None)
        self.loss_components = self.modalities if len(self.modalities) > 1 else ()

    @classmethod
    def probe(cls, config: MaskedPretrainingConfig) -> Probe:
        """The masked autoencoder at the configured size, its own training and scoring losses, on
        random images of every modality; the semseg class count from the config or the data's
        dataset.json, else MultiMAE's 133 (COCO's panoptic classes, its pseudo labels)."""
        modalities = config.modality_names()
        classes, assumed = semseg_class_count(config) if "semseg" in modalities else (0, ())
        task = cls.__new__(cls)  # its losses without its data
        task._shape(config, 0, classes)
        task.depth_unit_m = 1.0  # its batches are in metres already
        size = config.img_size

        def batch(n: int, device: torch.device) -> Batch:
            images = {
                "rgb": lambda: torch.randn(n, 3, size, size, device=device),
                "depth": lambda: torch.rand(n, 1, size, size, device=device) * 10,
                "semseg": lambda: torch.randint(0, max(classes, 1), (n, size, size), device=device),
            }
            return {"index": torch.arange(n), **{m: images[m]() for m in modalities}}

        return Probe(
            build_model=lambda: MaskedAutoencoder(task.spec),
            batch=batch,
            train_loss=task.per_sample_loss,
            score_loss=lambda model, b: task.score(model, b, 0),
            sample=f"{size} px, {'+'.join(modalities)}, {task.budget} of {task.spec.patches * len(modalities)} "
            "tokens visible",
            assumptions=assumed,
            workload="mae",
        )

    def train_dataset(self) -> data.MultiModalDataset:
        return self._train_set

    def scoring_dataset(self) -> data.MultiModalDataset:
        return self._scoring_set

    def prepare(self, batch: Batch) -> Batch:
        return data.to_model_inputs(batch, self.depth_unit_m)

    def group_labels(self) -> torch.Tensor:
        return self.splits.train.labels  # scene classes: the class-weight baseline's groups

    def describe_data(self) -> list[DatasetDescription]:
        return data.describe_splits(self.splits, self.config.data_path)

    def build_model(self) -> nn.Module:
        return seeded_init(self.seed, lambda: MaskedAutoencoder(self.spec))

    def optimizer_spec(self) -> OptimizerSpec:
        # MAE / MultiMAE pretraining: AdamW (0.9, 0.95), wd 0.05, cosine with a 5% warm-up.
        return OptimizerSpec(lr=1e-4, weight_decay=0.05, betas=(0.9, 0.95), schedule="cosine", warmup_ratio=0.05)

    def per_sample_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        batch = self.prepare(batch)
        masks = masking.random_masks(
            len(batch["index"]),
            len(self.modalities),
            self.spec.patches,
            self.budget,
            alpha=self.alpha,
            device=self._device(model),
        )
        return self._losses(model, batch, masks)

    def score(self, model: nn.Module, batch: Batch, round_: int) -> torch.Tensor:
        batch = self.prepare(batch)
        return self._losses(model, batch, self._seeded(batch["index"], round_, model))

    def kernel_output(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The sample's score (its reconstruction losses summed over modalities) under one mask
        shared by every sample, seeded by the run's seed: one deterministic function f for all
        inputs, as a kernel needs, drawn outside the vmapped sample (no random op inside)."""
        sentinel = torch.full((len(batch["index"]),), KERNEL_MASK_INDEX)
        losses = self._losses(model, self.prepare(batch), self._seeded(sentinel, 0, model))
        return losses if losses.ndim == 1 else losses.sum(dim=1)

    def _seeded(self, indices: torch.Tensor, round_: int, model: nn.Module) -> masking.Masks:
        return masking.seeded_masks(
            indices.cpu(),
            round_,
            seed=self.seed,
            modalities=len(self.modalities),
            patches=self.spec.patches,
            budget=self.budget,
            alpha=self.alpha,
            device=self._device(model),
        )

    def _losses(self, model: nn.Module, batch: Batch, masks: masking.Masks) -> torch.Tensor:
        predictions = model(encoder_inputs(batch, self.modalities), masks.visible, masks.hidden)
        losses = reconstruction_losses(
            predictions, batch, masks.hidden, spec=self.spec, norm_pix=self.config.norm_pix_loss
        )
        return losses if self.loss_components else losses[:, 0]

    @staticmethod
    def _device(model: nn.Module) -> torch.device:
        return next(model.parameters()).device

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, *, rank: int, world_size: int, progress: Callable[[str], None] | None = None
    ) -> dict[str, float]:
        """Reconstruction loss on the test split under masks fixed for the whole run, in total
        and per modality (and the k-NN probe's accuracy); the same for the validation set when
        one is held out."""
        metrics = {}
        for split, dataset in (("test", self.splits.test), ("val", self.splits.val)):
            if dataset is not None:
                metrics.update(self.reconstruction(model, dataset, split, rank=rank, world_size=world_size))
                if self.config.knn_neighbours:
                    metrics[f"{split}_knn_accuracy"] = self.knn_accuracy(model, dataset)
        return metrics

    def reconstruction(
        self, model: nn.Module, dataset: data.MultiModalDataset, split: str, *, rank: int, world_size: int
    ) -> dict[str, float]:
        """{<split>_loss, <split>_loss_<modality>} of one evaluation set, summed over the ranks'
        shards."""
        chunks = evaluation_chunks(
            len(dataset), rank=rank, world_size=world_size, batch_size=self.config.eval_batch_size
        )
        totals = torch.zeros(len(self.modalities) + 1, dtype=torch.float64, device=self._device(model))
        for chunk in chunks:
            batch = {k: v.to(totals.device) for k, v in stack_items([dataset[i] for i in chunk]).items()}
            losses = self._losses(model, batch, self._seeded(batch["index"], EVAL_ROUND, model))
            totals[:-1] += losses.reshape(len(chunk), -1).double().sum(dim=0)
            totals[-1] += len(chunk)
        sums = sum_over_ranks(totals, world_size).tolist()
        count = max(sums[-1], 1)
        metrics = {f"{split}_loss": sum(sums[:-1]) / count}
        if self.loss_components:
            metrics.update({f"{split}_loss_{m}": s / count for m, s in zip(self.modalities, sums)})
        return metrics

    def rgb_features(self, model: nn.Module, dataset: data.MultiModalDataset, count: int) -> torch.Tensor:
        """Mean-pooled encoder features of the first ``count`` samples from their RGB tokens alone
        (as the downstream jobs see them), L2-normalised: [count, D]."""
        rgb = self.modalities.index("rgb") * self.spec.patches + torch.arange(self.spec.patches)
        features = []
        for start in range(0, count, self.config.eval_batch_size):
            items = [dataset[i] for i in range(start, min(count, start + self.config.eval_batch_size))]
            batch = {k: v.to(self._device(model)) for k, v in stack_items(items).items()}
            visible = rgb.to(batch["index"].device).expand(len(items), -1)
            features.append(model.encoder(encoder_inputs(batch, self.modalities), visible).float().mean(dim=1))
        return nn.functional.normalize(torch.cat(features), dim=1)

    def knn_accuracy(self, model: nn.Module, queries: data.MultiModalDataset) -> float:
        """Top-1 accuracy on ``queries`` (the test or validation set) of a k-NN probe of the
        encoder over the training scenes (every rank computes it whole: the sets are small).
        Votes weighted by exp(similarity / 0.07), as in DINO's k-NN evaluation."""
        memory_set = self.splits.train.without_augmentation()
        memory = self.rgb_features(model, memory_set, min(len(memory_set), self.config.knn_train_limit))
        labels = memory_set.labels[: memory.shape[0]].to(memory.device)
        test = self.rgb_features(model, queries, len(queries))
        similarity, neighbour = (test @ memory.T).topk(min(self.config.knn_neighbours, memory.shape[0]), dim=1)
        votes = torch.zeros(test.shape[0], int(self.splits.train.labels.max()) + 1, device=test.device)
        votes.scatter_add_(1, labels[neighbour], (similarity / 0.07).exp())
        truth = queries.labels.to(test.device)
        return float((votes.argmax(dim=1) == truth).float().mean())

    def model_to_log(self, model: nn.Module) -> TorchModel:
        """The encoder (``LoggedEncoder``); its modalities, in input order, in the metadata."""
        batch = stack_items([self.splits.test[0], self.splits.test[1]])
        return TorchModel(
            LoggedEncoder(model.encoder, self.modalities),
            {m: batch[m] for m in self.modalities},
            metadata={"modalities": list(self.modalities)},
        )

    def export(self, model: nn.Module) -> dict[str, Any]:
        """The encoder's weights and shape, for downstream jobs."""
        state = {k: v.detach().cpu() for k, v in model.encoder.state_dict().items()}
        return {"spec": self.spec.to_dict(), "encoder": state}
