"""What ``attent plan`` is asked for (light: the command line reads its defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    gpu: str = "a100-80gb"
    mfu: float | None = None  # stated, on the priced accelerator; None: each workload's (cost.rates)
    measure: bool = False
    price_per_gpu_hour: float | None = None
    samples: int | None = None  # the training set's size, for every run: where no other source says
    flops_per_sample: float | None = None  # a training step's, for a task without a probe (a forward: a third)
