"""The Selector selection tests' learner: a per-sample loss that is a deterministic function of (epoch, sample), and
a loop that drives a Selector the way the engine does (begin_epoch, update per batch, end_epoch), counting its scoring
passes."""

from __future__ import annotations

import torch
from attent.selection.selector import Selector


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def losses_at(epoch: int, n: int) -> torch.Tensor:
    """The learner's per-sample loss at an epoch: a deterministic function of (epoch, sample)."""
    return torch.rand(n, generator=gen(1000 + epoch)) * 5.0


class Learner:
    """Drives a Selector the way the engine does, with scoring passes counted."""

    def __init__(self, selector: Selector, batch: int = 16):
        self.selector, self.batch, self.scored_at = selector, batch, []

    def score_fn(self, epoch: int):
        n = self.selector.num_samples

        def fn(indices):
            self.scored_at.append(epoch)
            losses = losses_at(epoch, n)
            for idx in indices[torch.randperm(indices.numel(), generator=gen(epoch))].split(self.batch):
                yield idx, losses[idx]

        return fn

    def epoch(self, epoch: int, *, with_score_fn: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.selector
        subset = s.begin_epoch(epoch, self.score_fn(epoch) if with_score_fn else None).clone()
        weights = s.loss_weights.clone()
        losses = losses_at(epoch, s.num_samples)
        for idx in torch.tensor(list(s.sampler), dtype=torch.long).split(self.batch):  # the loader's batches
            s.update(losses[idx])  # the sampler's next indices: idx
        s.end_epoch()
        return subset, weights
