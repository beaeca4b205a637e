"""AtteNT in a plain PyTorch loop, in three lines, with no monkey-patching and the user's dataset
items unchanged:

    selector = attent.Selector(train_set, selection=SelectionConfig(preset="vit"), epochs=E, seed=0,
                               model=model, loss_fn=per_sample_loss)   # the scoring pass, if any
    loader = selector.loader(batch_size=64)          # = DataLoader(train_set, sampler=selector.sampler)
    for epoch in range(E):
        selector.begin_epoch(epoch)                   # scores and re-selects when the preset says so
        for batch in loader:
            loss = selector.update(per_sample_loss(model, batch))   # observe, weigh, mean
            loss.backward(); optimizer.step(); optimizer.zero_grad()

Per-sample losses are [B], or [B, C] for a loss of C components (the modalities of a multi-modal
MAE; ``components=`` names them): a sample's score is then the sum of its components, and its
training loss their sum weighed by the method's component weights.

How the indices reach ``update``: the selector's sampler records the order it hands the
DataLoader, and ``update`` takes the next ``len(losses)`` indices of that order. A DataLoader
returns its batches in its sampler's order (also with worker processes: ``in_order=True`` is its
default), so this works with any dataset item and any ``collate_fn``, which an index carried in
the items would not (a custom collate may drop it, a dataset of tuples has no room for it).
Pass ``indices=`` to ``update`` instead where batches do not follow the sampler one after the
other (a loader with ``in_order=False``, batches skipped or reordered).

The selection itself is ``attent.selection``'s: a ``Teacher`` (score table, schedules, the
agreement of ranks) and ``SubsetSampler`` (this rank's shard). This module only wires them to a
user's loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from ..selection import metric_names as names
from ..selection.config import SelectionConfig
from ..selection.deprecation import deprecated_arguments, warn_renamed
from ..selection.distributed import agreed_checksum, all_reduce_sums
from ..selection.sampler import shard_indices
from ..selection.strategies import budget
from ..selection.teacher import ScoreFn, Teacher
from .recording_sampler import RecordingSampler

# Scoring batch = this x the training batch, per device type. Scoring keeps no activations for a
# backward pass, so on a GPU a larger batch fits and fills it. On CPU larger batches only spill
# caches: the offline MAE's 4000 samples score in 3.6 s at batch 64-256 and 5.8 s at 512.
SCORING_BATCH_FACTOR = {"cpu": 2, "cuda": 4}
FALLBACK_SCORING_BATCH = 256  # where no training batch is known (a loader the selector did not build)

# loss_fn(model, batch) -> FloatTensor[B] (or [B, C]): the per-sample training loss (reduction="none"),
# moving the batch to the model's device itself; the same function the training loop calls.
PerSampleLoss = Callable[[torch.nn.Module, Any], torch.Tensor]


class Selector:
    """AtteNT's choice of training samples, for a user's own PyTorch loop.

    ``dataset``: the training set (wrapped, not copied; its items are handed out unchanged), the
    one positional argument. ``selection``: a ``SelectionConfig`` (e.g. ``preset="vit"``).
    ``epochs``: the run's length, which the ratio and interval schedules follow. ``seed``: of the
    selection's draws and shuffles. ``model`` and ``loss_fn``: needed only where the selection runs
    scoring passes (the ``vit`` preset does, ``llm`` and ``full`` do not); a scoring pass reads
    ``score_dataset`` (the training set by default; e.g. the same items without augmentation) in
    batches of ``score_batch_size`` (default: twice the training batch of ``loader()`` on CPU, four
    times on a GPU) with ``score_num_workers`` loader processes. ``components``:
    the names of the loss components where ``loss_fn`` returns [B, C]. Under torch.distributed
    every rank builds its Selector with the same arguments; rank and world size are read from the
    process group unless given, and every epoch's subset is checked to be the same on every rank. (``config=``, and the config, epochs and seed by position, still
    work with a FutureWarning until 0.3.0: CHANGELOG.md.)
    """

    @deprecated_arguments(positional=2, by_position=("selection", "epochs", "seed"), renamed={"config": "selection"})
    def __init__(
        self,
        dataset: Dataset,
        *,
        selection: SelectionConfig,
        epochs: int,
        seed: int = 0,
        model: torch.nn.Module | None = None,
        loss_fn: PerSampleLoss | None = None,
        collate_fn: Callable | None = None,  # the scoring pass's; DataLoader's default if None
        score_dataset: Dataset | None = None,  # the scoring pass's items (e.g. without augmentation)
        score_batch_size: int | None = None,  # samples per scoring-pass batch; None: from the training batch
        score_num_workers: int = 0,  # the scoring pass's DataLoader processes
        groups: torch.Tensor | None = None,  # class per sample: stratify, class_weight
        components: Sequence[str] = (),  # loss component names, where losses are [B, C]
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
    ):  # the sampler's, as DistributedSampler's
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if distributed else 1)
        self.dataset, self.selection, self.epochs, self.seed = dataset, selection, epochs, seed
        self.model, self.loss_fn = model, loss_fn
        self.collate_fn, self.score_batch_size, self.score_num_workers = collate_fn, score_batch_size, score_num_workers
        self.components = tuple(components)
        self.train_batch_size: int | None = None  # loader()'s, which sizes the scoring batch
        self.score_dataset = dataset if score_dataset is None else score_dataset
        if len(self.score_dataset) != len(dataset):
            raise ValueError(
                f"score_dataset has {len(self.score_dataset)} items, the training set {len(dataset)}: "
                "item i of both must be the same sample"
            )
        self.teacher = Teacher(
            len(dataset), selection, epochs, seed=seed, groups=groups, components=len(self.components)
        )
        self.sampler = RecordingSampler(
            self.teacher, self.rank, self.world_size, seed=seed, shuffle=shuffle, drop_last=drop_last
        )
        self.epoch = -1  # the epoch begun last (a scoring loss_fn may read it, e.g. to seed masks)
        self.next_epoch = 0  # the epoch a (resumed) loop starts from
        self.samples_backpropagated = 0  # distinct samples trained on, summed over epochs and ranks
        self.samples_forwarded = 0  # training and scoring forwards, summed over epochs and ranks
        self._epoch_metrics: dict[str, float] = {}
        self._checksum = math.nan
        self._reset_sums()
        self._ended = True

    def _reset_sums(self) -> None:
        """This rank's sums over the epoch so far: scores, samples trained and scored, components."""
        self._loss_sum, self._seen, self._scored, self._unrecorded = 0.0, 0, 0, 0
        self._component_sums = [0.0] * len(self.components)

    @property
    def config(self) -> SelectionConfig:
        """Deprecated spelling of ``selection``, removed in 0.3.0."""
        warn_renamed("Selector.config", "Selector.selection")
        return self.selection

    def loader(self, batch_size: int, **kwargs) -> DataLoader:
        """``DataLoader(dataset, batch_size, sampler=selector.sampler, **kwargs)``, with the
        Selector's ``collate_fn`` unless one is given."""
        if "sampler" in kwargs or kwargs.get("shuffle"):
            raise ValueError(
                "the selector's sampler chooses and shuffles the samples: pass neither sampler nor shuffle"
            )
        kwargs.setdefault("collate_fn", self.collate_fn)
        self.train_batch_size = batch_size
        return DataLoader(self.dataset, batch_size=batch_size, sampler=self.sampler, **kwargs)

    # --- the epoch -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int, score_fn: ScoreFn | None = None) -> torch.Tensor:
        """Prepare epoch ``epoch``: a scoring pass and a re-selection where the schedules say so;
        returns the epoch's subset (global indices, identical on every rank). Every rank calls it.
        ``score_fn(indices)`` overrides the scoring pass built from ``model`` and ``loss_fn``: it
        yields (indices, losses) for this rank's share of ``indices``."""
        if not self._ended:
            self.end_epoch()
        self._reset_sums()
        self.epoch = epoch
        if score_fn is None and self.teacher.needs_scoring(epoch):
            if self.model is None or self.loss_fn is None:
                raise ValueError(
                    f"epoch {epoch} needs a scoring pass (selection {self.selection.label(self.epochs)}): "
                    "pass model= and loss_fn= to Selector, or score_fn= to begin_epoch"
                )
            score_fn = self.scoring_pass
        subset = self.teacher.begin_epoch(epoch, score_fn)
        self._checksum = agreed_checksum(subset)  # raises where ranks chose different subsets
        self.samples_backpropagated += subset.numel()
        self.next_epoch, self._ended = epoch + 1, False
        return subset

    def update(self, losses: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Record a batch's per-sample losses ([B] or [B, C], with their graph) as the samples'
        scores, and return the loss to back-propagate: the mean of ``weigh``'s per-sample losses
        (the plain mean for ``method="full"``). ``indices``: the batch's positions in the dataset;
        by default the next B of the sampler's order. Under gradient accumulation divide the
        result as for any mean loss."""
        return self.weigh(losses, indices).mean()

    def weigh(self, losses: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        """``update`` without the mean, for a loop that reduces over its own denominator (e.g.
        the samples of a whole accumulation window): records the losses and returns the
        per-sample training losses [B], components summed with the method's component weights,
        times the samples' loss weights (all 1 unless the method reweighs)."""
        _, weights = self.record(losses, indices)
        if losses.ndim == 2:
            losses = losses @ self.teacher.component_weights.to(losses.device, losses.dtype)
        return losses * weights

    def record(self, losses: torch.Tensor, indices: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Record a batch's losses as the samples' scores without reducing them, for a loop that
        weighs them its own way (e.g. token sums, as the Hugging Face integration does): returns
        (the batch's indices in the dataset, their loss weights [B] on the losses' device)."""
        if self._ended:
            raise RuntimeError("update() outside an epoch: call begin_epoch(epoch) before the epoch's batches")
        expected = (len(self.components),) if self.components else ()
        if tuple(losses.shape[1:]) != expected:
            wanted = f"[B, {len(self.components)}] (components {list(self.components)})" if self.components else "[B]"
            raise ValueError(
                f"update() wants one loss per sample, shape {wanted}, got {tuple(losses.shape)}: "
                "compute the loss with reduction='none' (and average over tokens per sample)"
                + ("" if self.components or losses.ndim != 2 else "; name the components with components=")
            )
        count = losses.shape[0]
        if indices is None:
            indices = self.sampler.take(count)
        else:  # the caller knows better; the cursor still counts the epoch's samples
            indices = torch.as_tensor(indices).reshape(-1).cpu()
            self.sampler.cursor += count
        self.teacher.observe(indices, losses)
        scores = losses.detach()
        if self.components:  # a sample's score: the sum of its components
            sums = scores.float().sum(dim=0).tolist()
            self._component_sums = [a + b for a, b in zip(self._component_sums, sums)]
            scores = scores.sum(dim=1)
        self._loss_sum += float(scores.float().sum())
        self._seen += count
        weights = self.teacher.loss_weights[indices].to(losses.device, losses.dtype)
        if self.sampler.cursor == self.sampler.order.numel() > 0:  # the shard's last batch: same call on every rank
            self.end_epoch()
        return indices, weights

    def advance(self, count: int, indices: torch.Tensor | None = None) -> torch.Tensor:
        """``record`` without losses, for a loop whose selection reads none (``method="full"``):
        the next ``count`` samples (or ``indices``) trained on, counted as forwarded but not in
        ``train_loss``; the shard's last one ends the epoch. Returns their indices."""
        if self._ended:
            raise RuntimeError("advance() outside an epoch: call begin_epoch(epoch) before the epoch's batches")
        if indices is None:
            indices = self.sampler.take(count)
        else:
            indices = torch.as_tensor(indices).reshape(-1).cpu()
            self.sampler.cursor += count
        self._unrecorded += count
        if self.sampler.cursor == self.sampler.order.numel() > 0:
            self.end_epoch()
        return indices

    @property
    def in_epoch(self) -> bool:
        """Between ``begin_epoch`` and the epoch's end (its last update or ``end_epoch``)."""
        return not self._ended

    def end_epoch(self) -> None:
        """Merge the epoch's scores and training losses across ranks (collectives: every rank
        calls it). ``update`` calls it after the shard's last sample; call it yourself where the
        loader drops the last batch (``drop_last=True``) or the loop leaves an epoch early."""
        if self._ended:
            return
        self.teacher.end_epoch()
        self._ended = True
        loss_sum, seen, scored, unrecorded, *component_sums = all_reduce_sums(
            [self._loss_sum, float(self._seen), float(self._scored), float(self._unrecorded), *self._component_sums]
        )
        self.samples_forwarded += int(seen + scored + unrecorded)
        self._epoch_metrics = self._metrics(loss_sum, seen, component_sums)

    def scoring_pass(self, indices: torch.Tensor) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """Per-sample losses of this rank's share of ``indices`` from ``loss_fn(model, batch)``,
        under inference mode (no autograd bookkeeping) and in eval mode (dropout off), the
        model's mode restored after."""
        shard = shard_indices(indices, self.rank, self.world_size, shuffle=False)
        batch_size = self.scoring_batch_size()
        loader = DataLoader(
            self.score_dataset,
            batch_size=batch_size,
            sampler=shard.tolist(),
            collate_fn=self.collate_fn,
            num_workers=self.score_num_workers,
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for batch_indices, batch in zip(shard.split(batch_size), loader):
                    losses = self.loss_fn(self.model, batch)
                    self._scored += losses.shape[0]
                    yield batch_indices, losses
        finally:
            self.model.train(was_training)

    def scoring_batch_size(self) -> int:
        """``score_batch_size``, else the training batch times ``SCORING_BATCH_FACTOR`` of the
        model's device type (a forward keeps no activations), else 256."""
        if self.score_batch_size:
            return self.score_batch_size
        if not self.train_batch_size:
            return FALLBACK_SCORING_BATCH
        device = next(self.model.parameters()).device.type
        return SCORING_BATCH_FACTOR.get(device, 2) * self.train_batch_size

    # --- what a loop needs around it -------------------------------------------------------------
    def planned_steps(self, batch_size: int, drop_last: bool = False, accumulation: int = 1) -> int:
        """Optimiser steps this rank takes over the run on the planned subsets, to size a
        step-based LR schedule up front (e.g. ``OneCycleLR(total_steps=...)``). ``batch_size`` and
        ``drop_last``: the DataLoader's; ``accumulation``: batches per optimiser step (a short last
        window still steps)."""
        return sum(math.ceil(batches / accumulation) for batches in self.planned_batches(batch_size, drop_last))

    def planned_batches(self, batch_size: int, drop_last: bool = False) -> list[int]:
        """Batches this rank draws in each epoch of the run, on the planned subsets."""
        batches = []
        for size in planned_subset_sizes(self.selection, len(self.dataset), self.epochs):
            shard = size // self.world_size if self.sampler.drop_last else math.ceil(size / self.world_size)
            batches.append(shard // batch_size if drop_last else math.ceil(shard / batch_size))
        return batches

    def metrics(self) -> dict[str, float]:
        """The latest epoch's selection, for the user's logger, under the names the engine logs
        (``attent.selection.metric_names``, which ``attent.contract`` re-exports):
        ``selected_ratio``, ``selection_hardness`` (1: the top-k of the scores, 0: uniform; NaN
        before a pick), ``selection_overlap`` with the previous pick,
        ``selection_score_agreement`` (Spearman of training and scoring-pass losses; NaN without
        a scoring pass), ``samples_backpropagated`` (distinct) and ``samples_forwarded``
        (training and scoring forwards), both summed over epochs and ranks, ``subset_checksum``,
        ``train_loss`` (the mean per-sample loss over every rank once the epoch ended, this
        rank's so far inside it), with components each one's ``train_loss_<name>`` and its weight
        ``loss_weight_<name>``, and the integrations' own ``epoch``, ``selected`` (subset size)
        and ``samples_scored`` (this rank, this epoch)."""
        if self._ended:
            return dict(self._epoch_metrics)
        return self._metrics(self._loss_sum, self._seen, self._component_sums)

    def _metrics(self, loss_sum: float, seen: float, component_sums: list[float]) -> dict[str, float]:
        last = self.teacher.history[-1] if self.teacher.history else None
        components = {}
        if self.components:
            weights = self.teacher.component_weights.tolist()
            for name, total, weight in zip(self.components, component_sums, weights):
                components[names.component_loss_metric(name)] = total / max(seen, 1)
                components[names.component_weight_metric(name)] = weight
        return {
            names.EPOCH: self.next_epoch,
            names.SELECTED_RATIO: self.teacher.selected_ratio,
            names.SELECTED: self.teacher.subset.numel(),
            names.SELECTION_HARDNESS: last.hardness if last else math.nan,
            names.SELECTION_OVERLAP: last.overlap if last else math.nan,
            names.SCORE_AGREEMENT: last.score_agreement if last else math.nan,
            names.SAMPLES_BACKPROPAGATED: self.samples_backpropagated,
            names.SAMPLES_FORWARDED: self.samples_forwarded,
            names.SAMPLES_SCORED: self._scored,
            names.TRAIN_LOSS: loss_sum / seen if seen else math.nan,
            names.SUBSET_CHECKSUM: self._checksum,
            **components,
        }

    def state_dict(self) -> dict[str, Any]:
        """The teacher's state and the epoch reached: a Selector loaded from it draws the same
        subsets as the uninterrupted run. Take it between epochs (after the epoch's last update
        or ``end_epoch()``)."""
        if not self._ended:
            raise RuntimeError(
                "state_dict() inside an epoch: take it after the epoch's last update() or after end_epoch()"
            )
        return {
            "teacher": self.teacher.state_dict(),
            "next_epoch": self.next_epoch,
            "samples_backpropagated": self.samples_backpropagated,
            "samples_forwarded": self.samples_forwarded,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.teacher.load_state_dict(state["teacher"])
        self.next_epoch = state["next_epoch"]
        self.samples_backpropagated = state["samples_backpropagated"]
        self.samples_forwarded = state.get("samples_forwarded", 0)  # absent from 0.1.0's states
        self._ended, self._epoch_metrics = True, {}


def planned_subset_sizes(selection: SelectionConfig, num_samples: int, epochs: int) -> list[int]:
    """The subset size of every epoch, as the Teacher will choose it (``selection.epoch_plan``):
    all data before the first re-selection, while annealing and in the full epochs of a cycle
    (interval kind cycles), ``budget(N, ratio)`` from each re-selection on. InfoBatch's sizes
    depend on the losses and cannot be planned."""
    if selection.method == "infobatch":
        raise ValueError(
            "InfoBatch's subset sizes depend on the losses: planned_steps cannot size a "
            "schedule for it; use an epoch-based schedule"
        )
    return [
        num_samples if planned.all_data else budget(num_samples, planned.ratio)
        for planned in selection.epoch_plan(epochs)
    ]
