"""Selection-ratio and re-selection-interval schedules as pure functions of training progress.

Training progress, the one definition the whole platform uses (selection and learning rate):
p = (epochs completed + fraction of the current epoch) / total epochs, from 0 at the start of
training to 1 at its end. A selection made at the start of epoch e sees p = e / E; the learning
rate at an optimiser step sees the progress reached by that step. Consequently a schedule's end
value r1 (reached at p = 1) is approached but not selected: with E epochs and a selection every
epoch the last ratio is r(1 - 1/E). ``SelectionConfig.planned_ratios`` gives the ratios a run
will actually select, and run labels show the ratio reached where it falls short of r1.
Intervals are counted in epochs.
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
    kind: str = "fixed"   # fixed | incremental (linear r0->r1) | cosine (r0 + (r1-r0)(1-cos(pi p))/2)
    start: float = 0.2    # r0 (fixed: the ratio itself)
    end: float = 0.8      # r1 (ignored by fixed)

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
    kind: str = "fixed"   # fixed | incremental (linear I0->Imax, rounded)
    start: int = 1        # I0 (fixed: the interval itself)
    end: int = 1          # Imax (ignored by fixed)

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
