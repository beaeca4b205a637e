"""AtteNT on a stream in a Lightning ``Trainer``: the train loader yields each pool, unscored, and
the callback picks the B items the step trains on from it, with the weights of that step:

    selection = attent.AtteNTStreamCallback(stream, selection=attent.SelectionConfig(preset="llm"),
                                            batch_size=16, epochs=3, loss_fn=per_sample_loss, collate_fn=collate)

    class Model(L.LightningModule):
        def train_dataloader(self):
            return selection.loader()                          # the pools, collated, unscored
        def training_step(self, batch, batch_idx):
            return per_sample_loss(self, batch).mean()         # the B items picked from the pool

    trainer = L.Trainer(max_steps=S, callbacks=[selection])

The selection is ``StreamSelector``'s (``attent.selection.stream``): ``pools()`` draws, ``choose``
scores and picks; this module only fits them to Lightning's hooks. The choices, from Lightning
2.6's source:

* **The pool is scored in ``on_train_batch_start``**, not in the loader: Lightning's fetcher
  (``_PrefetchDataFetcher``) reads one batch ahead of an iterable without a length, so a loader
  that scored its pools would score each with the weights of the step before. Drawing ahead is
  harmless (``pools()`` neither scores nor moves the state). The epoch loop hands the batch it
  fetched, converted by the precision plugin and moved to the device, to ``on_train_batch_start``
  and then, the same object, to ``training_step``: the callback scores that batch and replaces its
  contents in place by its B picked rows. So the batch must be a dict (any mutable mapping) or a
  list; a tuple or a tensor is refused.
* **The run is ``max_steps``** (Lightning needs it for an iterable): ``max_steps`` x
  ``accumulate_grad_batches`` training batches, the progress clock; the warm-up is
  ``warmup_epochs`` of ``epochs`` of them. Where the stream runs dry, the epoch ends and the
  callback stops the Trainer.
* **Checkpoints** hold every rank's ``StreamSelector`` state as of the batches trained (a pool
  Lightning fetched ahead and did not train is not in it): a run resumed from one reads the
  stream again up to the items of the trained pools and trains the uninterrupted run's batches.
  Lightning saves the loader's state only for a loader with ``state_dict``; ``loader()``'s has none.
* **Ranks**: under DDP each rank reads its share of the stream (``loaders.rank_share``), pools of
  one size on every rank, and every rank stops where one rank's share cannot fill a pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import default_collate

from ..selection import metric_names as names
from ..selection.config import SelectionConfig
from ..selection.distributed import is_distributed
from ..selection.scoring_pass import PerSampleLoss
from ..selection.stream import StreamSelector, check_streamable
from .loaders import rank_share


class AtteNTStreamCallback(pl.Callback):
    """AtteNT's choice of training samples from a stream, for a Lightning ``Trainer``.

    From each pool of ceil(B / r) items of the stream, the module (with the weights of the step
    that trains the pool) scores every item, and ``training_step`` receives the B picked ones.
    ``loader()`` exists from the Trainer's ``setup`` on: return it from ``train_dataloader``.

    Args:
        stream: the items, iterable again and again (an ``IterableDataset``, a streamed Hugging
            Face dataset); under DDP each rank reads its own share of it.
        selection: the settings (method attent or full; e.g. ``SelectionConfig(preset="llm")``).
        batch_size: B, the items of each training batch.
        epochs: the run's length in epochs, which ``warmup_epochs`` is a share of.
        seed: of Soft's and Random's draws.
        loss_fn: ``loss_fn(module, batch)`` -> the per-sample losses [P] of a pool batch, on the
            device, under the Trainer's precision; needed where the selection selects.
        collate_fn: batches a pool's items into a dict (or list) batch; default torch's.

    Raises:
        ValueError: settings a stream cannot follow, or a selecting run without ``loss_fn``; at the
            Trainer's ``setup``, no ``max_steps`` (or not the one the callback planned); at a
            batch, a batch that cannot be changed in place, or whose fields are not one row per
            item; at a resume, a checkpoint of another number of processes.
        RuntimeError: the callback used before ``Trainer.fit`` sets it up, or a resume from a
            checkpoint without its state.
    """

    def __init__(
        self,
        stream: Iterable,
        *,
        selection: SelectionConfig,
        batch_size: int,
        epochs: float = 1.0,
        seed: int = 0,
        loss_fn: PerSampleLoss | None = None,
        collate_fn: Callable[[list], Any] | None = None,
    ):
        check_streamable(selection)
        if selection.selects and loss_fn is None:
            raise ValueError("a stream's pools are scored by the module: pass AtteNTStreamCallback(loss_fn=...)")
        self.stream, self.selection, self.batch_size = stream, selection, batch_size
        self.epochs, self.seed, self.loss_fn = epochs, seed, loss_fn
        self.collate_fn = collate_fn or default_collate
        self.selector: StreamSelector | None = None  # built at setup, when max_steps and ranks are known
        self._rank, self._world_size = 0, 1

    def loader(self) -> Iterable:
        """The train loader: this rank's pools, each batched by ``collate_fn``, unscored.

        Returns:
            An iterable without a length; each iteration goes on at the batches trained so far.
        """
        return _Pools(self._built(), self.collate_fn)

    def _built(self) -> StreamSelector:
        if self.selector is None:
            raise RuntimeError(
                "AtteNTStreamCallback is set up by Trainer.fit: pass it in Trainer(callbacks=[...]) and "
                "call its loader() from train_dataloader()"
            )
        return self.selector

    # --- Lightning's side ------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.max_steps is None or trainer.max_steps < 1:
            raise ValueError(
                "AtteNTStreamCallback needs Trainer(max_steps=S): a stream has no length, and the ratio "
                "schedule follows the run's steps"
            )
        batches = trainer.max_steps * trainer.accumulate_grad_batches
        self._rank, self._world_size = trainer.global_rank, trainer.world_size
        if self.selector is None:
            self.selector = StreamSelector(
                rank_share(self.stream, trainer.global_rank, trainer.world_size),
                selection=self.selection,
                batch_size=self.batch_size,
                batches=batches,
                epochs=self.epochs,
                seed=self.seed,
                model=pl_module,
                loss_fn=self._scoring_loss,
                collate_fn=self.collate_fn,
                rank=trainer.global_rank,
            )
        elif self.selector.batches != batches:
            raise ValueError(
                f"this AtteNTStreamCallback planned {self.selector.batches} batches, the Trainer runs {batches}: "
                "build a new callback for another run length"
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step > 0 and self.selector.step == 0:
            raise RuntimeError(
                f"the Trainer resumes at step {trainer.global_step}, the stream at its start: resume from a "
                "checkpoint saved with this AtteNTStreamCallback (its state holds the place in the stream)"
            )

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int):
        if self.selection.selects and not isinstance(batch, MutableMapping | list):
            raise ValueError(
                f"AtteNTStreamCallback replaces each pool batch's contents by its picked items, and a "
                f"{type(batch).__name__} cannot be changed in place: return a dict (or list) batch from collate_fn"
            )
        size = self.selector.next_pool_size
        picked = self.selector.choose(batch)
        if len(picked) < size:
            keep_rows(batch, picked, size)
        metrics = {names.SELECTED_RATIO: self.selector.last_ratio, names.SAMPLES_SCORED: self.selector.samples_scored}
        pl_module.log_dict(
            {k: float(v) for k, v in metrics.items()}, on_step=True, on_epoch=False, batch_size=len(picked)
        )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.selector.exhausted:  # the stream ran dry: another epoch would find it dry again
            trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        # Lightning takes every rank's callback state, and rank 0's is written: it holds them all
        if self.selector is None:
            return {}
        states = [self.selector.state_dict()]
        if self._world_size > 1 and is_distributed():
            states = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(states, self.selector.state_dict())
        return {"ranks": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "ranks" not in state_dict:
            return
        states = state_dict["ranks"]
        if len(states) != self._world_size:
            raise ValueError(
                f"AtteNTStreamCallback: the checkpoint was written by {len(states)} process(es), each at its own "
                f"place in its share of the stream: resume it on as many (not {self._world_size})"
            )
        self._built().load_state_dict(states[self._rank])

    def _scoring_loss(self, module: pl.LightningModule, batch: Any) -> torch.Tensor:
        """``loss_fn`` on a pool batch Lightning moved to the device, under the Trainer's precision."""
        with module.trainer.precision_plugin.forward_context():
            return self.loss_fn(module, batch)


class _Pools:
    """This rank's pools, batched; no ``state_dict``, so Lightning saves no loader state of its own."""

    def __init__(self, selector: StreamSelector, collate_fn: Callable[[list], Any]):
        self.selector, self.collate_fn = selector, collate_fn

    def __iter__(self) -> Iterator[Any]:
        return (self.collate_fn(pool) for pool in self.selector.pools())


def keep_rows(batch: MutableMapping | list, picked: torch.Tensor, size: int) -> None:
    """Replaces the contents of ``batch``, a pool of ``size`` items, in place by its rows ``picked``.

    Args:
        batch: a dict (or any mutable mapping) or a list of fields: each a tensor of ``size`` rows,
            a list or tuple of ``size`` values (one per item), a mapping, list or tuple of such
            fields, or a value every item shares (a number, a string, None), kept as it is.
        picked: indices of the rows kept.
        size: the pool's items.

    Raises:
        ValueError: a tensor field of another number of rows (a collate_fn that packs items).
    """
    if isinstance(batch, MutableMapping):
        batch.update({key: _rows(value, picked, size, key) for key, value in batch.items()})
    else:
        batch[:] = [_rows(value, picked, size, f"[{i}]") for i, value in enumerate(batch)]


def _rows(value: Any, picked: torch.Tensor, size: int, name: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.dim() > 0 and value.shape[0] == size:
            return value[picked.to(value.device)]
        raise ValueError(
            f"AtteNTStreamCallback: the pool batch's field {name} has shape {tuple(value.shape)}, the pool "
            f"{size} items: collate_fn must give one row per item (no packing)"
        )
    if isinstance(value, Mapping):
        return type(value)({key: _rows(field, picked, size, key) for key, field in value.items()})
    if isinstance(value, list | tuple):
        if len(value) == size:  # a value per item
            return type(value)(value[i] for i in picked.tolist())
        if value and all(isinstance(field, torch.Tensor | Mapping | list | tuple) for field in value):
            return type(value)(_rows(field, picked, size, f"{name}[{i}]") for i, field in enumerate(value))
    return value
