"""The recipe's selection where the training set is a stream (``stream:``): Ray Data's rows of this
rank's shard (``ray.train.get_dataset_shard``), read pass by pass, each pass an epoch, selected
pool by pool by ``attent.StreamSelector`` (``selection.stream``: what is scored and picked).

``StreamEpochs`` stands where the map-style run has its ``Selector``, with the part of its API the
recipe calls: ``loader``, ``begin_epoch``, ``update``, ``step_finite``, ``end_epoch``, ``metrics``,
``seconds``, ``plan``, ``history`` (none: no subsets), ``state_dict``. It keeps the epoch's sums
the recipe logs; the pools, their scoring and picks are the StreamSelector's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..experiment.schema import ExperimentConfig
from ..selection import metric_names as names
from ..selection.distributed import all_reduce_sums
from ..selection.stream import StreamSelector


class StreamRows:
    """A Ray Data shard's rows as the task's training items, read afresh at each ``iter()``
    (one pass: Ray Data runs the dataset again), numbered by their place in the pass.

    Args:
        shard: ``ray.train.get_dataset_shard(...)`` (anything with ``iter_rows()``).
        rows: the rows of one pass over the whole dataset (every rank's); ``len()``.
        to_item: ``task.stream_item(row, index)``.
    """

    def __init__(self, shard, rows: int, to_item: Callable[[dict[str, Any], int], Any]):
        self.shard, self.rows, self.to_item = shard, rows, to_item

    def __len__(self) -> int:
        return self.rows

    def __iter__(self) -> Iterator[Any]:
        for index, row in enumerate(self.shard.iter_rows()):
            yield self.to_item(row, index)


class TaskStream:
    """The task's own training set read as a stream (``stream.format: task``): each pass in an
    order drawn by the run's seed and the pass (``set_epoch``, which the StreamSelector calls),
    this rank's every ``world_size``-th item of it, the shards equal (the order's tail left out).

    Args:
        dataset: the task's map-style training set.
        seed: the run's.
        rank: this process's rank.
        world_size: the ranks.
    """

    def __init__(self, dataset, seed: int, rank: int, world_size: int):
        self.dataset, self.seed, self.rank, self.world_size = dataset, seed, rank, world_size
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """The pass whose order the next ``iter()`` reads."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        order = torch.randperm(
            len(self.dataset), generator=torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        )
        for index in order[: len(order) - len(order) % self.world_size][self.rank :: self.world_size].tolist():
            yield self.dataset[index]


def stream_rows(cfg: ExperimentConfig, ctx, task, shard: tuple[Any, int] | None) -> StreamRows | TaskStream:
    """The stream a run's ranks read: Ray Data's shard (``shard``: it and the rows of a pass over
    every shard) as the task's items, or the task's own training set (``stream.format: task``)."""
    if not cfg.stream.ray_data:
        return TaskStream(task.train_dataset(), cfg.seed, ctx.rank, ctx.world_size)
    return StreamRows(*shard, task.stream_item)


class StreamPlan:
    """What the engine reads of a run's plan where the run is a stream's: the learning rate's
    progress (the epoch plan's: a pass is an epoch), and a label and summary that say the pools.

    Args:
        plan: the run's epoch plan (``cfg.plan``).
        passes: each pass's pool sizes (``StreamSelector.passes``).
        batch_size: B.
    """

    def __init__(self, plan, passes: list[list[int]], batch_size: int):
        self.plan, self.passes, self.batch_size = plan, passes, batch_size

    def progress(self, epoch: int, within: float) -> float:
        """Training progress ``within`` (a share of) pass ``epoch``: the epoch plan's."""
        return self.plan.progress(epoch, within)

    @property
    def label(self) -> str:
        """The epoch plan's label, said to be a stream's."""
        return f"{self.plan.label}, from a stream's pools"

    def summary(self) -> dict[str, Any]:
        """The label and, per pass, its pools: their number, sizes and selected ratio."""
        return {
            "label": self.label,
            "epochs": len(self.passes),
            "batch_size": self.batch_size,
            "passes": [
                {
                    "epoch": e,
                    "pools": len(sizes),
                    "pool_sizes": sizes,
                    "ratio": self.batch_size * len(sizes) / sum(sizes),
                }
                for e, sizes in enumerate(self.passes)
                if sizes
            ],
        }


class _PassLoader:
    """The current pass's training batches, as the recipe reads a loader: ``len()`` the batches
    left in the pass, ``iter()`` them (the StreamSelector's pools, picked; their scoring timed by
    ``StreamEpochs._timed``)."""

    def __init__(self, epochs: StreamEpochs):
        self.epochs = epochs

    def __len__(self) -> int:
        pools = self.epochs.pools
        return len(pools.pass_pools()) - pools.pass_step

    def __iter__(self) -> Iterator[Any]:
        epochs = self.epochs
        epochs.batches = iter(epochs.pools)  # one pass of the stream's generator
        yield from epochs.batches


class StreamEpochs:
    """A stream run's selection, epoch by epoch (module docstring).

    Args:
        rows: this rank's shard of the stream (``StreamRows``), read once per epoch.
        shard_rows: the rows of one pass over this rank's shard.
        cfg: the run (its selection, batch size, epochs, seed).
        model: scores the pools (the raw model).
        loss_fn: ``loss_fn(model, batch)`` -> per-sample scores (the recipe's scoring loss).
        collate_fn: the task's loader collate.
        rank: this process's rank.
    """

    def __init__(
        self,
        rows: Iterable,
        shard_rows: int,
        cfg: ExperimentConfig,
        *,
        model: torch.nn.Module,
        loss_fn: Callable,
        collate_fn: Callable,
        rank: int,
    ):
        self.pools = StreamSelector(
            rows,
            selection=cfg.selection,
            batch_size=cfg.train.batch_size,
            samples=shard_rows,
            epochs=cfg.train.epochs,
            seed=cfg.seed,
            model=model,
            loss_fn=self._timed(loss_fn),
            collate_fn=collate_fn,
            rank=rank,
        )
        self.plan = StreamPlan(cfg.plan, self.pools.passes, cfg.train.batch_size)  # progress, label, summary
        if not all(self.pools.passes):
            size = self.pools.next_pool_size
            raise ValueError(
                f"a worker's shard of {shard_rows} rows cannot fill one pool of {size}: fewer workers, a smaller "
                "train.batch_size or a larger stream"
            )
        self.history: list = []  # no subsets: every pool is its own pick
        self.seconds = {"scoring": 0.0, "selection": 0.0}
        self.samples_backpropagated = self.samples_forwarded = 0
        self.batches: Iterator | None = None
        self._epoch, self._metrics = 0, {}
        self._sums = torch.zeros(3, dtype=torch.float64)  # loss sum, finite losses, losses seen
        self._inside: tuple | None = None  # restored inside an epoch: (sums, scored and pools before it)

    def _timed(self, loss_fn: Callable) -> Callable:
        """``loss_fn`` with its time counted as scoring, up to its scores on the host (where the
        pick reads them: the wait for the device is the forward's)."""

        def scores(model: torch.nn.Module, batch: Any) -> torch.Tensor:
            started = time.perf_counter()
            losses = loss_fn(model, batch).detach().float().cpu()
            self.seconds["scoring"] += time.perf_counter() - started
            return losses

        return scores

    @property
    def epoch(self) -> int:
        """The epoch open or last opened (its scoring round)."""
        return self._epoch

    def loader(self, batch_size: int, **_: Any) -> _PassLoader:
        """The current pass's batches (``batch_size`` is the run's; loader options do not apply:
        Ray Data reads the rows)."""
        return _PassLoader(self)

    def begin_epoch(self, epoch: int) -> None:
        """Opens the epoch's pass (nothing is scored ahead: each pool when its batch is drawn)."""
        self._epoch = epoch
        self._sums = torch.zeros(3, dtype=torch.float64)
        self._scored_before, self._first_pool = self.pools.samples_scored, self.pools.pass_step
        if self._inside is not None:  # restored inside this epoch: its sums and start as they were
            sums, self._scored_before, self._first_pool = self._inside
            self._sums, self._inside = torch.tensor(sums, dtype=torch.float64), None
        self._pass = self.pools.pass_pools()

    def update(self, losses: torch.Tensor, train_losses: torch.Tensor | None = None) -> torch.Tensor:
        """A batch's per-sample losses [B]: counted in the epoch's train loss, checked at the step
        (``step_finite``); the losses to train on."""
        rows = losses.detach().float().reshape(losses.shape[0], -1).sum(1)
        finite = torch.isfinite(rows)
        kept = torch.where(finite, rows, 0.0)
        self._sums += torch.stack([kept.sum(), finite.sum(), torch.tensor(rows.numel())]).double().cpu()
        trained = losses if train_losses is None else train_losses
        self.pools.record_loss(trained)
        return trained

    def step_finite(self) -> bool:
        """Whether the step's losses are finite on every rank (a collective): the StreamSelector's
        rule of ``selection.nonfinite``, a NaN or inf stopping the run before the step uses it."""
        return self.pools.step_finite()

    def end_epoch(self) -> None:
        """The pass ended (its generator run out) and the epoch's sums over every rank (a collective)."""
        if self.batches is not None and next(self.batches, None) is not None:
            raise RuntimeError("the recipe left a batch of the stream's pass untrained")
        self.batches = None
        scored = self.pools.samples_scored - self._scored_before
        drawn = sum(self._pass[self._first_pool :])
        totals = all_reduce_sums(torch.cat([self._sums, torch.tensor([scored, drawn], dtype=torch.float64)]))
        loss_sum, finite, seen, scored, drawn = totals.tolist()
        self.samples_backpropagated += int(seen)
        self.samples_forwarded += int(seen + scored)
        self._metrics = {
            names.EPOCH: self._epoch + 1,
            names.SELECTED_RATIO: seen / drawn if drawn else math.nan,
            names.SELECTED: seen,
            names.SELECTION_HARDNESS: math.nan,
            names.SELECTION_OVERLAP: math.nan,
            names.SCORE_AGREEMENT: math.nan,
            names.SAMPLES_BACKPROPAGATED: self.samples_backpropagated,
            names.SAMPLES_FORWARDED: self.samples_forwarded,
            names.SAMPLES_SCORED: scored,
            names.SAMPLES_NONFINITE: seen - finite,
            names.TRAIN_LOSS: loss_sum / finite if finite else math.nan,
            names.SUBSET_CHECKSUM: math.nan,  # no subset: pools of a stream
        }

    def metrics(self) -> dict[str, float]:
        """The latest epoch's row over every rank; inside an epoch this rank's train loss so far."""
        if self.batches is None:
            return dict(self._metrics)
        loss_sum, finite, _ = self._sums.tolist()
        return {**self._metrics, names.TRAIN_LOSS: loss_sum / finite if finite else math.nan}

    def state_dict(self) -> dict[str, Any]:
        """The stream's position and the run's sample counts; inside an epoch (each rank saves its
        own) also the epoch's sums so far."""
        inside = None if self.batches is None else (self._sums.tolist(), self._scored_before, self._first_pool)
        return {
            "stream": self.pools.state_dict(),
            "samples_backpropagated": self.samples_backpropagated,
            "samples_forwarded": self.samples_forwarded,
            "inside_epoch": inside,
        }

    def load_state_dict(self, state: dict[str, Any], skip_trained: bool = False) -> None:
        """Restores a ``state_dict``; taken inside an epoch, the pass goes on after the rows drawn
        (``skip_trained`` is the map-style Selector's argument: a stream always skips them)."""
        self.pools.load_state_dict(state["stream"])
        self.samples_backpropagated = state["samples_backpropagated"]
        self.samples_forwarded = state["samples_forwarded"]
        self._inside = state["inside_epoch"]
