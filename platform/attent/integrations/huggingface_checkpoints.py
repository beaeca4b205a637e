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
    the selection it keeps (``selector``, ``planned_batches``, the epoch's start and observations,
    ``_steps``)."""

    def selection_state(self) -> dict[str, Any]:
        """This rank's selection state. Between epochs: the Selector's. Inside one: the Selector's
        state as the epoch began, and this rank's observations since (replayed on resume)."""
        if not self.selector.in_epoch:
            return {"selector": self.selector.state_dict(), "observed": None}
        start = {
            "teacher": self._epoch_start["teacher"],
            "next_epoch": self.selector.next_epoch - 1,
            "samples_backpropagated": self._epoch_start["samples_backpropagated"],
            "samples_forwarded": self._epoch_start["samples_forwarded"],
        }
        return {"selector": start, "observed": list(self._observed)}

    def _save_checkpoint(self, model, trial) -> None:
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(folder, exist_ok=True)
        state = {**self.selection_state(), "plan": self._plan()}
        torch.save(state, os.path.join(folder, STATE_FILE.format(rank=self.args.process_index)))
        super()._save_checkpoint(model, trial)

    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ):
        """Trainer's, with the epoch and the batches to skip in it found from the planned epochs
        (Trainer divides by the first epoch's steps), and the selection's state restored."""
        super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
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
        resumes_at = state["selector"]["next_epoch"]
        mid_epoch = state["observed"] is not None
        if state["plan"] != self._plan() or resumes_at != epoch or mid_epoch != (steps > 0):
            raise ValueError(
                f"{name}: the checkpoint was trained on another plan ({state['plan']}, resuming at "
                f"epoch {resumes_at}) than this run's ({self._plan()}, step {self.state.global_step} "
                f"in epoch {epoch}): resume with the settings the checkpoint was trained with (batch "
                "size, accumulation, epochs, selection, drop_last, ranks)"
            )
        if mid_epoch and self.args.ignore_data_skip:
            raise ValueError(
                f"{name}: resuming inside an epoch with ignore_data_skip=True would train the epoch's "
                "first batches twice: set ignore_data_skip=False"
            )
        self.selector.load_state_dict(state["selector"])
        self._resume_observed = state["observed"]
