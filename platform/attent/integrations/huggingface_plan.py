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
selection run thus follows the engine's learning-rate curve per epoch. A resumed run plans the same
E and steps from the same settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

from torch.optim.lr_scheduler import LambdaLR

from ..selection.plan import Plan, build_plan


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

    def _steps(self, batches: int) -> int:
        """Optimiser steps of an epoch of ``batches`` (a short last window still steps)."""
        return math.ceil(batches / self.args.gradient_accumulation_steps)

    def _epoch_steps(self, plan: Plan, num_samples: int) -> list[int]:
        args = self.args
        batches = plan.batches(
            num_samples, self._train_batch_size, args.world_size, drop_last=args.dataloader_drop_last
        )
        return [self._steps(b) for b in batches]

    def plan_run(self, num_samples: int) -> None:
        """E and the run's optimiser steps from num_train_epochs or max_steps (module docstring)."""
        args = self.args
        if args.max_steps > 0:

            def held(epochs: int) -> int:
                try:
                    return sum(self._epoch_steps(build_plan(self.selection, epochs), num_samples))
                except ValueError:  # no plan of so few epochs (interval kind cycles, a warm-up)
                    return 0

            # no epoch holds more steps than one on all data: the search starts where those would end
            full = self._steps(
                math.ceil(math.ceil(num_samples / args.world_size) / self._train_batch_size)
                if not args.dataloader_drop_last
                else math.ceil(num_samples / args.world_size) // self._train_batch_size
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
        planned = self._epoch_steps(build_plan(self.selection, epochs), num_samples)
        last = planned[-1]
        # Trainer's ceil(x * steps) where every epoch is as long; the last epoch's share otherwise
        cut = math.ceil(fraction * last) - math.floor(fraction) * last if fraction != epochs else last
        self.run_epochs, self.run_max_steps = epochs, sum(planned[:-1]) + cut

    def set_initial_training_values(self, args, dataloader):
        """Trainer's values with the planned epochs and steps: max_steps sizes the LR schedule."""
        values = super().set_initial_training_values(args, dataloader)
        if not self.selects:
            return values
        _, per_epoch, examples, _, total_batch, steps_in_epoch, _ = values
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

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """Trainer's schedule, read on the epoch clock (module docstring); a scheduler the user
        passed is left as it is."""
        created = self.lr_scheduler is None
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if created and self.selects and isinstance(scheduler, LambdaLR):
            steps = [self._steps(b) for b in self.planned_batches]
            at = self.selector.plan.step_progress(steps, total=self.run_max_steps)
            scheduler.lr_lambdas = [on_the_epoch_clock(fn, at) for fn in scheduler.lr_lambdas]
        return scheduler

    def _planned_samples(self) -> int:
        """Samples the run trains on over every rank (Trainer's throughput metrics divide by it):
        each epoch's subset, the last cut-short epoch's share of it."""
        sizes = self.selector.plan.subset_sizes(len(self.selector.dataset))
        samples, left = 0.0, self.run_max_steps
        for size, batches in zip(sizes, self.planned_batches):
            steps = self._steps(batches)
            samples += size * min(1.0, left / steps)
            left -= steps
            if left <= 0:
                break
        return round(samples)
