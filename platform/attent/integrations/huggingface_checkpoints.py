"""The selection's state in Hugging Face Trainer checkpoints: saved per rank with each checkpoint,
restored on ``resume_from_checkpoint``, in the checkpoint's plan or re-planned (``huggingface_plan``)."""

from __future__ import annotations

import os

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

# This rank's selection state in a checkpoint folder (ranks differ inside an epoch: each holds
# the losses of its own shard that are not merged yet).
STATE_FILE = "attent_selection_rank{rank}.pt"


class SelectionCheckpoints:
    """Trainer's checkpoint hooks with the selection's state, a base of ``AtteNTTrainerMixin``, on
    the selection it keeps (``selector``, the plan's ``epoch_steps``). Only for a selecting method:
    a method that never selects checkpoints as Trainer does."""

    @staticmethod
    def state_file(rank: int) -> str:
        return STATE_FILE.format(rank=rank)

    def _save_checkpoint(self, model, trial) -> None:
        if self.selects:
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            os.makedirs(folder, exist_ok=True)
            state = {"selector": self.selector.state_dict(), "plan": self.plan_record()}
            torch.save(state, os.path.join(folder, self.state_file(self.args.process_index)))
        super()._save_checkpoint(model, trial)

    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ):
        """Trainer's, with the epoch and the batches to skip in it found from the planned epochs
        (Trainer divides by the first epoch's steps), and the selection's state restored. A
        re-planned run skips no batch: its sampler leaves out what this rank trained before."""
        trained = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        if not self.selects:
            return trained
        self.state.max_steps = self.run_max_steps
        if resume_from_checkpoint is None:
            return 0, 0
        state = self.checkpoint_state()
        if self.resumed_in is not None:
            epoch, inside = self.resumed_in
            self.selector.load_state_dict(state["selector"], skip_trained=inside)
            return epoch, 0
        epoch, steps = self._planned_position(self.state.global_step)
        if steps > 0 and self.args.ignore_data_skip:
            raise ValueError(
                f"{self.trainer_name}: resuming inside an epoch with ignore_data_skip=True would train the epoch's "
                "first batches twice: set ignore_data_skip=False"
            )
        self.selector.load_state_dict(state["selector"])
        return epoch, steps * self.args.gradient_accumulation_steps

    def _planned_position(self, global_step: int) -> tuple[int, int]:
        """(epoch, optimiser steps taken in it) after ``global_step`` steps of the plan."""
        for epoch, steps in enumerate(self.epoch_steps):
            if global_step < steps:
                return epoch, global_step
            global_step -= steps
        return len(self.epoch_steps), 0
