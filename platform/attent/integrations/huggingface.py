"""AtteNT in Hugging Face's ``Trainer``: a drop-in subclass that owns the training sampler.

    trainer = attent.AtteNTTrainer(model=model, args=TrainingArguments(...), train_dataset=train_set,
                                   data_collator=collator, selection=attent.SelectionConfig(preset="llm"))
The selection is the plain ``Selector``'s (``attent.selection.selector``), through its public API
only; this module wires it into transformers 5's Trainer loop, each change an override of a Trainer
method read from its source, and each only where the method selects (``method="full"`` is
Trainer's own run, every override passing through):

    get_train_dataloader, _get_train_sampler   the loader draws from the Selector's sampler, this
                                 rank's shard (accelerate's placement kept, its sharding not applied)
    train, set_initial_training_values, create_scheduler   the run's epochs and max_steps (what the
                                 LR schedule is sized by) from the planned subsets, read on the
                                 epoch clock (huggingface_run)
    _run_epoch                   scoring pass and re-selection before each epoch, whose length is
                                 its own subset's (Trainer assumes every epoch as long as the first)
    compute_loss                 one loss per sample, recorded as its score, weighed, reduced as
                                 Trainer reduces; the epoch ends at its last batch
    log                          the epoch's selection in the next row Trainer logs with a loss, an
                                 evaluation or the run's summary: never a row of its own
    _save_checkpoint, _init_training_state   the selection's state in checkpoints, and where a
                                 resumed run goes on (huggingface_run)

and one callback of its own: on_pre_optimizer_step checks the step's losses (``Selector.step_finite``,
a stream's ``StreamSelector.step_finite``: a NaN or inf loss stops the run or skips the step, as
``selection.nonfinite`` says); on_epoch_end ends an epoch a callback or max_steps stopped early,
before Trainer's epoch-end logging, evaluation and save, so that the checkpoint's log history (and
Ray's RayTrainReportCallback) holds the epoch's selection. The loss is the model's own, split by
sample (per sample of a ``DataCollatorWithFlattening`` row: ``packed``), weighed by the selection
and reduced as the model reduces it (``huggingface_loss``). On an IterableDataset, a selecting run
trains on a ``StreamSelector``'s batches, each override passing through to Trainer's
(``huggingface_stream``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader
from transformers import DataCollatorWithFlattening, Trainer, TrainerCallback

from ..selection import metric_names as names
from ..selection.config import SelectionConfig
from ..selection.run_length import optimiser_steps
from ..selection.selector import Selector
from . import huggingface_run, huggingface_stream, packed
from .huggingface_loss import PerSampleLossHook, Reduction, hooked_split, own_loss_split
from .huggingface_run import STATE_FILE, PlannedRun  # noqa: F401 -- STATE_FILE: public here, beside the trainer
from .huggingface_settings import loader_problem, setting_problem

# The Trainer methods overridden here, as transformers 5 (read in 5.24) has them: an older Trainer
# lacks some, and would silently skip the override.
TRAINER_HOOKS = ("get_train_dataloader", "_get_train_sampler", "set_initial_training_values", "_run_epoch")
TRAINER_HOOKS += ("create_scheduler", "compute_loss", "_save_checkpoint", "_init_training_state")
_missing = [name for name in TRAINER_HOOKS if not hasattr(Trainer, name)]
if _missing:
    raise ImportError(
        f"attent.AtteNTTrainer needs transformers' Trainer of version 5 (>= 5.24): this one lacks {', '.join(_missing)}"
    )


class AtteNTTrainerMixin:
    """The selection, for ``Trainer`` and its subclasses (TRL's ``SFTTrainer``): put it first
    among the bases. Its keyword arguments: ``AtteNTTrainer``'s."""

    def __init__(
        self,
        *args: Any,
        selection: SelectionConfig,
        seed: int | None = None,
        compute_per_sample_loss: PerSampleLossHook | None = None,
        **kwargs: Any,
    ):
        # The class as built, for messages: Ray's prepare_trainer swaps in a subclass of its own name.
        self.trainer_name = type(self).__name__
        super().__init__(*args, **kwargs)
        self.selection = selection
        self.compute_per_sample_loss = compute_per_sample_loss
        # How the model reduces its own loss, learnt from its first forward (huggingface_loss)
        self.loss_reduction: Reduction | None = None
        if compute_per_sample_loss is not None:  # a micro-batch mean: Trainer divides it by the accumulation steps
            self.loss_is_scaled_for_ga = False
        self.seed = seed  # None: args.seed, read as train() starts (model_init and searches set it)
        self.selection_seed = self.args.seed if seed is None else seed
        self.selector: Selector | None = None  # built with the train dataloader
        self.planned_run: PlannedRun | None = None  # planned with the Selector
        self.resume_from: str | None = None  # the checkpoint train() resumes from
        self._selection_logs: dict[str, float] = {}  # the latest epoch's, for the next row logged
        self.refuse_settings()
        if self.selects:
            self.add_callback(_SelectionEvents(self))

    @property
    def selects(self) -> bool:
        """Whether the method ever selects: ``method="full"`` is Trainer's own run."""
        return self.selection.selects

    @property
    def plans(self) -> bool:
        """Whether the run selects by the Selector's planned epochs: not ``method="full"``, not a stream."""
        return self.selects and not huggingface_stream.is_stream(self.train_dataset)

    @property
    def needs_per_sample_losses(self) -> bool:
        """Whether training computes each sample's loss: not for ``method="full"`` nor a stream (which
        weigh nothing: Trainer's own loss), unless ``compute_per_sample_loss`` defines the loss."""
        return self.plans or self.compute_per_sample_loss is not None

    # --- settings that would break the selection (huggingface_settings), refused in one line naming the fix
    def refuse_settings(self, training: bool = False) -> None:
        """At construction, and again as train() starts (``training``: a training set is due,
        and the arguments may have changed since). A method that never selects is Trainer's own
        run: nothing is refused."""
        problem = setting_problem(self, training) if self.selects else None
        if problem:
            raise ValueError(f"{self.trainer_name}: {problem}")

    # --- the data -----------------------------------------------------------------------------------
    def get_train_dataloader(self) -> DataLoader:
        """The training loader, drawing this rank's shard of the epoch's subset from the
        Selector's sampler (built here, with the Trainer's collator for its scoring passes)."""
        self.refuse_settings(training=True)
        if not self.plans:
            return huggingface_stream.train_loader(self) if self.selects else super().get_train_dataloader()
        dataset, collator = self._training_data()
        args = self.args
        self._build_selector(dataset, collator)
        loader = DataLoader(
            dataset,
            batch_size=self._train_batch_size,
            sampler=self.selector.sampler,
            collate_fn=collator,
            drop_last=args.dataloader_drop_last,
            pin_memory=args.dataloader_pin_memory,
            **huggingface_stream.worker_options(args),
        )
        # accelerator.prepare would give rank r every W-th batch of its shard (accelerate #4075,
        # transformers #34365), and setting its wrapper's num_processes to 1 would pad a short last
        # batch from the epoch's start: told that this loader is all of one process's data,
        # prepare_data_loader keeps device placement and RNG sync, the sharding the sampler's alone.
        return prepare_data_loader(
            loader,
            self.accelerator.device,
            num_processes=1,
            process_index=0,
            put_on_device=self.accelerator.device_placement,
            rng_types=list(self.accelerator.rng_types),
            non_blocking=self.accelerator.non_blocking,
            use_stateful_dataloader=self.accelerator.use_stateful_dataloader,
        )

    def _build_selector(self, dataset, collator) -> Selector:
        """The run's plan and its Selector (with the Trainer's collator for its scoring passes)."""
        args = self.args
        self.selection_seed = args.seed if self.seed is None else self.seed
        self.planned_run = huggingface_run.plan_run(
            self.trainer_name, self.selection, args, self._train_batch_size, len(dataset), self.resume_from
        )
        self.selector = Selector(
            dataset,
            selection=self.selection,
            epochs=self.planned_run.epochs,
            seed=self.selection_seed,
            model=self.model,
            loss_fn=self._scoring_losses,
            collate_fn=collator,
            rank=args.process_index,
            world_size=args.world_size,
            shuffle=args.train_sampling_strategy != "sequential",
            train_batch_size=self._train_batch_size,  # sizes the scoring batch
        )
        return self.selector

    def _get_train_sampler(self, train_dataset=None):
        """The Selector's sampler, for a subclass's own ``get_train_dataloader`` (Trainer's builds
        its loader around it); Trainer's own sampler where nothing is selected (or on a stream)."""
        if not self.plans:
            return super()._get_train_sampler(train_dataset)
        self.refuse_settings(training=True)
        dataset, collator = self._training_data()
        return self._build_selector(dataset, collator).sampler

    def check_training_loader(self, loader) -> None:
        """Refuses, in one line before the first step, a train loader (a subclass's own) that does
        not draw this run's batches from the Selector's sampler alone."""
        problem = loader_problem(self, loader)
        if problem:
            raise ValueError(f"{self.trainer_name}'s get_train_dataloader {problem}")

    def _training_data(self):
        """(dataset, collator) as Trainer's own training loader has them: a ``datasets.Dataset``
        loses the columns the model's forward does not take, other datasets get a collator that
        drops them. Rows keep their positions either way."""
        # a datasets.Dataset only where `datasets` is imported (it is no need of Trainer's)
        hf_datasets = sys.modules.get("datasets")
        if hf_datasets is not None and isinstance(self.train_dataset, hf_datasets.Dataset):
            return self._remove_unused_columns(self.train_dataset, description="training"), self.data_collator
        return self.train_dataset, self._get_collator_with_removed_columns(self.data_collator, description="training")

    # --- the run's length and resume (huggingface_run) ---------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Trainer's, noting the checkpoint it resumes from before its loader is built (the plan
        of a resumed run is read from it)."""
        self.resume_from = huggingface_run.checkpoint_folder(resume_from_checkpoint, self.args.output_dir)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def set_initial_training_values(self, args, dataloader):
        """Trainer's values with the planned epochs and steps: max_steps sizes the LR schedule."""
        values = super().set_initial_training_values(args, dataloader)
        if not self.plans:
            return values
        self.check_training_loader(dataloader)
        return self.planned_run.training_values(values, self.selector, self.trainer_name)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """Trainer's schedule over the run's steps, read on the epoch clock (huggingface_run); a
        scheduler the user passed is left as it is."""
        created = self.lr_scheduler is None
        if self.plans:
            num_training_steps = self.planned_run.max_steps  # a re-planned resume's, not Trainer's count
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if created and self.plans:
            huggingface_run.on_the_epoch_clock(scheduler, self.selector.plan, self.planned_run)
        return scheduler

    def _save_checkpoint(self, model, trial) -> None:
        """Trainer's, this rank's selection state and the run's plan (or stream place) in the checkpoint."""
        if self.plans:
            output_dir, step, rank = self._get_output_dir(trial=trial), self.state.global_step, self.args.process_index
            huggingface_run.save_selection_state(output_dir, step, rank, self.selector, self.planned_run)
        huggingface_stream.save_state(self, self._get_output_dir(trial=trial))
        super()._save_checkpoint(model, trial)

    def _init_training_state(self, max_steps, *rest):
        """Trainer's, with the selection's state restored from the checkpoint the run was planned
        from (train() notes it), and the epoch and the batches to skip in it read from the planned
        epochs (Trainer divides by the first epoch's steps)."""
        trained = super()._init_training_state(max_steps, *rest)
        if not self.plans:  # a stream run skips no batch: its StreamSelector goes on where it stood
            return huggingface_stream.training_start(self, trained)
        self.state.max_steps = self.planned_run.max_steps
        return huggingface_run.resume(self.trainer_name, self.selector, self.planned_run, self.args.ignore_data_skip)

    # --- the epoch -------------------------------------------------------------------------------------
    def _run_epoch(self, model, epoch, train_dataloader, steps_in_epoch, num_update_steps_per_epoch, **rest):
        """Trainer's epoch, on this epoch's subset: the scoring pass and re-selection first, then
        as many batches as the subset fills (Trainer would assume the first epoch's count)."""
        if not self.plans:
            return super()._run_epoch(
                model, epoch, train_dataloader, steps_in_epoch, num_update_steps_per_epoch, **rest
            )
        # On a resume inside this epoch the Selector goes on where the checkpoint stood.
        self.selector.begin_epoch(epoch)
        batches = self.planned_run.batches[epoch]
        if len(train_dataloader) != batches:  # the plan and the sampler disagree: a bug, not a setting
            raise RuntimeError(f"epoch {epoch}: the loader holds {len(train_dataloader)} batches, the plan {batches}")
        update_steps = optimiser_steps(batches, self.planned_run.accumulation)
        super()._run_epoch(model, epoch, train_dataloader, batches, update_steps, **rest)  # ends in _SelectionEvents

    def _end_selection_epoch(self) -> None:
        """The epoch's end, at its last batch or at on_epoch_end where a callback or max_steps
        stopped it early (what was trained is what counts): the scores merged, the selection kept
        for the next row Trainer logs."""
        if self.plans and self.selector.in_epoch:
            self.selector.end_epoch()
            self._selection_logs = self.selection_metrics()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Trainer's, the latest epoch's selection added to the first row after it that carries a
        loss, an evaluation or the run's summary: the log history reads as Trainer's, row for row."""
        carries = any(key == "loss" or key.startswith("eval_") or key == "train_runtime" for key in logs)
        if self._selection_logs and carries:
            logs, self._selection_logs = {**logs, **self._selection_logs}, {}
        super().log(huggingface_stream.logged(self, logs), start_time)

    def selection_metrics(self) -> dict[str, float]:
        """The latest epoch's selection, under the names the engine logs to MLflow
        (``attent.selection.metric_names``). Without ``epoch`` (Trainer logs its own) and without
        ``train_loss``: in Trainer's logs that name is the run's mean loss, logged once at its end
        (and W&B or trackio keep it as a summary, not a curve); Trainer's ``loss`` is the training loss."""
        return {
            key: value for key, value in self.selector.metrics().items() if key not in (names.EPOCH, names.TRAIN_LOSS)
        }

    # --- the loss -----------------------------------------------------------------------------------
    def per_sample_loss(self, model, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(S, n) [B]: each sample's summed loss terms and their count, from one forward of
        ``model``, split as the model's own loss splits (checked at the first forward); of a
        ``DataCollatorWithFlattening`` row, per sample of the row (``packed``), in its order."""
        segments = self._segments(inputs)
        if segments is not None:  # no cache (it turns transformers' packed-row masks off), no label across samples
            inputs = packed.packed_inputs(inputs, segments[0])
        if self.compute_per_sample_loss is not None:
            return hooked_split(self.trainer_name, self.compute_per_sample_loss, model, inputs, segments)
        sums, counts, self.loss_reduction = own_loss_split(
            self.trainer_name, model, inputs, self.loss_reduction, self.model_accepts_loss_kwargs, segments
        )
        return sums, counts

    def _segments(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, int] | None:
        """(segments, B) of a ``DataCollatorWithFlattening`` batch (``packed``); None for another collator's."""
        return packed.batch_segments(inputs) if isinstance(self.data_collator, DataCollatorWithFlattening) else None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Training: per-sample losses recorded as the samples' scores, and the weighted loss
        reduced as the model reduces its own (module docstring). Evaluation, and training where no
        per-sample loss is needed (``method="full"``): Trainer's own loss."""
        training = model.training and not return_outputs  # a stream's training loss is checked at its step
        if not training or not self.needs_per_sample_losses:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return huggingface_stream.record_loss(self, loss) if training else loss
        sums, counts = self.per_sample_loss(model, inputs)
        if not self.plans:  # method full or a stream, with compute_per_sample_loss: its micro-batch mean
            return huggingface_stream.record_loss(self, sums.sum() / counts.sum().clamp(min=1))
        self._check_one_sample_per_row(len(sums))
        weighted = self.selector.update(sums / counts.clamp(min=1), train_losses=sums).sum()
        if self.selector.remaining == 0:  # the epoch's last batch: its row logged at this step carries it
            self._end_selection_epoch()
        if self.compute_per_sample_loss is not None:  # loss_is_scaled_for_ga is False: Trainer divides
            return weighted / counts.sum().clamp(min=1)
        if num_items_in_batch is not None and self._divides_by_num_items():
            loss = weighted / num_items_in_batch
        else:
            loss = weighted / counts.sum().clamp(min=1)
        # As Trainer scales the model's loss (compute_loss): num_items_in_batch counts every
        # rank's tokens and DDP averages; loss_is_scaled_for_ga stays None, so Trainer divides by
        # the accumulation steps exactly where it would divide the model's own loss.
        if num_items_in_batch is not None and self.args.average_tokens_across_devices:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        return loss

    def _divides_by_num_items(self) -> bool:
        """Whether the model's own loss divides by the num_items_in_batch it is passed."""
        return self.loss_reduction is None or self.loss_reduction.num_items

    def _check_one_sample_per_row(self, rows: int) -> None:
        samples = min(self._train_batch_size, self.selector.remaining)
        if rows != samples:
            raise ValueError(
                f"{self.trainer_name}: a batch of {rows} rows holds {samples} samples: the collator "
                "merges samples (packing, padding-free), losing which sample each loss belongs to; "
                "use a padding collator or transformers' DataCollatorWithFlattening"
            )

    def step_finite(self) -> bool:
        """Whether the step may go on (``Selector.step_finite``, a stream's ``StreamSelector``'s)."""
        return self.selector.step_finite() if self.plans else huggingface_stream.step_finite(self)

    def _scoring_losses(self, model, batch) -> torch.Tensor:
        """A scoring pass's per-sample scores (the Selector runs it under no_grad, in eval mode)."""
        inputs = self._prepare_inputs(batch)
        with self.compute_loss_context_manager():
            sums, counts = self.per_sample_loss(model, inputs)
        return sums / counts.clamp(min=1)


class _SelectionEvents(TrainerCallback):
    """The trainer's callback (the module docstring): each step's losses checked before the step;
    the selection epoch ended where its last batch did not end it, its log row asked for."""

    def __init__(self, trainer: AtteNTTrainerMixin):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        trainer = self.trainer
        # fp16's gradient scaler skips a step of non-finite gradients itself (and wants gradients
        # to check); elsewhere parameters without gradients are what optimizer.step() leaves alone
        if not trainer.step_finite() and not getattr(trainer.accelerator, "scaler", None):
            trainer.optimizer.zero_grad(set_to_none=True)
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        self.trainer._end_selection_epoch()
        if self.trainer._selection_logs:  # the epoch's last step logged no row: Trainer logs one now
            control.should_log = True
        return control


class AtteNTTrainer(AtteNTTrainerMixin, Trainer):
    """``transformers.Trainer`` training on the samples AtteNT picks.

    Args:
        *args: Trainer's (``model``, ``args``, ...).
        selection: the selection's settings, e.g. ``SelectionConfig(preset="llm")``; a NaN or inf
            loss is handled as its ``nonfinite`` says.
        seed: of the selection's draws and shuffles; None: ``args.seed``, read as train() starts.
        compute_per_sample_loss: for a model whose own loss does not split by sample:
            ``fn(model, inputs)`` returning each sample's loss [B], or its summed loss terms [B]
            and their count [B].
        **kwargs: Trainer's (``train_dataset``, ``data_collator``, ...).

    Raises:
        ValueError: at construction or as train() starts, a setting the selection cannot
            follow, in one line naming the fix (``huggingface_settings``); at an optimiser step,
            a NaN or inf loss under ``nonfinite: raise``.
    """
