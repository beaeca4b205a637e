"""AtteNT in any PyTorch loop, with no monkey-patching and the user's dataset items unchanged (the
loop, step by step: docs/integrations/pytorch.md). The Selector is the selection's one stateful
object: the score table, the plan, the method, the generator and the position in the run, saved by
one ``state_dict``. ``update`` pairs a batch's losses with the next B indices of the order the
sampler handed the DataLoader; nothing in it waits on the GPU (the losses stay on their device
until ``end_epoch`` merges them)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from . import observations as obs
from . import state as saved_state
from .config import SelectionConfig
from .distributed import agreed_checksum
from .epoch_metrics import epoch_metrics, merged_sums
from .methods import METHODS, Pool, stream_seed
from .plan import Plan, build_plan
from .records import SelectionRecord, selection_record
from .sampler import RecordingSampler, shard_indices
from .schedules import budget
from .scoring import ScoringPolicy
from .scoring_pass import PerSampleLoss, ScoreFn, ScoringPass
from .strategies import rank_correlation


class Selector:
    """AtteNT's choice of training samples, for a user's own PyTorch loop. Under torch.distributed
    every rank builds it with the same arguments, and every epoch's subset is checked to be the same.

    Args:
        dataset: the training set (wrapped, not copied; its items are handed out unchanged).
        selection: the settings, e.g. ``SelectionConfig(preset="vit")``.
        epochs: the run's length, which the plan follows.
        seed: of the selection's draws and shuffles.
        model: scores in a scoring pass (only where the plan runs one: ``vit`` does, ``llm`` not).
        loss_fn: ``loss_fn(model, batch)`` -> per-sample losses [B] (or [B, C]), for the pass.
        collate_fn: the scoring pass's (and ``loader()``'s); DataLoader's default if None.
        score_dataset: the scoring pass's items (default: the training set; e.g. unaugmented).
        score_batch_size: samples per scoring batch; default 2 (CPU) or 4 (GPU) training batches.
        score_num_workers: the scoring pass's DataLoader processes.
        score_multiprocessing_context: how they start (DataLoader's); None: its default.
        groups: class per sample (stratify, class_weight, the group baselines).
        components: the loss components' names, where losses are [B, C].
        rank: this process's rank (default: the process group's, else 0).
        world_size: the number of ranks (default: the process group's, else 1).
        shuffle: shuffle each epoch's shard (DistributedSampler's).
        drop_last: trim shards to the shortest instead of padding (DistributedSampler's).
        train_batch_size: a rank's training batch (``loader()`` sets it): sizes the scoring batch.

    Raises:
        ValueError: an empty training set, a ``score_dataset`` of another length, an impossible plan.
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
        collate_fn: Callable | None = None,
        score_dataset: Dataset | None = None,
        score_batch_size: int | None = None,
        score_num_workers: int = 0,
        score_multiprocessing_context: str | None = None,
        groups: torch.Tensor | None = None,
        components: Sequence[str] = (),
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        train_batch_size: int | None = None,
    ):
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if distributed else 1)
        self.dataset, self.selection, self.epochs, self.seed = dataset, selection, epochs, seed
        self.collate_fn, self.train_batch_size, self.components = collate_fn, train_batch_size, tuple(components)
        self.scoring = ScoringPass(
            dataset if score_dataset is None else score_dataset, len(dataset), model, loss_fn, collate_fn,
            score_batch_size, score_num_workers, score_multiprocessing_context,
        )  # fmt: skip
        n = self.num_samples = len(dataset)
        if n < 1:
            raise ValueError("the training set is empty: nothing to select from")
        # the run's plan: every epoch's share of the data, re-selection and scoring pass (it refuses
        # an impossible plan before training starts)
        self.plan: Plan = build_plan(selection, epochs)
        self._policy = ScoringPolicy.of(selection)
        self._method = METHODS[selection.method](
            selection, num_samples=n, epochs=epochs, groups=groups, components=len(self.components)
        )
        self._generator = torch.Generator().manual_seed(stream_seed(seed, selection.method, selection.strategy))
        self.sampler = RecordingSampler(
            self, self.rank, self.world_size, seed=seed, shuffle=shuffle, drop_last=drop_last
        )
        self._start(n)

    def _start(self, n: int) -> None:
        """The run's state before its first epoch (``state_dict`` saves it, ``load_state_dict`` restores it)."""
        # the score table: every sample's latest loss (NaN: never scored), per component, and
        # whether a training forward saw it since the last pick
        self.scores = torch.full((n,), float("nan"))
        self.component_scores = torch.full((n, max(len(self.components), 1)), float("nan"))
        self._trained = torch.zeros(n, dtype=torch.bool)
        self.subset, self.loss_weights = torch.arange(n), torch.ones(n)
        self.history: list[SelectionRecord] = []  # every re-selection and return to all data
        self.seconds = {"scoring": 0.0, "selection": 0.0}  # cumulative, for the run's time split
        self._epoch = -1  # the epoch prepared last
        self.next_epoch = 0  # the epoch a (resumed) loop starts from
        self.samples_backpropagated = 0  # distinct samples trained on (padding excluded), over epochs and ranks
        self.samples_forwarded = 0  # training and scoring forwards, summed over epochs and ranks
        self._skipped = 0  # this rank's non-finite losses left out of the table (nonfinite: skip)
        self._pending: list[obs.Observation] = []  # this rank's losses not merged yet, on their device
        self._score_agreement = math.nan  # of the latest scoring pass
        self._epoch_metrics: dict[str, float] = {}
        self._checksum = math.nan
        self._in_epoch = self._skip_trained = False
        self._reset_sums()

    @property
    def epoch(self) -> int:
        """The epoch prepared last (-1 before the first): a scoring ``loss_fn`` may read it."""
        return self._epoch

    @property
    def component_weights(self) -> torch.Tensor:
        """[C] weight of each loss component in the training loss (mean 1; all 1 but for the group baselines)."""
        return self._method.component_weights()

    @property
    def in_epoch(self) -> bool:
        """Between ``begin_epoch`` and ``end_epoch``."""
        return self._in_epoch

    @property
    def remaining(self) -> int:
        """Samples of this rank's pass over the epoch not recorded yet."""
        return self.sampler.order.numel() - self.sampler.cursor

    def needs_scoring(self, epoch: int) -> bool:
        """Whether ``begin_epoch(epoch)`` runs a scoring pass (the plan's, where still due)."""
        return epoch != self._epoch and self._policy.pass_due(self.plan[epoch], self.scores)

    def _reset_sums(self) -> None:  # this rank's sums over the epoch (device tensors once a batch is recorded)
        self._loss_sum, self._component_sums, self._finite, self._counted = 0.0, None, None, 0
        self._seen, self._scored, self._skipped_before, self._steps, self._step_start = 0, 0, self._skipped, 0, 0

    def loader(self, batch_size: int, **kwargs: Any) -> DataLoader:
        """``DataLoader(dataset, batch_size, sampler=selector.sampler, **kwargs)``.

        Args:
            batch_size: samples per training batch on this rank (it also sizes the scoring batch).
            **kwargs: DataLoader's other arguments; ``collate_fn`` defaults to the Selector's.

        Raises:
            ValueError: a ``sampler`` or ``shuffle`` is given (the Selector's sampler does both).
        """
        if "sampler" in kwargs or kwargs.get("shuffle"):
            raise ValueError("the selector's sampler chooses and shuffles: pass neither sampler nor shuffle")
        kwargs.setdefault("collate_fn", self.collate_fn)
        self.train_batch_size = batch_size
        return DataLoader(self.dataset, batch_size=batch_size, sampler=self.sampler, **kwargs)

    # --- the epoch boundary --------------------------------------------------------------------
    def begin_epoch(self, epoch: int, score_fn: ScoreFn | None = None) -> torch.Tensor:
        """Prepare epoch ``epoch`` as planned: a scoring pass and a re-selection where due, all
        data again, or the pick kept. Every rank calls it (it runs collectives); an epoch still
        open is ended first. After ``load_state_dict`` of a state taken inside epoch e,
        ``begin_epoch(e)`` goes on where the state was taken.

        Args:
            epoch: the epoch, counted from 0.
            score_fn: overrides the scoring pass built from ``model`` and ``loss_fn``:
                ``score_fn(indices)`` yields (indices, losses) for this rank's share of ``indices``.

        Returns:
            The epoch's subset (global indices, identical on every rank).

        Raises:
            ValueError: ``epoch`` outside the run, or a scoring pass due with nothing to score with.
            RuntimeError: ranks chose different subsets.
        """
        if self._in_epoch and epoch == self._epoch:  # a state restored inside this epoch
            self.sampler.resume(self._skip_trained)
            return self.subset
        self.end_epoch()
        self._reset_sums()
        if epoch != self._epoch:  # the epoch prepared last (a state restored after it) is kept
            self._prepare(epoch, score_fn)
        self._checksum = agreed_checksum(self.subset)  # raises where ranks chose different subsets
        self.sampler.rewind()
        self.next_epoch, self._in_epoch = epoch + 1, True
        return self.subset

    def _prepare(self, epoch: int, score_fn: ScoreFn | None) -> None:
        """The plan's decision for ``epoch``: a scoring pass where due, then a pick or all data."""
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch {epoch} lies outside the run's {self.epochs} epochs")
        self._merge()
        due = self.needs_scoring(epoch)
        self._epoch, planned = epoch, self.plan[epoch]
        if due:
            if score_fn is None and not self.scoring.ready:
                raise ValueError(
                    f"epoch {epoch} needs a scoring pass (selection {self.plan.label}): "
                    "pass model= and loss_fn= to Selector, or score_fn= to begin_epoch"
                )
            self._score(score_fn or self.scoring_pass)
        previous = self.history[-1].indices if self.history else None
        record, agreement, start = (self.selection, epoch), self._score_agreement, time.perf_counter()
        if planned.selects:
            pool = Pool(self.scores, self.component_scores, self._generator)
            k = None if planned.ratio is None else budget(self.num_samples, planned.ratio)
            pick = self._method.pick(pool, epoch, k)
            self.subset = pick.subset
            self.loss_weights = torch.ones(self.num_samples) if pick.loss_weights is None else pick.loss_weights
            self._trained.zero_()  # a new interval begins
            self.seconds["selection"] += time.perf_counter() - start
            ratio = self.subset.numel() / self.num_samples if planned.ratio is None else planned.ratio
            record += (ratio, time.perf_counter() - start, agreement)
            self.history.append(selection_record(self.scores, self.subset, previous, *record))
            self._score_agreement = math.nan  # belonged to this pick's scoring pass
        elif planned.all_data and self.subset.numel() < self.num_samples:
            # back to all data, unweighted: the final anneal share, InfoBatch's last epochs, a cycle's end
            previous, self.subset = self.subset, torch.arange(self.num_samples)
            self.loss_weights = torch.ones(self.num_samples)
            self.history.append(selection_record(self.scores, self.subset, previous, *record, 1.0, 0.0, agreement))

    def _score(self, score_fn: ScoreFn) -> None:
        """A scoring pass over the samples the scoring policy has due, this rank's share of them."""
        start = time.perf_counter()
        training_losses, trained = self.scores.clone(), self._trained.clone()
        indices = self._policy.pass_indices(self.scores, self._trained, self._generator)
        for batch_indices, losses in score_fn(indices):
            self._pending.append(obs.observation(batch_indices, losses, self.component_scores.shape[1]))
        self._merge(from_pass=True)
        both = indices[trained[indices] & ~torch.isnan(training_losses[indices])]
        self._score_agreement = rank_correlation(training_losses[both], self.scores[both])
        self.seconds["scoring"] += time.perf_counter() - start

    def _merge(self, from_pass: bool = False) -> None:
        """Every rank's pending observations into the score table (a collective under DDP)."""
        pending, self._pending = self._pending, []
        nonfinite = (self.selection.nonfinite, obs.origin(from_pass, self._steps, self._epoch))
        (indices, losses), skipped = obs.merged(pending, self.component_scores.shape[1], self.num_samples, *nonfinite)
        self._skipped += skipped
        self._trained[indices] |= not from_pass
        if self._policy.writes(from_pass, self.subset.numel() == self.num_samples):
            self.component_scores[indices], self.scores[indices] = losses, losses.sum(dim=1)

    def scoring_pass(self, indices: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The default ``score_fn``: (indices, per-sample losses) of this rank's share of ``indices``."""
        shard = shard_indices(indices, self.rank, self.world_size, shuffle=False)
        for batch_indices, losses in self.scoring.batches(shard, self.scoring.batch_size_for(self.train_batch_size)):
            self._scored += losses.shape[0]
            yield batch_indices, losses

    # --- the steps -----------------------------------------------------------------------------
    def update(
        self, losses: torch.Tensor, indices: torch.Tensor | None = None, *, train_losses: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Record a batch's per-sample losses as the samples' scores; the losses to train on.

        Args:
            losses: one loss per sample, [B] (or [B, C] per component), with their graph.
            indices: the batch's positions in the dataset; default the next B of the sampler's order.
            train_losses: what is trained on [B] where it is not the score (e.g. summed token losses,
                the mean the score); default the losses, components summed with their weights.

        Returns:
            Per-sample training losses [B] times each sample's loss weight, to reduce (``.mean()``,
            or a sum over the loop's own denominator under gradient accumulation) and back-propagate.

        Raises:
            RuntimeError: outside an epoch, or more losses than the epoch's pass has samples left.
            ValueError: losses not of one per sample.
        """
        if not self._in_epoch:
            raise RuntimeError("update() outside an epoch: call begin_epoch(epoch) before the epoch's batches")
        obs.check_shape(losses, self.components)
        given, count, start = indices, losses.shape[0], self.sampler.cursor  # given: None, the sampler's next B
        indices = self.sampler.take(count, given)
        self._pending.append(obs.observation(indices, losses, self.component_scores.shape[1]))
        ordered = None if given is None else indices
        weights, parts = self.sampler.weights_of(self.loss_weights, self.component_weights, losses, start, ordered)
        scores = losses.detach().float()
        scores = scores.cpu() if scores.device.type == "mps" else scores  # MPS has no float64 for the sums
        rows = scores.reshape(count, self.component_scores.shape[1])
        finite = torch.isfinite(rows).all(dim=1)  # a NaN or inf loss is no part of the epoch's means
        kept = torch.where(finite.unsqueeze(1), rows, 0.0)
        if self.components:  # a sample's score: the sum of its components
            sums = kept.sum(dim=0).double()
            self._component_sums = sums if self._component_sums is None else self._component_sums + sums
        self._loss_sum = self._loss_sum + (kept.sum(dim=1) if self.components else kept[:, 0]).sum().double()
        self._seen, self._counted = self._seen + count, self._counted + finite.sum()
        if train_losses is None:
            train_losses = losses @ parts if self.components else losses
        trained = train_losses * weights
        finite = finite.all() & torch.isfinite(trained.detach()).all()  # on the device: nothing waits
        self._finite = finite if self._finite is None else self._finite & finite
        return trained

    def step_finite(self) -> bool:
        """Whether the losses recorded since the last call (an optimiser step's) are finite on
        every rank: call it after the backward and before ``optimizer.step()``. It waits for the
        device once, and under torch.distributed agrees with the other ranks (a collective).

        Returns:
            True where the step may go on; False where ``selection.nonfinite`` is "skip" and a loss
            was NaN or inf: skip ``optimizer.step()`` (its samples keep their scores).

        Raises:
            ValueError: a NaN or inf loss under ``nonfinite: raise``, naming the samples and the step.
        """
        finite, self._finite = self._finite, None
        start, self._step_start = self._step_start, len(self._pending)
        self._steps += 1
        pieces = (self._pending[start:], self._steps, self._epoch)
        return obs.step_may_go_on(finite, self.selection.nonfinite, obs.nonfinite_message, *pieces)

    def end_epoch(self) -> None:
        """Merge the epoch's scores and sums across ranks (collectives: every rank calls it), once
        the epoch's batches are done, also where a loop leaves an epoch early: what was trained is
        what is counted. ``begin_epoch`` ends an epoch still open.

        Raises:
            ValueError: a NaN or inf loss recorded under ``nonfinite: raise`` (where ``step_finite``
                was not called), or a sample index outside the training set.
        """
        if not self._in_epoch:
            return
        self._merge()
        self._in_epoch = False
        loss_sum, seen, counted, scored, trained, nonfinite, component_sums = merged_sums(self)
        self.samples_backpropagated += int(trained)
        self.samples_forwarded += int(seen + scored)
        self._epoch_metrics = epoch_metrics(self, loss_sum, counted, component_sums, int(nonfinite))

    # --- what a loop needs around it -------------------------------------------------------------
    def planned_steps(self, batch_size: int, drop_last: bool = False, accumulation: int = 1) -> int:
        """Optimiser steps this rank takes over the run on the planned subsets (``accumulation``:
        batches per optimiser step; a short last window still steps)."""
        return sum(self.plan.steps(self._batches(batch_size, drop_last), accumulation))

    def step_progress(
        self, batch_size: int, drop_last: bool = False, accumulation: int = 1
    ) -> Callable[[int], Fraction]:
        """For a schedule of ``planned_steps(...)`` steps: step s -> the training progress, in
        epochs, of s steps of this run (``Plan.step_progress``), e.g.
        ``LambdaLR(optimizer, lambda s: schedule(float(at(s))))``."""
        return self.plan.step_progress(self.plan.steps(self._batches(batch_size, drop_last), accumulation))

    def _batches(self, batch_size: int, drop_last: bool) -> list[int]:
        """This rank's batches in each epoch on the planned subsets (``drop_last``: the DataLoader's)."""
        even = not self.sampler.drop_last
        return self.plan.batches(self.num_samples, batch_size, self.world_size, drop_last=drop_last, even=even)

    def metrics(self) -> dict[str, float]:
        """The latest epoch's selection under the names the engine logs (``metric_names``), over
        every rank once the epoch ended; inside an epoch this rank's so far (``train_loss`` then
        waits on the device)."""
        if not self._in_epoch:
            return dict(self._epoch_metrics)
        components = [] if self._component_sums is None else self._component_sums.tolist()
        return epoch_metrics(self, float(self._loss_sum), float(self._counted), components, math.nan)

    # --- checkpointing (the state's layout: ``state``) -------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The selection's state: a Selector loaded from it draws the same subsets as the
        uninterrupted run. Between epochs it is the same on every rank. Inside an epoch it is this
        rank's (its losses so far, not merged yet, and where its pass stands): save each rank's,
        and after loading call ``begin_epoch`` of that epoch to go on from there."""
        return saved_state.saved(self)

    def load_state_dict(self, state: dict[str, Any], skip_trained: bool = False) -> None:
        """Restore a ``state_dict``.

        Args:
            state: a ``state_dict()`` of a Selector of the same training set.
            skip_trained: a state taken inside an epoch resumes with a pass that leaves out the
                samples this rank trained on before it (a loop that cannot skip those batches itself).

        Raises:
            ValueError: a state of another format or another training set's size.
        """
        saved_state.restore(self, state, skip_trained)
