"""The selection's schedules as pure functions: the ratio r(p) of a re-selection at training
progress p, the interval I(p) a pick is kept (the progress reading of "interval"), and the released
code's cycles (``CycleSchedule``: subset epochs per cycle, cycle bounds). ``plan`` walks them, once,
into every epoch of a run; nothing else does. Intervals are counted in epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def check_ratio(ratio: float) -> float:
    if not (isinstance(ratio, (int, float)) and 0.0 < ratio <= 1.0):
        raise ValueError(f"selection ratio must lie in (0, 1], got {ratio!r}")
    return float(ratio)


def budget(num_samples: int, ratio: float) -> int:
    """Number of samples a ratio keeps: round(ratio * N), at least 1."""
    check_ratio(ratio)
    return max(1, min(num_samples, round(ratio * num_samples)))


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


def fixed(ratio: float) -> RatioSchedule:
    return RatioSchedule("fixed", ratio, ratio)


def incremental(start: float = 0.2, end: float = 0.8) -> RatioSchedule:
    return RatioSchedule("incremental", start, end)


def cosine(start: float = 0.2, end: float = 0.8) -> RatioSchedule:
    return RatioSchedule("cosine", start, end)


def _check_progress(progress: float) -> float:
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress must lie in [0, 1], got {progress!r}")
    return float(progress)


def epochs_before_annealing(epochs: int, final: float) -> int:
    """Epochs before a final share ``final`` of the run trains on all data: floor((1 - final) E),
    as InfoBatch's official code counts (it prunes epoch e, from 1, while e <= (1 - final) E)."""
    return math.floor((1.0 - final) * epochs + 1e-9)
