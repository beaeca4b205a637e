"""AtteNT in any PyTorch loop, with no monkey-patching and the user's dataset items unchanged:

    selector = attent.Selector(train_set, selection=SelectionConfig(preset="vit"), epochs=E, seed=0,
                               model=model, loss_fn=per_sample_loss)   # the scoring pass, if any
    loader = selector.loader(batch_size=64)          # = DataLoader(train_set, sampler=selector.sampler)
    for epoch in range(E):
        selector.begin_epoch(epoch)                   # scores and re-selects where the plan says so
        for batch in loader:
            loss = selector.update(per_sample_loss(model, batch)).mean()   # recorded, weighed
            loss.backward(); optimizer.step(); optimizer.zero_grad()
        selector.end_epoch()                          # the epoch's scores merged across ranks

Per-sample losses are [B], or [B, C] for a loss of C components (``components=`` names them): a
sample's score is the sum of its components, its training loss their sum weighed by the method's
component weights. ``update`` pairs a batch's losses with the next B indices of the order the
sampler handed the DataLoader (which returns batches in that order, also with workers), so any
dataset item and ``collate_fn`` work; pass ``indices=`` where batches do not follow the sampler.
Nothing in ``update`` waits on the GPU: the losses stay on their device until ``end_epoch``
merges them, the epoch's loss weights move to the device once per pass, the sums are device tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from . import metric_names as names
from .config import SelectionConfig
from .distributed import agreed_checksum, all_reduce_sums
from .plan import Plan
from .sampler import RecordingSampler, shard_indices
from .scoring_pass import ScoringLoader
from .teacher import STATE_FORMAT, ScoreFn, Teacher, check_state_format

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
    ``epochs``: the run's length, which the plan follows. ``seed``: of the selection's draws and
    shuffles. ``model`` and ``loss_fn``: needed only where the plan runs scoring passes (the
    ``vit`` preset does, ``llm`` and ``full`` do not); a scoring pass reads ``score_dataset`` (the
    training set by default; e.g. the same items without augmentation) in batches of
    ``score_batch_size`` (default: twice the training batch of ``loader()`` on CPU, four times on a
    GPU) with ``score_num_workers`` loader processes. ``components``: the names of the loss
    components where ``loss_fn`` returns [B, C]. ``nonfinite``: a NaN or inf loss stops the run at
    the epoch's end ("raise") or is no score ("skip", counted in ``samples_nonfinite``). Under
    torch.distributed every rank builds its Selector with the same arguments; rank and world size
    are read from the process group unless given, and every epoch's subset is checked to be the
    same on every rank.
    """

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
        score_multiprocessing_context: str | None = None,  # how they start (DataLoader's); None: its default
        groups: torch.Tensor | None = None,  # class per sample: stratify, class_weight
        components: Sequence[str] = (),  # loss component names, where losses are [B, C]
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,  # the sampler's, as DistributedSampler's
        nonfinite: str = "raise",
    ):
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if distributed else 1)
        self.dataset, self.selection, self.epochs, self.seed = dataset, selection, epochs, seed
        self.model, self.loss_fn = model, loss_fn
        self.collate_fn, self.score_batch_size, self.score_num_workers = collate_fn, score_batch_size, score_num_workers
        self.components = tuple(components)
        self.train_batch_size: int | None = None  # loader()'s, which sizes the scoring batch
        self.score_dataset = dataset if score_dataset is None else score_dataset
        self._scoring_loader = ScoringLoader(
            self.score_dataset, collate_fn, score_num_workers, score_multiprocessing_context
        )
        if len(self.score_dataset) != len(dataset):
            raise ValueError(
                f"score_dataset has {len(self.score_dataset)} items, the training set {len(dataset)}: "
                "item i of both must be the same sample"
            )
        components, n = len(self.components), len(dataset)
        self.teacher = Teacher(
            n, selection, epochs, seed=seed, groups=groups, components=components, nonfinite=nonfinite
        )
        self.sampler = RecordingSampler(
            self.teacher, self.rank, self.world_size, seed=seed, shuffle=shuffle, drop_last=drop_last
        )
        self.epoch = -1  # the epoch begun last (a scoring loss_fn may read it, e.g. to seed masks)
        self.next_epoch = 0  # the epoch a (resumed) loop starts from
        self.samples_backpropagated = 0  # distinct samples trained on (padding excluded), over epochs and ranks
        self.samples_forwarded = 0  # training and scoring forwards, summed over epochs and ranks
        self._epoch_metrics: dict[str, float] = {}
        self._checksum = math.nan
        self._in_epoch = self._skip_trained = False
        self._reset_sums()

    @property
    def plan(self) -> Plan:
        """The run's plan: every epoch's share of the data, re-selection and scoring pass."""
        return self.teacher.plan

    def needs_scoring(self, epoch: int) -> bool:
        """Whether ``begin_epoch(epoch)`` runs a scoring pass (the plan's, where still due)."""
        return self.teacher.needs_scoring(epoch)

    def _reset_sums(self) -> None:
        """This rank's sums over the epoch so far (device tensors once a batch is recorded)."""
        self._loss_sum, self._component_sums = 0.0, None
        self._seen, self._scored, self._skipped_before = 0, 0, self.teacher.skipped
        self._on_device = self._pass_weights = self._pass_component_weights = None  # (pass, device, dtype): the weights

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
        """Prepare epoch ``epoch``: a scoring pass and a re-selection where the plan says so;
        returns the epoch's subset (global indices, identical on every rank). Every rank calls it;
        an epoch still open is ended first. ``score_fn(indices)`` overrides the scoring pass built
        from ``model`` and ``loss_fn``: it yields (indices, losses) for this rank's share of
        ``indices``. After ``load_state_dict`` of a state taken inside epoch e, ``begin_epoch(e)``
        goes on where the state was taken."""
        if self._in_epoch and epoch == self.epoch:  # a state restored inside this epoch
            self.sampler.resume_at, self.sampler.skip_resumed = self.sampler.cursor, self._skip_trained
            return self.teacher.subset
        self.end_epoch()
        self._reset_sums()
        self.epoch = epoch
        if score_fn is None and self.needs_scoring(epoch):
            if self.model is None or self.loss_fn is None:
                raise ValueError(
                    f"epoch {epoch} needs a scoring pass (selection {self.plan.label}): "
                    "pass model= and loss_fn= to Selector, or score_fn= to begin_epoch"
                )
            score_fn = self.scoring_pass
        subset = self.teacher.begin_epoch(epoch, score_fn)
        self._checksum = agreed_checksum(subset)  # raises where ranks chose different subsets
        self.sampler.cursor = 0
        self.next_epoch, self._in_epoch = epoch + 1, True
        return subset

    def update(
        self, losses: torch.Tensor, indices: torch.Tensor | None = None, *, train_losses: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Record a batch's per-sample losses ([B] or [B, C], with their graph) as the samples'
        scores, and return the per-sample training losses [B] to reduce and back-propagate
        (``.mean()``, or a sum over the loop's own denominator under gradient accumulation):
        ``train_losses`` (default: the losses, components summed with the method's component
        weights) times each sample's loss weight (all 1 unless the method reweighs). Pass
        ``train_losses`` where what is trained on is not the score, e.g. a sequence's summed token
        losses against its mean as the score. ``indices``: the batch's positions in the dataset;
        by default the next B of the sampler's order."""
        if not self._in_epoch:
            raise RuntimeError("update() outside an epoch: call begin_epoch(epoch) before the epoch's batches")
        expected = (len(self.components),) if self.components else ()
        if tuple(losses.shape[1:]) != expected:
            wanted = f"[B, {len(self.components)}] (components {list(self.components)})" if self.components else "[B]"
            raise ValueError(
                f"update() wants one loss per sample, shape {wanted}, got {tuple(losses.shape)}: "
                "compute the loss with reduction='none' (and average over tokens per sample)"
                + ("" if self.components or losses.ndim != 2 else "; name the components with components=")
            )
        count, start = losses.shape[0], self.sampler.cursor
        in_order = indices is None
        if in_order:
            indices = self.sampler.take(count)
        else:  # the caller knows better; the cursor still counts the epoch's samples
            indices = torch.as_tensor(indices).reshape(-1)
            self.sampler.cursor += count
        self.teacher.observe(indices, losses)
        weights, component_weights = self._weights(losses, indices if not in_order else None, start, count)
        scores = losses.detach().float()
        scores = scores.cpu() if scores.device.type == "mps" else scores  # MPS has no float64 for the sums
        if self.components:  # a sample's score: the sum of its components
            sums = scores.sum(dim=0).double()
            self._component_sums = sums if self._component_sums is None else self._component_sums + sums
            scores = scores.sum(dim=1)
        self._loss_sum = self._loss_sum + scores.sum().double()
        self._seen += count
        if train_losses is None:
            train_losses = losses @ component_weights if self.components else losses
        return train_losses * weights

    def _weights(
        self, losses: torch.Tensor, indices: torch.Tensor | None, start: int, count: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's loss weights [B] and the component weights, on the losses' device: moved
        there once per pass (the pass's weights in the sampler's order), not once per batch.
        ``indices``: given by the caller (None: the sampler's next ``count`` from ``start``)."""
        key = (self.sampler.passes, losses.device, losses.dtype)
        if self._on_device != key:
            order_weights = self.teacher.loss_weights[self.sampler.order]
            self._pass_weights = order_weights.to(losses.device, losses.dtype)
            self._pass_component_weights = self.teacher.component_weights.to(losses.device, losses.dtype)
            self._on_device = key
        if indices is None:
            weights = self._pass_weights[start : start + count]
        else:
            weights = self.teacher.loss_weights[indices.cpu()].to(losses.device, losses.dtype)
        return weights, self._pass_component_weights

    @property
    def in_epoch(self) -> bool:
        """Between ``begin_epoch`` and ``end_epoch``."""
        return self._in_epoch

    @property
    def remaining(self) -> int:
        """Samples of this rank's pass over the epoch not recorded yet."""
        return self.sampler.order.numel() - self.sampler.cursor

    def end_epoch(self) -> None:
        """Merge the epoch's scores and sums across ranks (collectives: every rank calls it), once
        the epoch's batches are done, also where a loop leaves an epoch early: what was trained is
        what is counted. ``begin_epoch`` ends an epoch still open."""
        if not self._in_epoch:
            return
        self.teacher.end_epoch()
        self._in_epoch = False
        trained = min(self.sampler.cursor, self.sampler.real_count())  # padding trains twice, counts once
        loss_sum = self._loss_sum if torch.is_tensor(self._loss_sum) else torch.tensor(0.0, dtype=torch.float64)
        device = loss_sum.device
        components = (
            self._component_sums
            if self._component_sums is not None
            else torch.zeros(len(self.components), dtype=torch.float64, device=device)
        )
        counts = torch.tensor(
            [self._seen, self._scored, trained, self.teacher.skipped - self._skipped_before], dtype=torch.float64
        )
        totals = all_reduce_sums(torch.cat([loss_sum.reshape(1), counts.to(device), components.to(device)]))
        loss_sum, seen, scored, trained, nonfinite, *component_sums = totals.tolist()
        self.samples_backpropagated += int(trained)
        self.samples_forwarded += int(seen + scored)
        self._epoch_metrics = self._metrics(loss_sum, seen, component_sums, int(nonfinite))

    def scoring_pass(self, indices: torch.Tensor) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """Per-sample losses of this rank's share of ``indices`` from ``loss_fn(model, batch)``,
        under inference mode (no autograd bookkeeping) and in eval mode (dropout off), the
        model's mode restored after."""
        shard = shard_indices(indices, self.rank, self.world_size, shuffle=False)
        on_gpu = next(self.model.parameters()).device.type == "cuda"
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for batch_indices, batch in self._scoring_loader.batches(shard, self.scoring_batch_size(), on_gpu):
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
    def planned_batches(self, batch_size: int, drop_last: bool = False) -> list[int]:
        """Batches this rank draws in each epoch of the run, on the planned subsets
        (``drop_last``: the DataLoader's)."""
        return self.plan.batches(
            len(self.dataset), batch_size, self.world_size, drop_last=drop_last, even=not self.sampler.drop_last
        )

    def planned_steps(self, batch_size: int, drop_last: bool = False, accumulation: int = 1) -> int:
        """Optimiser steps this rank takes over the run on the planned subsets (``accumulation``:
        batches per optimiser step; a short last window still steps)."""
        return sum(self.plan.steps(self.planned_batches(batch_size, drop_last), accumulation))

    def step_progress(
        self, batch_size: int, drop_last: bool = False, accumulation: int = 1
    ) -> Callable[[int], Fraction]:
        """For a schedule of ``planned_steps(...)`` steps: step s -> the schedule's step at the
        training progress, in epochs, of s steps of this run (``Plan.step_progress``), e.g.
        ``LambdaLR(optimizer, lambda s: schedule(float(at(s))))``."""
        return self.plan.step_progress(self.plan.steps(self.planned_batches(batch_size, drop_last), accumulation))

    def metrics(self) -> dict[str, float]:
        """The latest epoch's selection under the names the engine logs (``metric_names``: each
        is defined there), over every rank once the epoch ended; inside an epoch this rank's so
        far (``train_loss`` then waits on the device)."""
        if not self._in_epoch:
            return dict(self._epoch_metrics)
        components = [] if self._component_sums is None else self._component_sums.tolist()
        return self._metrics(float(self._loss_sum), self._seen, components, math.nan)

    def _metrics(self, loss_sum: float, seen: float, component_sums: list[float], nonfinite: float) -> dict:
        last = self.teacher.history[-1] if self.teacher.history else None
        components = {}
        if self.components:
            weights = self.teacher.component_weights.tolist()
            sums = component_sums or [0.0] * len(self.components)
            for name, total, weight in zip(self.components, sums, weights):
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
            names.SAMPLES_NONFINITE: nonfinite,
            names.TRAIN_LOSS: loss_sum / seen if seen else math.nan,
            names.SUBSET_CHECKSUM: self._checksum,
            **components,
        }

    def state_dict(self) -> dict[str, Any]:
        """The selection's state: a Selector loaded from it draws the same subsets as the
        uninterrupted run. Between epochs it is the same on every rank. Inside an epoch it is this
        rank's (its losses so far, not merged yet, and where its pass stands): save each rank's,
        and after loading call ``begin_epoch`` of that epoch to go on from there."""
        inside = None
        if self._in_epoch:
            inside = {
                "epoch": self.epoch,
                "cursor": self.sampler.cursor,
                "seen": self._seen,
                "scored": self._scored,
                "skipped_before": self._skipped_before,
                "loss_sum": float(self._loss_sum),
                "component_sums": None if self._component_sums is None else self._component_sums.cpu(),
                "checksum": self._checksum,
            }
        return {
            "format": STATE_FORMAT,
            "teacher": self.teacher.state_dict(),
            "next_epoch": self.next_epoch,
            "samples_backpropagated": self.samples_backpropagated,
            "samples_forwarded": self.samples_forwarded,
            "inside_epoch": inside,
        }

    def load_state_dict(self, state: dict[str, Any], skip_trained: bool = False) -> None:
        """``skip_trained``: a state taken inside an epoch resumes with a pass that leaves out the
        samples this rank trained on before it (a loop that cannot skip those batches itself)."""
        check_state_format(state, "the selector's state")
        self._skip_trained = skip_trained
        self.teacher.load_state_dict(state["teacher"])
        self.next_epoch = state["next_epoch"]
        self.samples_backpropagated = state["samples_backpropagated"]
        self.samples_forwarded = state["samples_forwarded"]
        self._reset_sums()
        self._epoch_metrics, inside = {}, state["inside_epoch"]
        self._in_epoch = inside is not None
        if inside is not None:
            self.epoch, self.sampler.cursor, self._checksum = inside["epoch"], inside["cursor"], inside["checksum"]
            self._seen, self._scored, self._skipped_before = inside["seen"], inside["scored"], inside["skipped_before"]
            self._loss_sum = torch.tensor(inside["loss_sum"], dtype=torch.float64)
            self._component_sums = inside["component_sums"]
