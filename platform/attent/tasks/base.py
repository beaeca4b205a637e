"""The task interface: everything the engine needs to know about one workload.

A task is built inside each Ray Train worker from its pydantic config section. The engine owns
the loop (sampling, optimisation, timing, checkpoints, MLflow); a task owns data, model,
per-sample loss and evaluation. Batches are dicts of tensors that always carry ``"index"``: the
position of each sample in ``train_dataset`` (the AtteNT teacher keys its score table on it).
"""
from __future__ import annotations

import abc
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import Dataset

Batch = dict[str, Any]


class Task(abc.ABC):
    """One workload (ViT classification, LLM LoRA fine-tuning, ...)."""

    name: str = "task"

    # --- data -------------------------------------------------------------------------------
    @abc.abstractmethod
    def train_dataset(self) -> Dataset:
        """Map-style training set; item i is whatever ``collate`` accepts, and carries index i."""

    @abc.abstractmethod
    def collate(self, items: list[Any]) -> Batch:
        """Items -> batch dict with ``"index"`` (LongTensor[B]) plus model inputs."""

    def group_labels(self) -> torch.Tensor | None:
        """LongTensor[N] of group ids (class, modality) for group-weight baselines, or None."""
        return None

    # --- model ------------------------------------------------------------------------------
    @abc.abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model (the engine moves it to the device and wraps it for DDP)."""

    def trainable_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """Parameters the optimiser updates (LoRA tasks return the adapters only)."""
        return [p for p in model.parameters() if p.requires_grad]

    def optimizer_defaults(self) -> dict[str, Any]:
        """Task-specific optimiser defaults (lr, weight decay, betas) the config may override."""
        return {}

    # --- loss and evaluation ----------------------------------------------------------------
    @abc.abstractmethod
    def per_sample_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """FloatTensor[B]: one loss per sample, unreduced, differentiable when grad is enabled.

        This is both the training loss (the engine takes a weighted mean) and the AtteNT score.
        """

    @abc.abstractmethod
    def evaluate(self, model: nn.Module, *, rank: int, world_size: int,
                 progress: Callable[[str], None] | None = None) -> dict[str, float]:
        """Downstream metrics, identical on every rank (shard the work and all-reduce, or
        compute on every rank). Called with the unwrapped model in eval mode."""
