"""The run's length and learning-rate clock in the Hugging Face trainer: how many epochs of the
selection's plan, and how many optimiser steps, ``num_train_epochs`` or ``max_steps`` ask for.

Trainer counts epochs of the whole training set, each as long as the first. AtteNT's epochs are
passes over their subsets, each as long as its own subset (``Plan.batches``); the plan runs over E
epochs, reading progress e / E at epoch e (``attent.selection.plan``). So:

    num_train_epochs = x    E = ceil(x) epochs of the plan; a fractional x trains the last one's
                            first (x - floor(x)) share of its steps, rounded up as Trainer rounds
                            (for equal epochs the steps are Trainer's ceil(x * steps per epoch))
    max_steps = M > 0       E = the fewest epochs whose planned subsets hold M optimiser steps,
                            the last of them cut short at step M

Trainer's learning-rate schedule is sized by those steps, as Trainer sizes it by its own
max_steps, and read on the platform's one clock: at each optimiser step, the schedule's value at
the step where a run of equal epochs would have reached the same training progress in epochs
(``Plan.step_progress``; the identity where every epoch holds as many steps, e.g. full data). A
selection run thus follows the engine's learning-rate curve per epoch.

A resumed run with the settings of its checkpoint plans the same E and steps. With another batch
size, accumulation or (between epochs) number of processes, it is re-planned from the epoch it
resumes in: the subsets are global and stay the checkpoint's, only their batching changes; the
steps before the checkpoint are the checkpoint's, those after it this run's.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers.trainer_utils import get_last_checkpoint

from ..selection.plan import build_plan
from ..selection.teacher import check_state_format

log = logging.getLogger("attent")


def fewest_epochs(max_steps: int, steps_of: Callable[[int], int], first: int) -> int:
    """The fewest epochs E >= ``first`` whose plan holds ``max_steps`` steps (``steps_of(E)``: the
    plan's steps over E epochs, 0 where no plan of E epochs exists). Longer plans hold more steps
    (every epoch holds at least one): doubling, then bisection."""
    low, high = first, first
    while steps_of(high) < max_steps:
        if high >= max_steps:  # every epoch holds a step: no plan of more epochs is needed
            raise ValueError(f"no plan of up to {high} epochs holds max_steps={max_steps} steps")
        low, high = high + 1, min(2 * high, max_steps)
    while low < high:
        middle = (low + high) // 2
        if steps_of(middle) >= max_steps:
            high = middle
        else:
            low = middle + 1
    return low


def on_the_epoch_clock(schedule: Callable, at: Callable[[int], Fraction]) -> Callable:
    """A LambdaLR factor read at the step ``at`` maps each optimiser step to (an int where it is
    one, so that the identity map is exactly Trainer's schedule)."""

    def factor(step: int) -> float:
        mapped = at(step)
        return schedule(int(mapped) if mapped.denominator == 1 else float(mapped))

    return factor


class PlannedRun:
    """The run's length for ``AtteNTTrainerMixin`` (a base of it): ``plan_run`` before the
    Selector is built, Trainer's ``set_initial_training_values`` and ``create_scheduler`` from the
    plan. Only for a selecting method: a method that never selects is Trainer's own run."""

    run_epochs: int = 0  # E: the epochs the plan runs over
    run_max_steps: int = 0  # the optimiser steps the run takes
    epoch_steps: list[int] = []  # the optimiser steps of each epoch, as the LR clock counts them
    resumed_in: tuple[int, bool] | None = None  # re-planned: (the epoch resumed in, inside it)

    def _steps(self, batches: int) -> int:
        """Optimiser steps of an epoch of ``batches`` (a short last window still steps)."""
        return math.ceil(batches / self.args.gradient_accumulation_steps)

    def _batches(self, epochs: int, num_samples: int) -> list[int]:
        args = self.args
        plan = build_plan(self.selection, epochs)
        return plan.batches(num_samples, self._train_batch_size, args.world_size, drop_last=args.dataloader_drop_last)

    def plan_run(self, num_samples: int) -> None:
        """E, each epoch's batches and steps and the run's optimiser steps from num_train_epochs or
        max_steps (module docstring), re-planned where a checkpoint of other settings resumes."""
        args, checkpoint = self.args, self.checkpoint_state()
        if checkpoint is not None and args.max_steps > 0:
            epochs = checkpoint["plan"]["epochs"]  # the checkpoint's run: the same subsets
        elif args.max_steps > 0:
            epochs = self._fewest_epochs(num_samples)
        else:
            epochs = math.ceil(args.num_train_epochs)
        self.run_epochs, self.resumed_in = epochs, None
        self.planned_batches = self._batches(epochs, num_samples)
        self.epoch_steps = [self._steps(b) for b in self.planned_batches]
        if checkpoint is not None and checkpoint["plan"] != self.plan_record():
            self._replan(checkpoint, num_samples)
        if args.max_steps > 0:
            self.run_max_steps = args.max_steps
        else:
            fraction, last = args.num_train_epochs, self.epoch_steps[-1]
            # Trainer's ceil(x * steps) where every epoch is as long; the last epoch's share otherwise
            cut = math.ceil(fraction * last) - math.floor(fraction) * last if fraction != epochs else last
            self.run_max_steps = sum(self.epoch_steps[:-1]) + cut

    def _fewest_epochs(self, num_samples: int) -> int:
        args = self.args

        def held(epochs: int) -> int:
            try:
                return sum(self._steps(b) for b in self._batches(epochs, num_samples))
            except ValueError:  # no plan of so few epochs (interval kind cycles)
                return 0

        # no epoch holds more steps than one on all data: the search starts where those would end
        shard = math.ceil(num_samples / args.world_size)
        batches = (
            shard // self._train_batch_size if args.dataloader_drop_last else math.ceil(shard / self._train_batch_size)
        )
        try:
            return fewest_epochs(args.max_steps, held, max(1, math.ceil(args.max_steps / max(self._steps(batches), 1))))
        except ValueError as error:
            raise ValueError(
                f"{self.trainer_name}: {error}: an epoch's subset fills no batch (dataloader_drop_last=True) "
                "or the selection's plan cannot be run; lower per_device_train_batch_size or check the selection"
            ) from None

    def plan_record(self) -> dict[str, Any]:
        """What a checkpoint's selection state holds for: the run's epochs, each epoch's batches
        on each rank and the optimiser steps the LR clock counts."""
        args = self.args
        return {
            "epochs": self.run_epochs,
            "batch_size": self._train_batch_size,
            "accumulation": args.gradient_accumulation_steps,
            "world_size": args.world_size,
            "batches": list(self.planned_batches),
            "steps": list(self.epoch_steps),
        }

    def _replan(self, checkpoint: dict[str, Any], num_samples: int) -> None:
        """Batches and steps from the epoch the checkpoint resumes in, under this run's settings;
        the steps before the checkpoint stay the checkpoint's (module docstring)."""
        old, selector, step = checkpoint["plan"], checkpoint["selector"], checkpoint["global_step"]
        epoch, done = 0, step
        while epoch < len(old["steps"]) and done >= old["steps"][epoch]:
            done, epoch = done - old["steps"][epoch], epoch + 1
        inside = selector["inside_epoch"] is not None and done > 0
        if inside and old["world_size"] != self.args.world_size:
            raise ValueError(
                f"{self.trainer_name}: the checkpoint was taken inside epoch {epoch} on {old['world_size']} "
                f"process(es), where each holds its own part of the epoch: resume it on as many, or resume "
                "from a checkpoint taken at an epoch's end (save_strategy='epoch') to change their number"
            )
        steps = list(old["steps"][:epoch]) + self.epoch_steps[epoch:]
        if inside:
            size = build_plan(self.selection, self.run_epochs).subset_sizes(num_samples)[epoch]
            left = math.ceil(size / self.args.world_size) - selector["inside_epoch"]["cursor"]
            size_b = self._train_batch_size
            self.planned_batches[epoch] = left // size_b if self.args.dataloader_drop_last else math.ceil(left / size_b)
            steps[epoch] = done + self._steps(self.planned_batches[epoch])
        self.epoch_steps, self.resumed_in = steps, (epoch, inside)
        changed = ", ".join(
            f"{key} {self.plan_record()[key]} (was {old[key]})"
            for key in ("batch_size", "accumulation", "world_size")
            if old[key] != self.plan_record()[key]
        )
        log.warning(
            f"{self.trainer_name}: resuming with {changed or 'another plan'}: re-planned from epoch {epoch}"
            f"{f' after its {done} step(s)' if inside else ''}, on the checkpoint's subsets"
        )

    def checkpoint_state(self) -> dict[str, Any] | None:
        """The selection state (and the trainer's global step) of the checkpoint this train()
        resumes from, None without one; refuses, in one line, a checkpoint holding none."""
        path = self.resume_from
        if path is None or not self.selects:
            return None
        state_file = os.path.join(path, self.state_file(self.args.process_index))
        if not os.path.isfile(state_file):
            state_file = os.path.join(path, self.state_file(0))  # another number of processes: rank 0's
        if not os.path.isfile(state_file):
            raise ValueError(
                f"{self.trainer_name}: {path} holds no AtteNT selection state: resume from a checkpoint "
                f"{self.trainer_name} wrote"
            )
        state = torch.load(state_file, weights_only=True)
        check_state_format(state["selector"], f"{self.trainer_name}: the selection state of {path}")
        with open(os.path.join(path, "trainer_state.json")) as file:
            state["global_step"] = json.load(file)["global_step"]
        return state

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Trainer's, noting the checkpoint it resumes from before its loader is built (the plan
        of a resumed run is read from it)."""
        resumed = resume_from_checkpoint
        if resumed is True:  # Trainer resolves it again, and refuses an output_dir without one
            resumed = get_last_checkpoint(self.args.output_dir)
        self.resume_from = resumed or None
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def set_initial_training_values(self, args, dataloader):
        """Trainer's values with the planned epochs and steps: max_steps sizes the LR schedule."""
        values = super().set_initial_training_values(args, dataloader)
        if not self.selects:
            return values
        self.check_training_loader(dataloader)
        if 0 in self.planned_batches:
            epoch = self.planned_batches.index(0)
            raise ValueError(
                f"{self.trainer_name}: epoch {epoch}'s subset fills no batch of "
                f"{self._train_batch_size} on each of {args.world_size} rank(s) with "
                "dataloader_drop_last=True: lower per_device_train_batch_size or set it False"
            )
        _, per_epoch, examples, _, total_batch, steps_in_epoch, _ = values
        return (
            self.run_epochs,
            per_epoch,
            examples,
            self._planned_samples(),
            total_batch,
            steps_in_epoch,
            self.run_max_steps,
        )

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """Trainer's schedule over the run's steps, read on the epoch clock (module docstring); a
        scheduler the user passed is left as it is."""
        created = self.lr_scheduler is None
        if self.selects:
            num_training_steps = self.run_max_steps  # a re-planned resume's, not Trainer's count
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if created and self.selects and isinstance(scheduler, LambdaLR):
            at = self.selector.plan.step_progress(self.epoch_steps, total=self.run_max_steps)
            scheduler.lr_lambdas = [on_the_epoch_clock(fn, at) for fn in scheduler.lr_lambdas]
        return scheduler

    def _planned_samples(self) -> int:
        """Samples the run trains on over every rank (Trainer's throughput metrics divide by it):
        each epoch's subset, the last cut-short epoch's share of it."""
        sizes = self.selector.plan.subset_sizes(len(self.selector.dataset))
        samples, left = 0.0, self.run_max_steps
        for size, steps in zip(sizes, self.epoch_steps):
            samples += size * min(1.0, left / max(steps, 1))
            left -= steps
            if left <= 0:
                break
        return round(samples)
