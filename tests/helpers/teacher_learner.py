"""The Teacher tests' learner: a per-sample loss that is a deterministic function of (epoch, sample), and a loop that
drives a Teacher the way the engine does, counting its scoring passes."""

from __future__ import annotations

import torch
from attent.selection.sampler import SubsetSampler
from attent.selection.teacher import Teacher


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def losses_at(epoch: int, n: int) -> torch.Tensor:
    """The learner's per-sample loss at an epoch: a deterministic function of (epoch, sample)."""
    return torch.rand(n, generator=gen(1000 + epoch)) * 5.0


class Learner:
    """Drives a Teacher the way the engine does, with scoring passes counted."""

    def __init__(self, teacher: Teacher, batch: int = 16):
        self.teacher, self.batch, self.scored_at = teacher, batch, []

    def score_fn(self, epoch: int):
        n = self.teacher.num_samples

        def fn(indices):
            self.scored_at.append(epoch)
            losses = losses_at(epoch, n)
            for idx in indices[torch.randperm(indices.numel(), generator=gen(epoch))].split(self.batch):
                yield idx, losses[idx]

        return fn

    def epoch(self, epoch: int, *, with_score_fn: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.teacher
        subset = t.begin_epoch(epoch, self.score_fn(epoch) if with_score_fn else None).clone()
        weights = t.loss_weights.clone()
        losses = losses_at(epoch, t.num_samples)
        for idx in torch.tensor(list(SubsetSampler(t, seed=3))).split(self.batch):
            t.observe(idx, losses[idx])
        t.end_epoch()
        return subset, weights
