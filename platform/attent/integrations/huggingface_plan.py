"""The run's length in the Hugging Face trainer: how many epochs of planned subsets, and how many
optimiser steps, ``num_train_epochs`` or ``max_steps`` ask for.

Trainer counts epochs of the whole training set, each as long as the first. AtteNT's epochs are
passes over their subsets, each as long as its own subset (``Selector.planned_batches``); the
ratio and interval schedules run over E epochs, reading progress e / E at epoch e
(``selection.schedules``). So:

    num_train_epochs = x    E = ceil(x) epochs of the plan; a fractional x trains the last one's
                            first (x - floor(x)) share of its steps, rounded up as Trainer rounds
                            (for equal epochs the steps are Trainer's ceil(x * steps per epoch))
    max_steps = M > 0       E = the fewest epochs whose planned subsets hold M optimiser steps,
                            the last of them cut short at step M

The LR schedule is sized by those steps, as Trainer sizes it by its own max_steps. A resumed
run plans the same E and steps from the same settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .pytorch import planned_subset_sizes


def epoch_batches(selection, num_samples: int, epochs: int, batch: int, world: int, drop_last: bool) -> list[int]:
    """This rank's batches in each epoch of a run of ``epochs``, as ``Selector.planned_batches``
    counts them for the trainer's loader (the sampler pads a rank's shard, the loader may drop a
    short last batch)."""
    return [
        subset_batches(size, batch, world, drop_last) for size in planned_subset_sizes(selection, num_samples, epochs)
    ]


def subset_batches(size: int, batch: int, world: int, drop_last: bool) -> int:
    """A rank's batches of a subset of ``size``."""
    shard = math.ceil(size / world)
    return shard // batch if drop_last else math.ceil(shard / batch)


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


class PlannedRun:
    """The run's length for ``AtteNTTrainerMixin`` (a base of it): ``plan_run`` before the
    Selector is built, Trainer's ``set_initial_training_values`` from the plan."""

    run_epochs: int = 0  # E: the epochs the Teacher plans, which the schedules run over
    run_max_steps: int = 0  # the optimiser steps the run takes

    def _steps(self, batches: int) -> int:
        """Optimiser steps of an epoch of ``batches`` (a short last window still steps)."""
        return math.ceil(batches / self.args.gradient_accumulation_steps)

    def plan_run(self, num_samples: int) -> None:
        """E and the run's optimiser steps from num_train_epochs or max_steps (module docstring)."""
        args = self.args

        def steps(epochs: int) -> list[int]:
            batches = epoch_batches(
                self.selection, num_samples, epochs, self._train_batch_size, args.world_size, args.dataloader_drop_last
            )
            return [self._steps(b) for b in batches]

        if args.max_steps > 0:

            def held(epochs: int) -> int:
                try:
                    return sum(steps(epochs))
                except ValueError:  # no plan of so few epochs (interval kind cycles)
                    return 0

            # no epoch holds more steps than one on all data: the search starts where those would end
            full = self._steps(
                subset_batches(num_samples, self._train_batch_size, args.world_size, args.dataloader_drop_last)
            )
            try:
                epochs = fewest_epochs(args.max_steps, held, max(1, math.ceil(args.max_steps / max(full, 1))))
            except ValueError as error:
                raise ValueError(
                    f"{self.trainer_name}: {error}: an epoch's subset fills no batch (dataloader_drop_last=True) "
                    "or the selection's plan cannot be run; lower per_device_train_batch_size or check the selection"
                ) from None
            self.run_epochs, self.run_max_steps = epochs, args.max_steps
            return
        fraction = args.num_train_epochs
        epochs = math.ceil(fraction)
        planned = steps(epochs)
        last = planned[-1]
        # Trainer's ceil(x * steps) where every epoch is as long; the last epoch's share otherwise
        cut = math.ceil(fraction * last) - math.floor(fraction) * last if fraction != epochs else last
        self.run_epochs, self.run_max_steps = epochs, sum(planned[:-1]) + cut

    def set_initial_training_values(self, args, dataloader):
        """Trainer's values with the planned epochs and steps: max_steps sizes the LR schedule."""
        _, per_epoch, examples, _, total_batch, steps_in_epoch, _ = super().set_initial_training_values(
            args, dataloader
        )
        self.planned_batches = self.selector.planned_batches(self._train_batch_size, args.dataloader_drop_last)
        if 0 in self.planned_batches:
            epoch = self.planned_batches.index(0)
            raise ValueError(
                f"{self.trainer_name}: epoch {epoch}'s subset fills no batch of "
                f"{self._train_batch_size} on each of {args.world_size} rank(s) with "
                "dataloader_drop_last=True: lower per_device_train_batch_size or set it False"
            )
        return (
            self.run_epochs,
            per_epoch,
            examples,
            self._planned_samples(),
            total_batch,
            steps_in_epoch,
            self.run_max_steps,
        )

    def _planned_samples(self) -> int:
        """Samples the run trains on over every rank (Trainer's throughput metrics divide by it):
        each epoch's subset, the last cut-short epoch's share of it."""
        sizes = planned_subset_sizes(self.selection, len(self.selector.dataset), self.run_epochs)
        samples, left = 0.0, self.run_max_steps
        for size, batches in zip(sizes, self.planned_batches):
            steps = self._steps(batches)
            samples += size * min(1.0, left / steps)
            left -= steps
            if left <= 0:
                break
        return round(samples)
