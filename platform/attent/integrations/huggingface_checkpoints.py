"""The selection's state in Hugging Face Trainer checkpoints: saved per rank with each checkpoint,
restored (and checked against this run's plan) on ``resume_from_checkpoint``."""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

# This rank's selection state in a checkpoint folder (ranks differ inside an epoch: each holds
# the losses of its own shard that are not merged yet).
STATE_FILE = "attent_selection_rank{rank}.pt"


class SelectionCheckpoints:
    """Trainer's checkpoint hooks with the selection's state, a base of ``AtteNTTrainerMixin``, on
    the selection it keeps (``selector``, ``planned_batches``, ``_steps``). Only for a selecting
    method: a method that never selects checkpoints as Trainer does."""

    def _save_checkpoint(self, model, trial) -> None:
        if self.selects:
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            os.makedirs(folder, exist_ok=True)
            state = {"selector": self.selector.state_dict(), "plan": self._plan()}
            torch.save(state, os.path.join(folder, STATE_FILE.format(rank=self.args.process_index)))
        super()._save_checkpoint(model, trial)

    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ):
        """Trainer's, with the epoch and the batches to skip in it found from the planned epochs
        (Trainer divides by the first epoch's steps), and the selection's state restored."""
        trained = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        if not self.selects:
            return trained
        if resume_from_checkpoint is None:
            return 0, 0
        epoch, steps = self._planned_position(self.state.global_step)
        self._load_selection_state(resume_from_checkpoint, epoch, steps)
        return epoch, steps * self.args.gradient_accumulation_steps

    def _plan(self) -> dict[str, Any]:
        """What a checkpoint's selection state holds for: each epoch's batches on each rank."""
        return {
            "batches": list(self.planned_batches),
            "accumulation": self.args.gradient_accumulation_steps,
            "world_size": self.args.world_size,
        }

    def _planned_position(self, global_step: int) -> tuple[int, int]:
        """(epoch, optimiser steps taken in it) after ``global_step`` steps of the plan."""
        for epoch, batches in enumerate(self.planned_batches):
            if global_step < self._steps(batches):
                return epoch, global_step
            global_step -= self._steps(batches)
        return len(self.planned_batches), 0

    def _load_selection_state(self, checkpoint: str, epoch: int, steps: int) -> None:
        name = self.trainer_name
        path = os.path.join(checkpoint, STATE_FILE.format(rank=self.args.process_index))
        if not os.path.isfile(path):
            raise ValueError(
                f"{name}: {checkpoint} holds no AtteNT selection state for rank "
                f"{self.args.process_index}: resume from a checkpoint {name} wrote, on as many ranks"
            )
        state = torch.load(path, weights_only=True)
        if state["plan"] != self._plan():
            raise ValueError(
                f"{name}: the checkpoint was trained on another plan ({state['plan']}) than this run's "
                f"({self._plan()}): resume with the settings the checkpoint was trained with (batch "
                "size, accumulation, epochs, selection, drop_last, ranks)"
            )
        if steps > 0 and self.args.ignore_data_skip:
            raise ValueError(
                f"{name}: resuming inside an epoch with ignore_data_skip=True would train the epoch's "
                "first batches twice: set ignore_data_skip=False"
            )
        inside = state["selector"]["inside_epoch"]
        # a state inside epoch e, or between epochs before e; at an epoch's start also inside the
        # epoch before (a step checkpoint at its last step, taken before the epoch's end)
        at = state["selector"]["next_epoch"] if inside is None else inside["epoch"] + (steps == 0)
        if at != epoch:
            raise ValueError(
                f"{name}: the checkpoint's selection state stands at epoch {at} and the trainer's "
                f"step {self.state.global_step} in epoch {epoch}: resume from a checkpoint {name} wrote "
                "in this run's settings"
            )
        self.selector.load_state_dict(state["selector"])
