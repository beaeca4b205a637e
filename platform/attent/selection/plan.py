"""The selection plan: every epoch of a run decided once, before it starts, from the ``selection:``
settings and the run's length. It is the only place the schedules are walked (the interval
stepped, the cycles laid out, the ratio read at each re-selection); the Selector, the cost model, the
Hugging Face and Lightning integrations, ``attent validate`` and the reports read it.

Training progress, the one clock of the platform (the selection's schedules and the learning
rate): p = (epochs completed + fraction of the current epoch) / E, from 0 when training starts to
1 when it ends. A re-selection at the start of epoch e reads p = e / E, so a schedule's end value
(reached at p = 1) is approached but not selected: with a re-selection every epoch the last ratio
is r(1 - 1/E); ``Plan.label`` says the ratio reached where it falls short. The learning rate reads
the progress reached by each optimiser step, in epochs, not in steps: an epoch on a 20 % subset
advances it as much as an epoch on all data, so a selection run follows the same learning-rate
curve per epoch as the full-data run it is compared with (``Plan.step_progress`` maps a
step-based schedule onto that clock).

A run's length, in one rank's batches and optimiser steps, is the plan's subsets under the
arithmetic of ``run_length`` (``Plan.batches``, ``Plan.steps``; ``fewest_epochs`` for a run sized
by its steps): integrations read it from here, never work it out themselves.

Each epoch, as ``PlannedEpoch``: the share of the data it trains on, whether a re-selection opens
it, and what scoring pass comes before that re-selection:

    ``rescore``   a scoring pass of the samples the scoring policy has due (``scoring``)
    ``unscored``  a pass only where some sample has no score yet (the first pick without one)
    ``none``      no pass: no re-selection, or a method that reads no scores

Three readings decide the epochs:

* the progress reading (``interval.kind`` fixed or incremental): ``warmup_epochs`` on all data,
  then a re-selection whose pick is kept I(p) epochs, until the final ``anneal`` share of the
  epochs, which trains on all data;
* the released code's cycles (``interval.kind: cycles``): a warm-up, then K cycles, each opening
  with S_c subset epochs at the cycle's ratio and ending on all data (``schedules.CycleSchedule``);
* InfoBatch: a pruning re-selection every epoch, its subset's size decided by the losses
  (``ratio`` None), then its final epochs on all data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction

from .config import SelectionConfig
from .run_length import optimiser_steps, rank_batches, step_position
from .schedules import CycleSchedule, RatioSchedule, budget, epochs_before_annealing

RESCORE, UNSCORED, NO_PASS = "rescore", "unscored", "none"


def training_progress(epoch: int, epochs: int, fraction: float = 0.0) -> float:
    """(epoch + fraction of it done) / the run's epochs, clipped to [0, 1] (module docstring)."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    return min(1.0, max(0.0, (epoch + fraction) / epochs))


@dataclass(frozen=True)
class PlannedEpoch:
    """What one epoch of a run trains on, as planned before it starts."""

    epoch: int
    ratio: float | None  # share of the training set trained on (1.0: all); None: decided by the losses (InfoBatch)
    selects: bool  # opens with a re-selection
    scoring: str = NO_PASS  # the scoring pass before the re-selection: rescore | unscored | none
    cycle: int | None = None  # cycles reading: the cycle (from 0); None in warm-up and otherwise

    @property
    def all_data(self) -> bool:
        """Trains on all data with no pick: warm-up, annealing, a cycle's full epochs."""
        return not self.selects and self.ratio == 1.0


@dataclass(frozen=True)
class Plan:
    """Every epoch of a run of ``epochs`` under ``selection`` (``build_plan``)."""

    selection: SelectionConfig
    epochs: int
    planned: tuple[PlannedEpoch, ...]

    def __getitem__(self, epoch: int) -> PlannedEpoch:
        return self.planned[epoch]

    def __iter__(self) -> Iterator[PlannedEpoch]:
        return iter(self.planned)

    def __len__(self) -> int:
        return len(self.planned)

    # --- the budget -------------------------------------------------------------------------------
    def ratios(self) -> list[tuple[int, float | None]]:
        """(epoch, ratio) of every re-selection. The epochs that train on all data between picks
        (warm-up, annealing, a cycle's full epochs) are no re-selections."""
        return [(p.epoch, p.ratio) for p in self if p.selects]

    def mean_ratio(self) -> float:
        """The mean over epochs of the share of the data trained on: the budget the run plans to
        spend, and 1 minus its ideal sample saving."""
        self._require_sizes("a planned budget")
        return sum(p.ratio for p in self) / self.epochs

    def ratio_reached(self) -> float:
        """The largest share of the data an epoch trains on (1.0 where some epoch trains on all)."""
        return max(1.0 if p.ratio is None else p.ratio for p in self)

    def subset_sizes(self, num_samples: int) -> list[int]:
        """The subset size of every epoch: all data where an epoch trains on all,
        ``budget(N, ratio)`` where a re-selection's pick holds."""
        self._require_sizes("planned subset sizes")
        return [num_samples if p.all_data else budget(num_samples, p.ratio) for p in self]

    def batches(
        self, num_samples: int, batch_size: int, world_size: int = 1, *, drop_last: bool = False, even: bool = True
    ) -> list[int]:
        """Batches one rank draws in each epoch: a rank's shard is padded to the longest
        (``even``, the sampler's default) or trimmed to the shortest, and a loader with
        ``drop_last`` drops a short last batch."""
        return [
            rank_batches(size, batch_size, world_size, drop_last=drop_last, even=even)
            for size in self.subset_sizes(num_samples)
        ]

    def steps(self, batches: list[int], accumulation: int = 1) -> list[int]:
        """Optimiser steps of each epoch of ``batches`` (``optimiser_steps``)."""
        return [optimiser_steps(b, accumulation) for b in batches]

    def _require_sizes(self, what: str) -> None:
        if any(p.ratio is None for p in self):
            raise ValueError(
                f"InfoBatch's subset sizes depend on the losses: {what} cannot be known before the run; "
                "use an epoch-based learning-rate schedule"
            )

    # --- the clock --------------------------------------------------------------------------------
    def progress(self, epoch: int, fraction: float = 0.0) -> float:
        """Training progress at ``fraction`` of epoch ``epoch`` (module docstring)."""
        return training_progress(epoch, self.epochs, fraction)

    def step_progress(self, steps: list[int], total: int | None = None) -> Callable[[int], Fraction]:
        """For a schedule counted in optimiser steps: step s -> the step of a schedule of ``total``
        steps (default: all of ``steps``, each epoch's optimiser steps) at which the training
        progress, in epochs, is the same as after s steps of this plan. Where every epoch holds as
        many steps the map is the identity, exactly (a Fraction equal to s); a run cut at ``total``
        steps ends where its last epoch is cut."""
        total = sum(steps) if total is None else total

        def epochs_done(step: int) -> Fraction:
            epoch, done = step_position(steps, step)
            if epoch < len(steps):
                return epoch + Fraction(done, steps[epoch])
            # at or past the end: every epoch done, but a last epoch of no step, never begun
            return Fraction(len(steps) - (steps[-1] == 0)) if steps else Fraction(0)

        end = epochs_done(total)

        def at(step: int) -> Fraction:
            return total * epochs_done(step) / end if end else Fraction(step)

        return at

    # --- what a run says about itself -------------------------------------------------------------
    @property
    def label(self) -> str:
        """Row label for tables, e.g. 'Soft · incremental(0.2→0.8) · incremental(1→4)'. A schedule
        whose end is never selected says what is reached: 'incremental(0.2→0.8, reached 0.56)'.
        The cycles reading, whose ratio steps per cycle and reaches its end: 'Soft ·
        incremental(0.2→0.8) per cycle · cycles(4 × 1→4 subset epochs, re-drawn)'."""
        sel = self.selection
        if sel.method == "full":
            return "Full data"
        if sel.method == "infobatch":
            return f"InfoBatch (prune {sel.infobatch_prune:g})"
        head = sel.strategy.capitalize() if sel.method == "attent" else sel.method.replace("_", " ").title()
        ratio = sel.ratio_schedule.describe()
        if sel.ratio.kind != "fixed":
            if sel.uses_cycles:
                ratio += " per cycle"
            else:
                picked = [r for _, r in self.ratios()]
                if picked and abs(max(picked) - sel.ratio.end) > 5e-3:
                    ratio = f"{ratio[:-1]}, reached {max(picked):.2g})"
        beyond = [
            text
            for on, text in (
                (sel.scores == "training" and sel.strategy != "random", "free scores"),  # Random reads none
                (sel.rescore_stale, "stale-only scoring"),
                (sel.rescore_fraction < 1, f"scoring {sel.rescore_fraction:.0%}"),
                (sel.reweight, "reweighted"),
                (sel.stratify, "per class"),
                (sel.anneal, f"anneal {sel.anneal:.1%}"),
            )
            if on
        ]
        return " · ".join([head, ratio, sel.interval_schedule.describe(), *beyond])

    def describe(self) -> str:
        """The plan in words, runs of like epochs together: what ``attent validate`` prints."""
        sized = all(p.ratio is not None for p in self)
        head = (
            f"plan: {self.epochs} epochs, {sum(p.selects for p in self)} re-selection(s), "
            f"{sum(p.scoring == RESCORE for p in self)} scoring pass(es) planned"
        )
        if sized:
            head += f", mean share {self.mean_ratio():.3g} (ideal sample saving {1 - self.mean_ratio():.1%})"
        words = []
        for p in self:
            what = (
                "all data"
                if p.all_data
                else ("pick " if p.selects else "keep ")
                + ("by the losses" if p.ratio is None else f"{p.ratio:.0%}")
                + {RESCORE: " after a scoring pass", UNSCORED: " (a pass for unscored samples)", NO_PASS: ""}[p.scoring]
            )
            if words and words[-1][2] == what and not p.selects:
                words[-1][1] = p.epoch + 1
            else:
                words.append([p.epoch + 1, p.epoch + 1, what])
        runs = [f"{first}{'' if first == last else f'-{last}'}: {what}" for first, last, what in words]
        return "\n".join([head, *("  epochs " + "; ".join(runs[i : i + 4]) for i in range(0, len(runs), 4))])

    def summary(self) -> dict:
        """What ``attent validate`` prints and a run logs: the label, the budget and each epoch."""
        sized = all(p.ratio is not None for p in self)
        return {
            "label": self.label,
            "epochs": self.epochs,
            "reselections": sum(p.selects for p in self),
            "scoring_passes_planned": sum(p.scoring == RESCORE for p in self),
            "mean_ratio": self.mean_ratio() if sized else None,
            "plan": [
                {"epoch": p.epoch, "ratio": p.ratio, "selects": p.selects, "scoring": p.scoring, "cycle": p.cycle}
                for p in self
            ],
        }


def build_plan(selection: SelectionConfig, epochs: int) -> Plan:
    """Every epoch of a run of ``epochs`` under ``selection``, decided before it starts.

    One of the three readings (module docstring) lays the epochs out: the progress reading, the
    released code's cycles, or InfoBatch's pruning. A run shorter than its warm-up trains on all
    data (a smoke run's plan: ``summary()`` shows its 0 re-selections).

    Args:
        selection: the run's selection settings.
        epochs: the run's length in epochs, at least 1.

    Returns:
        The ``Plan``, a ``PlannedEpoch`` per epoch (the share of the data it trains on, whether
            a re-selection opens it, the scoring pass before that re-selection).

    Raises:
        ValueError: a plan that cannot be run, in one line naming the fix: fewer than one epoch,
            or cycles that the epochs after the warm-up cannot hold.

    Examples:
        >>> plan = build_plan(SelectionConfig(preset="llm"), 3)
        >>> [(p.ratio, p.selects, p.scoring) for p in plan]
        [(1.0, False, 'none'), (0.7, True, 'unscored'), (0.7, True, 'unscored')]
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if not selection.selects:
        planned = [PlannedEpoch(e, 1.0, False) for e in range(epochs)]
    elif selection.method == "infobatch":  # it prunes the first floor((1 - final) E) epochs, as its code counts
        pruning = epochs_before_annealing(epochs, selection.infobatch_final)
        planned = [PlannedEpoch(e, None, True) if e < pruning else PlannedEpoch(e, 1.0, False) for e in range(epochs)]
    elif selection.interval.kind == "cycles":
        planned = cycle_plan(epochs, selection.warmup_epochs, selection.interval_schedule, selection.ratio_schedule)
    else:
        planned = progress_plan(selection, epochs)
    scoring = (RESCORE if selection.rescore else UNSCORED) if selection.scores == "latest" else UNSCORED
    planned = [
        PlannedEpoch(p.epoch, p.ratio, p.selects, scoring if p.selects and selection.reads_scores else NO_PASS, p.cycle)
        for p in planned
    ]
    return Plan(selection, epochs, tuple(planned))


def pool_ratio(selection: SelectionConfig, progress: float, epochs: float = 1.0) -> float:
    """A stream's ratio at training ``progress`` (``stream``: each pool a re-selection): 1.0 in the
    warm-up share (``warmup_epochs`` of ``epochs``), in the ``anneal`` share and where nothing is
    selected; else r(progress) of the ratio schedule."""
    warm = (selection.warmup_epochs or 0) / epochs
    if not selection.selects or progress < warm or (selection.anneal and progress >= 1 - selection.anneal):
        return 1.0
    return selection.ratio_schedule(min(max(progress, 0.0), 1.0))


def progress_plan(selection: SelectionConfig, epochs: int) -> list[PlannedEpoch]:
    """The progress reading: warm-up on all data, a re-selection at epoch e kept for I(e / E)
    epochs at ratio r(e / E), the final ``anneal`` share of the epochs on all data."""
    end = epochs_before_annealing(epochs, selection.anneal) if selection.anneal else epochs
    ratio_of, interval_of = selection.ratio_schedule, selection.interval_schedule
    picks, epoch = {}, selection.warmup_epochs
    while epoch < end:
        progress = training_progress(epoch, epochs)
        picks[epoch] = ratio_of(progress)
        epoch += interval_of(progress)
    planned, ratio = [], 1.0
    for epoch in range(epochs):
        ratio = picks.get(epoch, ratio)
        planned.append(PlannedEpoch(epoch, ratio if epoch < end else 1.0, epoch in picks))
    return planned


def cycle_plan(epochs: int, warmup: int, cycles: CycleSchedule, ratio: RatioSchedule) -> list[PlannedEpoch]:
    """The cycles reading, epoch by epoch: ``warmup`` epochs on all data, then K cycles; cycle c
    trains S_c epochs on subsets at ratio r(c / (K - 1)) (the ratio schedule read at the cycle's
    place among the cycles, not at the run's progress: incremental 0.2 -> 0.8 over 4 cycles gives
    0.2, 0.4, 0.6, 0.8; the last cycle reaches r1), picked at the first of them, or at each with
    ``redraw``; then the rest of the cycle on all data, with no scoring pass."""
    if not 0 <= warmup < epochs:
        raise ValueError(
            f"interval kind cycles: {warmup} warm-up epoch(s) leave no epoch for the cycles of a {epochs}-epoch run"
        )
    if cycles.cycles > epochs - warmup:
        raise ValueError(
            f"interval kind cycles: {cycles.cycles} cycles need at least {cycles.cycles} epochs "
            f"after the {warmup} warm-up epoch(s); the run has {epochs - warmup} "
            f"(train.epochs = {epochs}): use fewer cycles or more epochs"
        )
    bounds = cycles.bounds(epochs, warmup)
    planned = [PlannedEpoch(epoch, 1.0, False) for epoch in range(warmup)]
    for c, (first, after) in enumerate(zip(bounds, bounds[1:])):
        subset = cycles.subset_epochs(c)
        if subset > after - first:
            raise ValueError(
                f"interval kind cycles: cycle {c + 1} of {cycles.cycles} has {after - first} epochs "
                f"({epochs - warmup} epochs after {warmup} warm-up in {cycles.cycles} cycles) and "
                f"cannot hold {subset} subset epochs: lower interval.start/end, use fewer cycles "
                "or more epochs"
            )
        r = ratio(cycles.progress(c))
        planned += [PlannedEpoch(first + i, r, i == 0 or cycles.redraw, cycle=c) for i in range(subset)]
        planned += [PlannedEpoch(epoch, 1.0, False, cycle=c) for epoch in range(first + subset, after)]
    return planned


# --- the run's length in epochs, for a run sized by its optimiser steps
def fewest_epochs(
    selection: SelectionConfig,
    max_steps: int,
    num_samples: int,
    batch_size: int,
    world_size: int = 1,
    *,
    accumulation: int = 1,
    drop_last: bool = False,
) -> int:
    """The fewest epochs whose plan holds ``max_steps`` optimiser steps (Trainer's ``max_steps``).
    A longer plan holds more steps, and no epoch more than one on all data: the search starts
    where epochs on all data would end, doubles, then bisects.

    Args:
        selection: the run's selection.
        max_steps: the optimiser steps the run takes, > 0.
        num_samples: the training set's size.
        batch_size: samples per batch on each rank.
        world_size: the number of ranks.
        accumulation: batches per optimiser step.
        drop_last: the DataLoader's.

    Returns:
        The epochs.

    Raises:
        ValueError: no plan of up to ``max_steps`` epochs holds the steps (a subset fills no batch
            with ``drop_last``, or the selection's plan cannot be run).
    """

    def held(epochs: int) -> int:
        try:
            plan = build_plan(selection, epochs)
            return sum(plan.steps(plan.batches(num_samples, batch_size, world_size, drop_last=drop_last), accumulation))
        except ValueError:  # no plan of so few epochs (interval kind cycles)
            return 0

    full = optimiser_steps(rank_batches(num_samples, batch_size, world_size, drop_last=drop_last), accumulation)
    low = high = max(1, math.ceil(max_steps / max(full, 1)))
    while held(high) < max_steps:
        if high >= max_steps:  # every epoch holds a step: no plan of more epochs is needed
            raise ValueError(f"no plan of up to {high} epochs holds max_steps={max_steps} steps")
        low, high = high + 1, min(2 * high, max_steps)
    while low < high:
        middle = (low + high) // 2
        if held(middle) >= max_steps:
            high = middle
        else:
            low = middle + 1
    return low
