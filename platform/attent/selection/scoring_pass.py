"""A scoring pass: per-sample losses of the model in eval and inference mode, read through a loader
built once per run and batch size, its worker processes kept between passes, the samples of each
pass swapped into its sampler (a pass's own DataLoader started its workers again at every pass)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

# Scoring batch = this x the training batch, per device type. Scoring keeps no activations for a
# backward pass, so on a GPU a larger batch fits and fills it. On CPU larger batches only spill
# caches: the offline MAE's 4000 samples score in 3.6 s at batch 64-256 and 5.8 s at 512.
SCORING_BATCH_FACTOR = {"cpu": 2, "cuda": 4}
FALLBACK_SCORING_BATCH = 256  # where no training batch is known (a loader the selector did not build)

# loss_fn(model, batch) -> FloatTensor[B] (or [B, C]): the per-sample training loss (reduction="none"),
# moving the batch to the model's device itself; the same function the training loop calls.
PerSampleLoss = Callable[[torch.nn.Module, Any], torch.Tensor]
# A scoring pass: given the (global) indices to score, yields (indices, losses) for this rank's share.
ScoreFn = Callable[[torch.Tensor], Iterable[tuple[torch.Tensor, torch.Tensor]]]


class PassSampler(Sampler[int]):
    """The current pass's sample indices, set before each pass."""

    def __init__(self):
        self.indices: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class ScoringLoader:
    def __init__(
        self, dataset: Dataset, collate_fn: Callable | None, num_workers: int, multiprocessing_context: str | None
    ):
        self.dataset, self.collate_fn, self.num_workers = dataset, collate_fn, num_workers
        self.multiprocessing_context = multiprocessing_context
        self.sampler = PassSampler()
        self._loader: DataLoader | None = None

    def batches(self, shard: torch.Tensor, batch_size: int, pin_memory: bool = False):
        """(indices, batch) of ``shard`` in batches of ``batch_size``, in its order."""
        if self._loader is None or self._loader.batch_size != batch_size:
            self._loader = DataLoader(
                self.dataset,
                batch_size=batch_size,
                sampler=self.sampler,
                collate_fn=self.collate_fn,
                num_workers=self.num_workers,
                persistent_workers=self.num_workers > 0,
                pin_memory=pin_memory,
                multiprocessing_context=self.multiprocessing_context if self.num_workers else None,
            )
        self.sampler.indices = shard.tolist()
        return zip(shard.split(batch_size), self._loader)


def without_autograd(model: torch.nn.Module):
    """A scoring forward's context: inference mode (no autograd bookkeeping at all), or no_grad
    for a model sharded by FSDP, whose parameters all-gathered under inference mode could not be
    written after it (FSDP2 raises at the next training forward).

    Args:
        model: the model the forward runs.

    Returns:
        The context manager.
    """
    if not torch.distributed.is_available():  # a build without torch.distributed: no FSDP
        return torch.inference_mode()
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    sharded = any(isinstance(module, (FSDPModule, FullyShardedDataParallel)) for module in model.modules())
    return torch.no_grad() if sharded else torch.inference_mode()


class ScoringPass:
    """A Selector's own scoring pass: ``loss_fn(model, batch)`` over ``dataset``'s items in eval
    and inference mode, read through one loader kept for the run (no state of the run's own).

    Raises:
        ValueError: ``dataset`` of another length than the training set.

    Args:
        dataset: the scoring pass's items (item i: the training set's sample i).
        train_samples: the training set's size, which ``dataset``'s must equal.
        model: the model to score with (None: no pass can run).
        loss_fn: ``loss_fn(model, batch)`` -> per-sample losses [B] (or [B, C]).
        collate_fn: the loader's; DataLoader's default if None.
        batch_size: samples per batch; None: from the training batch (``batch_size_for``).
        num_workers: the loader's processes.
        multiprocessing_context: how they start (DataLoader's); None: its default.
    """

    def __init__(
        self,
        dataset: Dataset,
        train_samples: int,
        model: torch.nn.Module | None,
        loss_fn: PerSampleLoss | None,
        collate_fn: Callable | None = None,
        batch_size: int | None = None,
        num_workers: int = 0,
        multiprocessing_context: str | None = None,
    ):
        if len(dataset) != train_samples:
            raise ValueError(
                f"score_dataset has {len(dataset)} items, the training set {train_samples}: "
                "item i of both must be the same sample"
            )
        self.dataset, self.model, self.loss_fn, self.batch_size = dataset, model, loss_fn, batch_size
        self.loader = ScoringLoader(dataset, collate_fn, num_workers, multiprocessing_context)

    @property
    def ready(self) -> bool:
        """Whether a pass can run (a model and a loss function were given)."""
        return self.model is not None and self.loss_fn is not None

    def batch_size_for(self, train_batch_size: int | None) -> int:
        """The batch given, else the training batch times ``SCORING_BATCH_FACTOR`` of the model's
        device type (a forward keeps no activations), else ``FALLBACK_SCORING_BATCH``."""
        if self.batch_size:
            return self.batch_size
        if not train_batch_size:
            return FALLBACK_SCORING_BATCH
        return SCORING_BATCH_FACTOR.get(next(self.model.parameters()).device.type, 2) * train_batch_size

    def batches(self, shard: torch.Tensor, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(indices, per-sample losses) of ``shard``, under inference mode (no autograd
        bookkeeping) and in eval mode (dropout off), the model's mode restored after."""
        model = self.model
        on_gpu = next(model.parameters()).device.type == "cuda"
        was_training = model.training
        model.eval()
        try:
            with without_autograd(model):
                for batch_indices, batch in self.loader.batches(shard, batch_size, on_gpu):
                    yield batch_indices, self.loss_fn(model, batch)
        finally:
            model.train(was_training)
