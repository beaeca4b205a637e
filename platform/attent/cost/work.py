"""A run's work in sample-epochs, from the selection it will run: the samples it back-propagates,
those its scoring passes forward, and those its evaluations read."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attent.experiment.schema import ExperimentConfig
from attent.selection.selector import Selector
from attent.selection.stream import stream_pools

# The largest training set the cost model runs its Selector on. A larger one's counts are this
# size's scaled up (its plan and scoring policy are the same): each epoch's subset then differs
# from the exact one by under samples / RUN_AT_MOST samples (1.3e-4 of ImageNet's), where running
# 1.28 M samples over MultiMAE's 800 epochs would take 90 s on a CPU.
RUN_AT_MOST = 10_000


@dataclass(frozen=True)
class Work:
    samples: int  # the training set
    trained: int  # sample-epochs back-propagated
    scored: int  # samples forwarded by scoring passes
    evaluated: float  # evaluation work, in scoring forwards
    full: int  # the full-data run's trained sample-epochs: epochs x samples
    estimated: bool = False  # subset sizes decided by the losses (InfoBatch): drawn on random ones
    scaled_from: int | None = None  # the training set the Selector ran on, where smaller (RUN_AT_MOST)

    @property
    def limit(self) -> float:
        """The plan's saving at best, a forward costing a third of a training step:
        1 - (back-propagated + scored / 3) / full data's."""
        return 1 - (self.trained + self.scored / 3) / self.full


def planned_work(cfg: ExperimentConfig, samples: int, *, eval_samples: int = 0, eval_forwards: float = 1.0) -> Work:
    """The work of ``cfg`` on a training set of ``samples``: the run's own Selector (its plan,
    scoring policy and method) run on one rank over every epoch, each training forward and
    scoring pass answered with random losses. Subset sizes and the samples a pass scores depend on
    the plan and the policy alone, except where a method's pick depends on the losses (InfoBatch:
    ``estimated``). The group baselines are given balanced classes, one per group weight. Above
    ``RUN_AT_MOST`` samples the counts are those of a run on ``RUN_AT_MOST``, scaled.

    Args:
        cfg: the run.
        samples: its training set's size.
        eval_samples: the samples an evaluation reads.
        eval_forwards: forwards per evaluated sample, in scoring forwards.

    Returns:
        The run's ``Work``.
    """
    evaluated = len(cfg.train.evaluation_epochs()) * eval_samples * eval_forwards
    if cfg.stream is not None:
        return stream_work(cfg, samples, evaluated)
    size = min(samples, RUN_AT_MOST)
    groups = torch.arange(size) % max(2, len(cfg.selection.group_weights or ()))
    selector = Selector(range(size), selection=cfg.selection, epochs=cfg.train.epochs, seed=cfg.seed, groups=groups)
    generator = torch.Generator().manual_seed(cfg.seed)
    scored = trained = 0

    def score(indices: torch.Tensor):
        nonlocal scored
        scored += len(indices)
        yield indices, torch.rand(len(indices), generator=generator)

    for epoch in range(cfg.train.epochs):
        subset = selector.begin_epoch(epoch, score)
        selector.update(torch.rand(len(subset), generator=generator), subset)
        selector.end_epoch()
        trained += len(subset)
    estimated = any(p.ratio is None for p in selector.plan)
    scale, scaled_from = samples / size, size if size < samples else None
    full = cfg.train.epochs * samples
    return Work(samples, round(trained * scale), round(scored * scale), evaluated, full, estimated, scaled_from)


def stream_work(cfg: ExperimentConfig, samples: int, evaluated: float) -> Work:
    """The work of a stream run (``stream:``) on ``samples`` rows a pass: each rank's pools of its
    equal shard (``stream_pools``), B trained of each and every item of a pool larger than B
    scored (one forward each, 1 / r per trained sample; none under Random).

    Args:
        cfg: the run.
        samples: the rows of one pass over the stream.
        evaluated: its evaluation work, in scoring forwards.

    Returns:
        The run's ``Work``, exact (pool sizes depend on the plan alone).
    """
    ranks, batch = max(1, cfg.ray.max_workers), cfg.train.batch_size
    pools = [size for sizes in stream_pools(cfg.selection, batch, samples // ranks, cfg.train.epochs) for size in sizes]
    # a pool of B is trained as it comes, and Random draws without scores
    scored = 0 if cfg.selection.strategy == "random" else sum(size for size in pools if size > batch)
    return Work(samples, ranks * batch * len(pools), ranks * scored, evaluated, cfg.train.epochs * samples)
