"""AtteNT in a Lightning ``Trainer``: one callback, two lines in the LightningModule, two Trainer
settings (three under DDP):

    selection = attent.AtteNTCallback(train_set, selection=attent.SelectionConfig(preset="vit"), seed=0,
                                      loss_fn=per_sample_loss)   # loss_fn(module, batch) -> [B]

    class Model(L.LightningModule):
        def training_step(self, batch, batch_idx):
            return selection.update(per_sample_loss(self, batch)).mean()   # scores recorded, weights applied
        def train_dataloader(self):
            return selection.loader(batch_size=64)                   # DataLoader(train_set, sampler=selection.sampler)

    trainer = L.Trainer(max_epochs=E, callbacks=[selection], reload_dataloaders_every_n_epochs=1)
                        # under DDP also use_distributed_sampler=False

The selection is ``Selector``'s (``attent.selection.selector``), through its public API; this
module only fits it to Lightning's hooks. The choices, from Lightning 2.6's source:

* **Losses reach the callback through ``update()``** in ``training_step``, whose return value is
  the loss to back-propagate. The loss weights must act before the backward, and no callback hook
  can change the loss Lightning back-propagates (``on_before_backward`` sees it, ``on_train_batch_end``
  comes after the step). ``update`` is the only way in: the callback never reads training_step's
  outputs, so nothing is counted twice.
* **Each epoch's subset is chosen before Lightning loads that epoch's train loader**, which
  measures the loader's length (and, with worker processes, starts drawing from the sampler)
  before ``on_train_epoch_start``. So the subset of epoch e is chosen at the end of epoch e-1
  (``on_train_epoch_end``, its scores merged, with the weights epoch e starts from), the first
  epoch's at ``on_fit_start`` (a checkpoint's weights and this callback's state restored by then).
  Where that first choice needs a scoring pass, the callback asks the module (or DataModule) for
  its train loader once more, to size the pass from the training batch.
* **``reload_dataloaders_every_n_epochs=1``**: otherwise Lightning reads the loader's length once
  per fit, and an epoch is cut to the first epoch's batch count (measured: subsets of 8, 16, 24
  samples trained 8, 8, 8). The sampler re-reads the subset at every pass, so ``train_dataloader``
  may return the same DataLoader each time; Lightning only needs to ask again.
* **``use_distributed_sampler=False`` under DDP**: the sampler already gives each rank its shard,
  and Lightning would wrap it in a DistributedSampler (shards of shards, batches out of the order
  ``update`` pairs losses with).
* **Checkpoints** hold the selection as of the latest epoch end, taken at the epoch's last batch,
  so that a checkpoint saved after validation and one saved at ``on_train_epoch_end`` hold the
  same. A run resumed from one re-runs the next epoch's scoring pass on the restored weights and
  draws the subsets the uninterrupted run draws. A checkpoint from inside an epoch resumes into
  that epoch's subset again, without the scores of the batches trained before it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader, Dataset

from ..selection import metric_names as names
from ..selection.config import SelectionConfig
from ..selection.sampler import RecordingSampler
from ..selection.scoring_pass import PerSampleLoss
from ..selection.selector import Selector
from .loaders import draws_from

# the selection metrics logged at each epoch end, under the engine's names (equal on every rank)
LOGGED_METRICS = (
    names.SELECTED_RATIO,
    names.SELECTED,
    names.SELECTION_HARDNESS,
    names.SELECTION_OVERLAP,
    names.SAMPLES_BACKPROPAGATED,
    names.SUBSET_CHECKSUM,
)


class AtteNTCallback(pl.Callback):
    """AtteNT's choice of training samples, for a Lightning ``Trainer``.

    The arguments are ``Selector``'s; the run's length is the Trainer's ``max_epochs``, ranks and
    world size are the Trainer's. The sampler, ``loader``, ``update`` and ``planned_steps`` exist
    from the Trainer's ``setup`` on: use them in ``train_dataloader``, ``training_step`` and
    ``configure_optimizers``.

    Args:
        dataset: the training set (the one positional argument), wrapped, not copied.
        selection: the selection's settings (e.g. ``SelectionConfig(preset="vit")``).
        seed: of the selection's draws and shuffles.
        loss_fn: ``loss_fn(module, batch)``, the per-sample loss [B] that ``training_step`` hands
            to ``update``; needed where the selection runs scoring passes (the ``vit`` preset
            does, ``llm`` and ``full`` do not), which give it batches moved to the device as
            training batches are, under the Trainer's precision.
        collate_fn: the scoring pass's and ``loader()``'s; None: DataLoader's default.
        score_dataset: the scoring pass's items (e.g. without augmentation); None: ``dataset``.
        score_batch_size: samples per scoring-pass batch; None: from ``loader()``'s batch.
        groups: the class of each sample (``stratify``, ``class_weight``).
        shuffle: the sampler's, as DistributedSampler's.
        drop_last: the sampler's, as DistributedSampler's.

    Raises:
        ValueError: at the Trainer's ``setup`` or the training's start, a setting the selection
            cannot follow, in one line naming the fix: ``reload_dataloaders_every_n_epochs`` other
            than 1, no ``max_epochs`` (or not the one the callback planned), Lightning's
            distributed sampler under DDP, a train loader that does not draw from ``sampler``,
            a scoring pass without ``loss_fn``.
        RuntimeError: the callback used before ``Trainer.fit`` sets it up, or a resume from a
            checkpoint without its state (a weights-only one).
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        selection: SelectionConfig,
        seed: int = 0,
        loss_fn: PerSampleLoss | None = None,
        collate_fn: Callable | None = None,  # the scoring pass's and loader()'s
        score_dataset: Dataset | None = None,  # the scoring pass's items (e.g. without augmentation)
        score_batch_size: int | None = None,  # samples per scoring-pass batch; None: from loader()'s batch
        groups: torch.Tensor | None = None,  # class per sample: stratify, class_weight
        shuffle: bool = True,
        drop_last: bool = False,
    ):  # the sampler's, as DistributedSampler's
        self.dataset, self.selection, self.seed, self.loss_fn = dataset, selection, seed, loss_fn
        self.selector_kwargs = dict(
            collate_fn=collate_fn,
            score_dataset=score_dataset,
            score_batch_size=score_batch_size,
            groups=groups,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        self.selector: Selector | None = None  # built at setup, when epochs and ranks are known
        self.prepared_epoch: int | None = None  # the epoch whose subset the sampler holds
        self._epoch_end_state: dict | None = None  # the selector's state at the latest epoch end
        self._epoch_end_metrics: dict[str, float] = {}  # and its metrics
        self._accumulation = 1  # the Trainer's accumulate_grad_batches

    # --- the user's side -------------------------------------------------------------------------
    @property
    def sampler(self) -> RecordingSampler:
        return self._built().sampler

    def loader(self, batch_size: int, **kwargs) -> DataLoader:
        """``DataLoader(dataset, batch_size, sampler=callback.sampler, **kwargs)``."""
        return self._built().loader(batch_size, **kwargs)

    def update(self, losses: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        """``Selector.update``: record the batch's per-sample losses as scores, return the
        per-sample training losses weighed by the selection [B]; return their ``.mean()`` from
        ``training_step``."""
        return self._built().update(losses, indices)

    def planned_steps(self, batch_size: int, drop_last: bool = False, accumulation: int | None = None) -> int:
        """Optimiser steps of the run on the planned subsets, for a step-based LR schedule in
        ``configure_optimizers`` (``trainer.estimated_stepping_batches`` knows only the first
        epoch's loader). ``accumulation``: the Trainer's ``accumulate_grad_batches`` unless given."""
        return self._built().planned_steps(batch_size, drop_last, accumulation or self._accumulation)

    def step_progress(self, batch_size: int, drop_last: bool = False, accumulation: int | None = None):
        """``Selector.step_progress``: for a step-based schedule of ``planned_steps`` steps, the step
        at which it reads the training progress, in epochs, of each optimiser step."""
        return self._built().step_progress(batch_size, drop_last, accumulation or self._accumulation)

    def metrics(self) -> dict[str, float]:
        """``Selector.metrics`` of the latest epoch ended (what was logged; empty before the first):
        ``selected_ratio``, ``selection_hardness``, ``samples_backpropagated``, ``subset_checksum``,
        ``train_loss`` (all ranks), ... In ``on_train_epoch_end`` of the LightningModule, or of a
        callback after this one, it is that epoch's."""
        return dict(self._epoch_end_metrics)

    def _built(self) -> Selector:
        if self.selector is None:
            raise RuntimeError(
                "AtteNTCallback is set up by Trainer.fit: pass it in Trainer(callbacks=[...]) and "
                "use it from train_dataloader(), training_step() or configure_optimizers()"
            )
        return self.selector

    # --- Lightning's side ------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        check_trainer(trainer)
        if self.selector is None:
            self.selector = Selector(
                self.dataset,
                selection=self.selection,
                epochs=trainer.max_epochs,
                seed=self.seed,
                model=pl_module,
                loss_fn=self._scoring_loss,
                rank=trainer.global_rank,
                world_size=trainer.world_size,
                **self.selector_kwargs,
            )
        elif self.selector.epochs != trainer.max_epochs:
            raise ValueError(
                f"this AtteNTCallback planned {self.selector.epochs} epochs, the Trainer runs "
                f"{trainer.max_epochs}: build a new callback for another run length"
            )
        self.prepared_epoch = None  # chosen at on_fit_start, after a checkpoint's state is loaded
        self._accumulation = trainer.accumulate_grad_batches

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        selector = self.selector
        if selector.train_batch_size is None and selector.needs_scoring(selector.next_epoch):
            # this pass comes before Lightning asks for the train loader, whose batch sizes it
            selector.train_batch_size = training_batch_size(trainer, pl_module)
        self._prepare(selector.next_epoch)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        check_loader(trainer.train_dataloader, self.selector.sampler)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch != self.prepared_epoch:
            raise RuntimeError(
                f"AtteNTCallback chose the subset of epoch {self.prepared_epoch} but the Trainer "
                f"starts epoch {trainer.current_epoch}: resume from a checkpoint saved with this "
                "callback (its state holds the selection), not a weights-only one"
            )

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        # a NaN or inf loss stops here (selection.nonfinite: raise) or leaves the step without
        # gradients, which optimizer.step() skips (skip; fp16's scaler has unscaled them before)
        if not self.selector.step_finite():
            optimizer.zero_grad(set_to_none=True)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.is_last_batch:  # before validation and its checkpoints
            self._end_epoch()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch != self.prepared_epoch:
            # a run resumed from a checkpoint saved after the epoch's last batch (after validation)
            # replays the epoch's end; the callback closed that epoch before the checkpoint
            return
        self._end_epoch()  # where the last batch was not reached (limits, max_steps)
        # equal on every rank: sync_dist only keeps Lightning from asking for it
        pl_module.log_dict(
            {name: float(self._epoch_end_metrics[name]) for name in LOGGED_METRICS},
            on_step=False,
            on_epoch=True,
            sync_dist=True,
        )
        self._prepare(self.selector.next_epoch)

    def state_dict(self) -> dict[str, Any]:
        return {} if self._epoch_end_state is None else {"selector": self._epoch_end_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "selector" not in state_dict:
            return
        if self.prepared_epoch is not None:
            raise RuntimeError(
                "AtteNTCallback's state arrived after the first epoch's subset was chosen (a strategy "
                "that restores checkpoints after setup, e.g. FSDP or DeepSpeed): resuming under "
                "it is not supported; resume under DDP or a single device"
            )
        self._built().load_state_dict(state_dict["selector"])
        self._epoch_end_state = state_dict["selector"]

    # --- the epoch boundary ----------------------------------------------------------------------
    def _prepare(self, epoch: int) -> None:
        """Score and re-select for ``epoch`` where due, before Lightning loads its train loader."""
        if epoch < self.selector.epochs:
            self.selector.begin_epoch(epoch)
            self.prepared_epoch = epoch

    def _end_epoch(self) -> None:
        """Merge the epoch's scores across ranks (once); keep the state checkpoints save, and the metrics."""
        self.selector.end_epoch()
        if self._epoch_end_state is None or self._epoch_end_state["next_epoch"] != self.selector.next_epoch:
            self._epoch_end_state = self.selector.state_dict()  # a copy: the selector clones its tensors
            self._epoch_end_metrics = self.selector.metrics()

    def _scoring_loss(self, module: pl.LightningModule, batch: Any) -> torch.Tensor:
        """``loss_fn`` for the scoring pass: the batch moved as Lightning moves training batches
        (the module's transfer hooks included), the forward under the Trainer's precision."""
        if self.loss_fn is None:
            raise ValueError(
                f"selection '{self.selector.plan.label}' runs scoring passes: pass "
                "AtteNTCallback(loss_fn=...), the per-sample loss training_step hands to update()"
            )
        trainer = module.trainer
        with trainer.precision_plugin.forward_context():
            return self.loss_fn(module, trainer.strategy.batch_to_device(batch))


def check_trainer(trainer: pl.Trainer) -> None:
    """The Trainer settings the callback needs, each refused in one line that names the fix."""
    if trainer.reload_dataloaders_every_n_epochs != 1:
        raise ValueError(
            "AtteNTCallback needs Trainer(reload_dataloaders_every_n_epochs=1): each epoch's subset has "
            "its own size, and Lightning otherwise reads the train loader's length once"
        )
    if trainer.max_epochs is None or trainer.max_epochs < 1:
        raise ValueError(
            "AtteNTCallback needs Trainer(max_epochs=E): its ratio and interval schedules follow the run's epochs"
        )
    # Lightning 2.6 keeps this flag only on its private accelerator connector; where it is gone,
    # check_loader still finds the wrapped sampler at on_train_start
    if trainer.world_size > 1 and getattr(trainer._accelerator_connector, "use_distributed_sampler", False):
        raise ValueError(
            "AtteNTCallback needs Trainer(use_distributed_sampler=False) under DDP: its sampler already "
            "gives each rank its shard of the subset"
        )


def training_batch_size(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int | None:
    """The batch of the train loader the Trainer will load (asked of its DataModule or module, as
    Lightning asks each epoch), or None where it is not a DataLoader with a batch size."""
    datamodule = trainer.datamodule
    source = datamodule if datamodule is not None and is_overridden("train_dataloader", datamodule) else pl_module
    loader = source.train_dataloader() if is_overridden("train_dataloader", source) else None
    batch_sampler = getattr(loader, "batch_sampler", None)
    return getattr(loader, "batch_size", None) or getattr(batch_sampler, "batch_size", None)


def check_loader(loader: Any, sampler: RecordingSampler) -> None:
    """The train loader draws from the callback's sampler (not a copy, not a wrapper)."""
    if not draws_from(loader, sampler):
        raise ValueError(
            "AtteNTCallback: the train DataLoader does not draw from callback.sampler: build it with "
            "sampler=callback.sampler or callback.loader(batch_size) (under DDP with "
            "Trainer(use_distributed_sampler=False))"
        )
