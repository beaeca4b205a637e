"""The run in the Hugging Face trainer: how long it is, the learning-rate clock it reads, and where
a resumed run goes on. The arithmetic is the selection's (``attent.selection.plan`` and
``run_length``); this module reads it for Trainer's arguments and checkpoints.

The length. Trainer counts epochs of the whole training set, each as long as the first. AtteNT's
epochs are passes over their subsets, each as long as its own subset (``Plan.batches``); the plan
runs over E epochs, reading progress e / E at epoch e. So:

    num_train_epochs = x    E = ceil(x) epochs of the plan; a fractional x trains the last one's
                            first (x - floor(x)) share of its steps, rounded up as Trainer rounds
                            (``run_length.run_steps``)
    max_steps = M > 0       E = the fewest epochs whose planned subsets hold M optimiser steps,
                            the last of them cut short at step M (``plan.fewest_epochs``)

The clock. Trainer's learning-rate schedule is sized by those steps, as Trainer sizes it by its own
max_steps, and read on the platform's one clock: at each optimiser step, the schedule's value at
the step where a run of equal epochs would have reached the same training progress in epochs
(``Plan.step_progress``; the identity where every epoch holds as many steps, e.g. full data). A
selection run thus follows the engine's learning-rate curve per epoch.

Resume. Each checkpoint holds every rank's selection state (``STATE_FILE``: ranks differ inside an
epoch, each holding the losses of its own shard not merged yet) and the run's plan
(``PlannedRun.record``). A resumed run with the settings of its checkpoint plans the same E and
steps, and goes on in the epoch its global step falls in (``run_length.step_position``), Trainer
skipping the batches trained in it. With another batch size, accumulation or (between epochs)
number of processes, it is re-planned from the epoch it resumes in: the subsets are global and stay
the checkpoint's, only their batching changes; the steps before the checkpoint are the
checkpoint's, those after it this run's, and the sampler leaves out what this rank trained before.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..selection.config import SelectionConfig
from ..selection.plan import Plan, build_plan, fewest_epochs
from ..selection.records import check_state_format
from ..selection.run_length import optimiser_steps, rank_batches, run_steps, step_position
from ..selection.selector import Selector

log = logging.getLogger("attent")

# This rank's selection state in a checkpoint folder
STATE_FILE = "attent_selection_rank{rank}.pt"


@dataclass
class PlannedRun:
    """This rank's run in the selection's plan, under Trainer's batching (``plan_run``)."""

    epochs: int  # E: the epochs the plan runs over
    batch_size: int  # per device
    accumulation: int
    world_size: int
    batches: list[int]  # this rank's batches in each epoch
    steps: list[int]  # the optimiser steps of each epoch, as the LR clock counts them
    max_steps: int = 0  # the optimiser steps the run takes
    resumed_in: tuple[int, bool] | None = None  # re-planned: (the epoch resumed in, inside it)
    checkpoint: dict | None = None  # the selection state it resumes from, until restored (``resume``)

    def record(self) -> dict[str, Any]:
        """What a checkpoint's selection state holds for: the run's epochs, each epoch's batches
        on each rank and the optimiser steps the LR clock counts."""
        return {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "accumulation": self.accumulation,
            "world_size": self.world_size,
            "batches": list(self.batches),
            "steps": list(self.steps),
        }

    def training_values(self, values: tuple, selector: Selector, owner: str) -> tuple:
        """Trainer's ``set_initial_training_values`` with the planned epochs, samples and
        ``max_steps`` (what sizes the LR schedule).

        Raises:
            ValueError: an epoch's subset fills no batch (``dataloader_drop_last``).
        """
        if 0 in self.batches:
            raise ValueError(
                f"{owner}: epoch {self.batches.index(0)}'s subset fills no batch of {self.batch_size} on each "
                f"of {self.world_size} rank(s) with dataloader_drop_last=True: lower "
                "per_device_train_batch_size or set it False"
            )
        samples = self.samples(selector.plan.subset_sizes(len(selector.dataset)))
        _, per_epoch, examples, _, total_batch, steps_in_epoch, _ = values
        return self.epochs, per_epoch, examples, samples, total_batch, steps_in_epoch, self.max_steps

    def samples(self, sizes: list[int]) -> int:
        """Samples the run trains on over every rank (Trainer's throughput metrics divide by it):
        each epoch's subset (``sizes``), the last cut-short epoch's share of it."""
        epoch, done = step_position(self.steps, self.max_steps)
        samples = float(sum(sizes[:epoch]))
        if done and epoch < len(sizes):
            samples += sizes[epoch] * (done / self.steps[epoch])
        return round(samples)


def plan_run(
    owner: str, selection: SelectionConfig, args, batch_size: int, num_samples: int, resume_from: str | None
) -> PlannedRun:
    """E, each epoch's batches and steps and the run's optimiser steps from Trainer's
    ``num_train_epochs`` or ``max_steps`` (module docstring).

    Args:
        owner: the trainer's name, for messages.
        selection: the run's selection (one that selects).
        args: Trainer's ``TrainingArguments``.
        batch_size: Trainer's batch per device.
        num_samples: the training set's size.
        resume_from: the checkpoint folder the run resumes from, None without one: its selection
            state is loaded (``load_selection_state``), and a checkpoint of other settings re-planned.

    Returns:
        The run.

    Raises:
        ValueError: no plan holds ``max_steps``, or the checkpoint holds no selection state or
            cannot be re-planned.
    """
    checkpoint = None if resume_from is None else load_selection_state(owner, resume_from, args.process_index)
    drop_last = args.dataloader_drop_last
    if checkpoint is not None and args.max_steps > 0:
        epochs = checkpoint["plan"]["epochs"]  # the checkpoint's run: the same subsets
    elif args.max_steps > 0:
        try:
            epochs = fewest_epochs(
                selection,
                args.max_steps,
                num_samples,
                batch_size,
                args.world_size,
                accumulation=args.gradient_accumulation_steps,
                drop_last=drop_last,
            )
        except ValueError as error:
            raise ValueError(
                f"{owner}: {error}: an epoch's subset fills no batch (dataloader_drop_last=True) "
                "or the selection's plan cannot be run; lower per_device_train_batch_size or check the selection"
            ) from None
    else:
        epochs = math.ceil(args.num_train_epochs)
    plan = build_plan(selection, epochs)
    batches = plan.batches(num_samples, batch_size, args.world_size, drop_last=drop_last)
    accumulation = args.gradient_accumulation_steps
    steps = plan.steps(batches, accumulation)
    run = PlannedRun(epochs, batch_size, accumulation, args.world_size, batches, steps, checkpoint=checkpoint)
    if checkpoint is not None and checkpoint["plan"] != run.record():
        replan(owner, run, checkpoint, plan.subset_sizes(num_samples), drop_last)
    run.max_steps = args.max_steps if args.max_steps > 0 else run_steps(run.steps, args.num_train_epochs)
    return run


def on_the_epoch_clock(scheduler, plan: Plan, run: PlannedRun) -> None:
    """Has Trainer's LambdaLR ``scheduler`` read its schedule on the epoch clock (module
    docstring); another scheduler is left as it is."""
    if isinstance(scheduler, LambdaLR):
        at = plan.step_progress(run.steps, total=run.max_steps)
        scheduler.lr_lambdas = [clocked(fn, at) for fn in scheduler.lr_lambdas]


def clocked(schedule: Callable, at: Callable[[int], Fraction]) -> Callable:
    """A LambdaLR factor read at the step ``at`` maps each optimiser step to (an int where it is
    one, so that the identity map is exactly Trainer's schedule)."""

    def factor(step: int) -> float:
        mapped = at(step)
        return schedule(int(mapped) if mapped.denominator == 1 else float(mapped))

    return factor


# --- resume: the selection's state saved with each checkpoint, loaded, and where the run goes on
def checkpoint_folder(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """The checkpoint folder Trainer's ``train(resume_from_checkpoint)`` resumes from, found before
    Trainer builds the loader (the plan of a resumed run is read from it); None without one."""
    if resume_from_checkpoint is True:  # Trainer resolves it again, and refuses an output_dir without one
        return get_last_checkpoint(output_dir)
    return resume_from_checkpoint or None


def state_file(folder: str, rank: int) -> str:
    """The path of rank ``rank``'s selection state in a checkpoint ``folder``."""
    return os.path.join(folder, STATE_FILE.format(rank=rank))


def save_selection_state(output_dir: str, global_step: int, rank: int, selector: Selector, run: PlannedRun) -> None:
    """Writes this rank's selection state and the run's plan into the checkpoint Trainer saves at
    ``global_step`` in ``output_dir`` (before Trainer's own files)."""
    folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{global_step}")
    os.makedirs(folder, exist_ok=True)
    torch.save({"selector": selector.state_dict(), "plan": run.record()}, state_file(folder, rank))


def load_selection_state(owner: str, folder: str, rank: int) -> dict[str, Any]:
    """The selection state (and Trainer's global step) of the checkpoint ``folder``: this rank's,
    or rank 0's where the checkpoint was taken on fewer processes.

    Raises:
        ValueError: the folder holds no selection state (not this trainer's checkpoint).
    """
    path = state_file(folder, rank)
    if not os.path.isfile(path):
        path = state_file(folder, 0)  # another number of processes: rank 0's
    if not os.path.isfile(path):
        raise ValueError(f"{owner}: {folder} holds no AtteNT selection state: resume from a checkpoint {owner} wrote")
    state = torch.load(path, weights_only=True)
    check_state_format(state["selector"], f"{owner}: the selection state of {folder}")
    with open(os.path.join(folder, "trainer_state.json")) as file:
        state["global_step"] = json.load(file)["global_step"]
    return state


def replan(owner: str, run: PlannedRun, checkpoint: dict[str, Any], sizes: list[int], drop_last: bool) -> None:
    """Re-plans ``run`` from the epoch the checkpoint resumes in, under this run's batching (the
    steps before the checkpoint stay its own); ``sizes``: the plan's subset sizes."""
    old, selector = checkpoint["plan"], checkpoint["selector"]
    epoch, done = step_position(old["steps"], checkpoint["global_step"])
    inside = selector["inside_epoch"] is not None and done > 0
    if inside and old["world_size"] != run.world_size:
        raise ValueError(
            f"{owner}: the checkpoint was taken inside epoch {epoch} on {old['world_size']} "
            f"process(es), where each holds its own part of the epoch: resume it on as many, or resume "
            "from a checkpoint taken at an epoch's end (save_strategy='epoch') to change their number"
        )
    steps = list(old["steps"][:epoch]) + run.steps[epoch:]
    if inside:  # the rest of this rank's shard, batched anew
        drawn = selector["inside_epoch"]["cursor"]
        run.batches[epoch] = rank_batches(
            sizes[epoch], run.batch_size, run.world_size, drop_last=drop_last, drawn=drawn
        )
        steps[epoch] = done + optimiser_steps(run.batches[epoch], run.accumulation)
    run.steps, run.resumed_in = steps, (epoch, inside)
    changed = ", ".join(
        f"{key} {run.record()[key]} (was {old[key]})"
        for key in ("batch_size", "accumulation", "world_size")
        if old[key] != run.record()[key]
    )
    log.warning(
        f"{owner}: resuming with {changed or 'another plan'}: re-planned from epoch {epoch}"
        f"{f' after its {done} step(s)' if inside else ''}, on the checkpoint's subsets"
    )


def resume(owner: str, selector: Selector, run: PlannedRun, ignore_data_skip: bool) -> tuple[int, int]:
    """Restores the selection state of the checkpoint ``run`` resumes from into ``selector``, and
    says where Trainer goes on.

    Args:
        owner: the trainer's name, for messages.
        selector: the run's Selector.
        run: the run as planned from the checkpoint (``plan_run``, re-planned or not).
        ignore_data_skip: Trainer's: the batches trained in the epoch would not be skipped.

    Returns:
        (the epoch, the batches Trainer skips in it): (0, 0) for a run that resumes from no
        checkpoint; no batch where re-planned, whose sampler leaves out what this rank trained before.

    Raises:
        ValueError: a resume inside an epoch with ``ignore_data_skip``.
    """
    checkpoint, run.checkpoint = run.checkpoint, None  # held no longer than needed: it holds every score
    if checkpoint is None:
        return 0, 0
    if run.resumed_in is not None:
        epoch, inside = run.resumed_in
        selector.load_state_dict(checkpoint["selector"], skip_trained=inside)
        return epoch, 0
    epoch, steps = step_position(run.steps, checkpoint["global_step"])
    if steps > 0 and ignore_data_skip:
        raise ValueError(
            f"{owner}: resuming inside an epoch with ignore_data_skip=True would train the epoch's "
            "first batches twice: set ignore_data_skip=False"
        )
    selector.load_state_dict(checkpoint["selector"])
    return epoch, steps * run.accumulation
