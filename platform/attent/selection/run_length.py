"""A run's length in one rank's batches and optimiser steps, for a world size, batch size, gradient
accumulation and ``drop_last``: each epoch's subset sharded as DistributedSampler shards it (the
Selector's sampler, ``sampler.shard_indices``), the shard batched as a DataLoader batches it, the
batches grouped into optimiser steps. The arithmetic is written here once; the plan
(``Plan.batches``, ``Plan.steps``, ``Plan.step_progress``, ``plan.fewest_epochs``) and the
integrations read it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def rank_batches(
    samples: int, batch_size: int, world_size: int = 1, *, drop_last: bool = False, even: bool = True, drawn: int = 0
) -> int:
    """Batches one rank draws of ``samples``, sharded as DistributedSampler shards them and batched
    as a DataLoader batches its shard.

    Args:
        samples: the samples of an epoch (its subset) over all ranks.
        batch_size: samples per batch.
        world_size: the number of ranks.
        drop_last: the DataLoader's: a short last batch is dropped, not drawn.
        even: the sampler pads every rank's shard to the longest (its default), else trims it to
            the shortest (its ``drop_last``).
        drawn: samples of the rank's shard drawn before (an epoch resumed inside), not batched again.

    Returns:
        The rank's batches.
    """
    shard = shard_size(samples, world_size, even=even) - drawn
    return shard // batch_size if drop_last else math.ceil(shard / batch_size)


def shard_size(samples: int, world_size: int = 1, *, even: bool = True) -> int:
    """Samples of one rank's shard of ``samples``, as DistributedSampler shards them.

    Args:
        samples: the samples of an epoch (its subset) over all ranks.
        world_size: the number of ranks.
        even: pad every shard to the longest (the sampler's default), else trim it to the shortest
            (its ``drop_last``).

    Returns:
        The shard's samples, padding included.
    """
    return math.ceil(samples / world_size) if even else samples // world_size


def optimiser_steps(batches: int, accumulation: int = 1) -> int:
    """Optimiser steps of ``batches``, ``accumulation`` a step (a short last window still steps).

    Args:
        batches: an epoch's batches on one rank (``rank_batches``).
        accumulation: batches per optimiser step (gradient accumulation).

    Returns:
        The optimiser steps.
    """
    return math.ceil(batches / accumulation)


def step_position(steps: Sequence[int], step: int) -> tuple[int, int]:
    """Where a run stands after ``step`` optimiser steps: the epoch its next step falls in.

    Args:
        steps: the optimiser steps of each epoch (``Plan.steps``).
        step: optimiser steps taken since the run started (a trainer's global step).

    Returns:
        (epoch, its steps taken); at or past the run's end, (the epochs, the steps beyond them).
    """
    for epoch, count in enumerate(steps):
        if step < count:
            return epoch, step
        step -= count
    return len(steps), step


def run_steps(steps: Sequence[int], epochs: float) -> int:
    """Optimiser steps of a run of ``epochs``, whole or not (Hugging Face Trainer's
    ``num_train_epochs``): a fractional run trains its last epoch's first (x - floor(x)) share,
    rounded up as Trainer rounds (for equal epochs, Trainer's ceil(x * steps per epoch)).

    Args:
        steps: the optimiser steps of each of the ceil(``epochs``) epochs (``Plan.steps``).
        epochs: the run's length in epochs, > 0.

    Returns:
        The run's optimiser steps.
    """
    last = steps[-1]
    cut = last if epochs == math.ceil(epochs) else math.ceil(epochs * last) - math.floor(epochs) * last
    return sum(steps[:-1]) + cut
