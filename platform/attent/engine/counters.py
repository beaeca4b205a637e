"""The run's counters and time split: one small object, stored in every checkpoint so a resumed
run continues its totals."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from .. import contract


@contextmanager
def timed(seconds: dict[str, float], part: str) -> Iterator[None]:
    """Adds the block's wall time to ``seconds[part]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[part] = seconds.get(part, 0.0) + time.perf_counter() - start


def _zero_seconds() -> dict[str, float]:
    return {part: 0.0 for part in ("total", *contract.TIME_PARTS)}


@dataclass
class RunCounters:
    next_epoch: int = 0  # first epoch still to train
    seconds: dict[str, float] = field(default_factory=_zero_seconds)  # cumulative, per part
    samples_forwarded: int = 0  # training + scoring forwards, all ranks
    samples_backpropagated: int = 0  # training forwards, all ranks
    optimizer_steps: int = 0  # this rank's (equal on every rank)
    history: list[dict[str, float]] = field(default_factory=list)  # one row per epoch

    def timed(self, part: str):
        """Adds the block's wall time to ``seconds[part]``."""
        return timed(self.seconds, part)

    @property
    def method_seconds(self) -> float:
        """What selection changes: training + scoring + selection (not eval, checkpoints, start-up)."""
        return sum(self.seconds[part] for part in contract.METHOD_TIME_PARTS)

    def time_metrics(self) -> dict[str, float]:
        metrics = {contract.time_metric(part): value for part, value in self.seconds.items()}
        metrics[contract.TIME_METHOD] = self.method_seconds
        return metrics
