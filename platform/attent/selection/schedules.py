"""Selection-ratio and re-selection-interval schedules as pure functions of training progress.

Training progress, the one definition the whole platform uses (selection and learning rate):
p = (epochs completed + fraction of the current epoch) / total epochs, from 0 at the start of
training to 1 at its end. A selection made at the start of epoch e sees p = e / E; the learning
rate at an optimiser step sees the progress reached by that step. Consequently a schedule's end
value r1 (reached at p = 1) is approached but not selected: with E epochs and a selection every
epoch the last ratio is r(1 - 1/E). ``SelectionConfig.planned_ratios`` gives the ratios a run
will actually select, and run labels show the ratio reached where it falls short of r1.
Intervals are counted in epochs.

A second reading of "interval", the authors' released code's, is ``CycleSchedule`` and
``cycle_plan``: a warm-up on all data, then K cycles, each opening with a few epochs on a subset
(the "interval") and ending on all data, the ratio stepping once per cycle. Both readings give a
per-epoch plan (``PlannedEpoch``) through ``SelectionConfig.epoch_plan``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .deprecation import deprecated_arguments


def check_ratio(ratio: float) -> float:
    if not (isinstance(ratio, (int, float)) and 0.0 < ratio <= 1.0):
        raise ValueError(f"selection ratio must lie in (0, 1], got {ratio!r}")
    return float(ratio)


@dataclass(frozen=True)
class RatioSchedule:
    """r(p): the fraction of the training set selected at progress p."""

    kind: str = "fixed"  # fixed | incremental (linear r0->r1) | cosine (r0 + (r1-r0)(1-cos(pi p))/2)
    start: float = 0.2  # r0 (fixed: the ratio itself)
    end: float = 0.8  # r1 (ignored by fixed)

    def __post_init__(self):
        if self.kind not in ("fixed", "incremental", "cosine"):
            raise ValueError(f"unknown ratio schedule {self.kind!r}; choose fixed, incremental or cosine")
        check_ratio(self.start)
        check_ratio(self.end)

    def __call__(self, progress: float) -> float:
        p = _check_progress(progress)
        if self.kind == "fixed":
            return self.start
        if self.kind == "incremental":
            return self.start + (self.end - self.start) * p
        return self.start + (self.end - self.start) * (1 - math.cos(math.pi * p)) / 2

    def describe(self) -> str:
        return f"fixed({self.start:g})" if self.kind == "fixed" else f"{self.kind}({self.start:g}→{self.end:g})"


@dataclass(frozen=True)
class IntervalSchedule:
    """I(p): how many epochs (or steps) a selection is kept before the next one."""

    kind: str = "fixed"  # fixed | incremental (linear I0->Imax, rounded)
    start: int = 1  # I0 (fixed: the interval itself)
    end: int = 1  # Imax (ignored by fixed)

    def __post_init__(self):
        if self.kind not in ("fixed", "incremental"):
            raise ValueError(f"unknown interval schedule {self.kind!r}; choose fixed or incremental")
        for name, value in (("start", self.start), ("end", self.end)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"interval {name} must be an integer >= 1, got {value!r}")

    def __call__(self, progress: float) -> int:
        p = _check_progress(progress)
        if self.kind == "fixed":
            return self.start
        return max(1, round(self.start + (self.end - self.start) * p))

    def describe(self) -> str:
        return f"fixed({self.start})" if self.kind == "fixed" else f"incremental({self.start}→{self.end})"


@dataclass(frozen=True)
class CycleSchedule:
    """The released code's reading of "interval" (``interval.kind: cycles``): after the warm-up,
    the remaining epochs fall into ``cycles`` cycles; each opens with S_c epochs on a subset and
    trains the rest of the cycle on all data. "Interval" is S_c, the subset epochs of a cycle,
    not how long a pick is kept. S_c runs from ``start`` (first cycle) to ``end`` (last):
    S_c = start + floor((end - start) c / (K - 1)), c = 0..K-1 (K = 1: ``end``), as the code counts;
    ``start == end`` is the fixed kind. ``redraw``: re-select (re-scoring first where
    ``rescore`` says so) at every subset epoch, as the code does for Soft, or keep the cycle's
    first pick for all its subset epochs, as it does for Hard and Random."""

    cycles: int  # K
    start: int = 1  # subset epochs of the first cycle
    end: int = 1  # of the last
    redraw: bool = False

    def __post_init__(self):
        for name, value in (("cycles", self.cycles), ("start", self.start), ("end", self.end)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"interval {name} must be an integer >= 1, got {value!r}")

    def progress(self, cycle: int) -> float:
        """c / (K - 1): where the ratio and subset-epoch schedules stand at cycle c (1 when K = 1)."""
        return cycle / (self.cycles - 1) if self.cycles > 1 else 1.0

    def subset_epochs(self, cycle: int) -> int:
        """S_c, exactly in integers (the code's float product floors the same values)."""
        if self.cycles == 1:
            return self.end
        return self.start + (self.end - self.start) * cycle // (self.cycles - 1)

    def bounds(self, epochs: int, warmup: int) -> list[int]:
        """The first epoch of each cycle, and ``epochs`` after the last: cycle c spans epochs
        W + floor(c (E - W) / K) to W + floor((c + 1) (E - W) / K). The (E - W) mod K remaining
        epochs go to cycles spread over the run (lengths differ by at most one): no epoch is lost,
        where the released code's (E - 1) // K drops them (9 of E = 800 at K = 10)."""
        return [warmup + c * (epochs - warmup) // self.cycles for c in range(self.cycles + 1)]

    def describe(self) -> str:
        subset = f"{self.start}" if self.start == self.end else f"{self.start}→{self.end}"
        unit = "epoch" if subset == "1" else "epochs"
        return f"cycles({self.cycles} × {subset} subset {unit}{', re-drawn' if self.redraw else ''})"


@dataclass(frozen=True)
class PlannedEpoch:
    """What one epoch of a run trains on, as planned before it starts."""

    epoch: int
    ratio: float  # share of the training set trained on (1.0: all data)
    selects: bool  # opens with a re-selection (after a scoring pass where one is due)
    cycle: int | None = None  # cycles reading: the cycle (from 0); None in warm-up and otherwise

    @property
    def all_data(self) -> bool:
        """Trains on all data without a pick: warm-up, annealing, a cycle's full epochs."""
        return not self.selects and self.ratio >= 1.0


def cycle_plan(epochs: int, warmup: int, cycles: CycleSchedule, ratio: RatioSchedule) -> list[PlannedEpoch]:
    """The cycles reading's plan, epoch by epoch: ``warmup`` epochs on all data, then K cycles;
    cycle c trains S_c epochs on subsets at ratio r(c / (K - 1)) (the ratio schedule read at
    the cycle's place among the cycles, not at the run's progress: incremental 0.2 -> 0.8 over
    4 cycles gives 0.2, 0.4, 0.6, 0.8; the last cycle reaches r1), picked at the first of them,
    or at each with ``redraw``; then the rest of the cycle on all data, with no scoring pass.
    Refuses, in one line, a plan that cannot be run."""
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
    plan = [PlannedEpoch(epoch, 1.0, False) for epoch in range(warmup)]
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
        plan += [PlannedEpoch(first + i, r, i == 0 or cycles.redraw, c) for i in range(subset)]
        plan += [PlannedEpoch(epoch, 1.0, False, c) for epoch in range(first + subset, after)]
    return plan


def fixed(ratio: float) -> RatioSchedule:
    return RatioSchedule("fixed", ratio, ratio)


def incremental(start: float = 0.2, end: float = 0.8) -> RatioSchedule:
    return RatioSchedule("incremental", start, end)


def cosine(start: float = 0.2, end: float = 0.8) -> RatioSchedule:
    return RatioSchedule("cosine", start, end)


@deprecated_arguments(positional=3, renamed={"total_epochs": "epochs"})
def training_progress(epoch: int, epochs: int, fraction: float = 0.0) -> float:
    """(epoch + fraction of it done) / the run's epochs, clipped to [0, 1]: 0 when training
    starts, 1 when it ends. The learning rate and the selection schedules both read this."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    return min(1.0, max(0.0, (epoch + fraction) / epochs))


def _check_progress(progress: float) -> float:
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress must lie in [0, 1], got {progress!r}")
    return float(progress)


@deprecated_arguments(positional=2, renamed={"total_epochs": "epochs"})
def epochs_before_annealing(epochs: int, final: float) -> int:
    """Epochs before a final share ``final`` of the run trains on all data: floor((1 - final) E),
    as InfoBatch's official code counts (it prunes epoch e, from 1, while e <= (1 - final) E)."""
    return math.floor((1.0 - final) * epochs + 1e-9)
