"""A run's work in sample-epochs, from the plan it will follow: the samples it back-propagates,
those its scoring passes forward, and those its evaluations read."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attent.experiment.schema import ExperimentConfig
from attent.selection.plan import RESCORE, UNSCORED
from attent.selection.scoring import ScoringPolicy
from attent.selection.teacher import Teacher


@dataclass(frozen=True)
class Work:
    samples: int  # the training set
    trained: int  # sample-epochs back-propagated
    scored: int  # samples forwarded by scoring passes
    evaluated: float  # evaluation work, in scoring forwards
    full: int  # the full-data run's trained sample-epochs: epochs x samples
    estimated: bool = False  # subset sizes decided by the losses (InfoBatch): drawn on random ones

    @property
    def limit(self) -> float:
        """The plan's saving at best, a forward costing a third of a training step:
        1 - (back-propagated + scored / 3) / full data's."""
        return 1 - (self.trained + self.scored / 3) / self.full


def planned_work(cfg: ExperimentConfig, samples: int, *, eval_samples: int = 0, eval_forwards: float = 1.0) -> Work:
    """The work of ``cfg`` on a training set of ``samples``. Each epoch trains on its planned
    subset; a scoring pass forwards the samples the scoring policy has due (its own
    ``pass_indices`` on score and trained masks of the sizes the plan implies); a sample is
    scored once a training forward or a pass has seen it."""
    plan = cfg.plan
    evaluated = len(cfg.train.evaluation_epochs()) * eval_samples * eval_forwards
    full = cfg.train.epochs * samples
    if any(p.ratio is None for p in plan):
        trained, scored = _teacher_walk(cfg, samples)
        return Work(samples, trained, scored, evaluated, full, estimated=True)
    policy, generator = ScoringPolicy.of(cfg.selection), torch.Generator().manual_seed(cfg.seed)
    trained = scored = known = 0  # known: samples with a score so far
    since_pick = samples  # samples trained on since the last re-selection
    for planned, size in zip(plan, plan.subset_sizes(samples)):
        if planned.scoring == RESCORE or (planned.scoring == UNSCORED and known < samples):
            scores = torch.zeros(samples)
            scores[known:] = float("nan")
            was_trained = torch.zeros(samples, dtype=torch.bool)
            was_trained[:since_pick] = True
            scored += len(policy.pass_indices(scores, was_trained, generator))
            known = samples  # a pass scores every sample without a score
        # a kept pick trains the same samples again
        since_pick = samples if planned.all_data else size if planned.selects else since_pick
        if policy.writes(from_pass=False, all_data=planned.all_data):
            known = max(known, size)
        trained += size
    return Work(samples, trained, scored, evaluated, full)


def _teacher_walk(cfg: ExperimentConfig, samples: int) -> tuple[int, int]:
    """(trained, scored) of a Teacher run on random losses: for a method whose subset sizes its
    losses decide."""
    generator = torch.Generator().manual_seed(cfg.seed)
    teacher = Teacher(samples, cfg.selection, cfg.train.epochs, seed=cfg.seed)
    scored = 0

    def score(indices: torch.Tensor):
        nonlocal scored
        scored += len(indices)
        yield indices, torch.rand(len(indices), generator=generator)

    trained = 0
    for epoch in range(cfg.train.epochs):
        subset = teacher.begin_epoch(epoch, score)
        teacher.observe(subset, torch.rand(len(subset), generator=generator))
        teacher.end_epoch()
        trained += len(subset)
    return trained, scored
