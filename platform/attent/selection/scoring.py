"""Where a re-selection's scores come from: which samples a scoring pass scores, and which
observed losses are written to the score table. One object for every way the settings combine
(``selection.scores``, ``rescore_stale``, ``rescore_fraction``), so that the Selector asks it and
branches on none of them.

The paper's: every observed loss is a score, a training forward's as a pass's, and a pass scores
every sample. Beyond it:

* ``scores: training`` (free scores, cycles only): a re-selection ranks by the training forwards
  of the full-data epochs before it; a subset epoch's losses are not written, and a pass scores
  only samples that have no score yet;
* ``rescore_stale``: a pass scores only the samples not trained on since the last re-selection
  (the others keep their latest training loss);
* ``rescore_fraction`` < 1: a pass scores a random share of the samples due (never-scored ones
  always), drawn from the Selector's generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SelectionConfig
from .plan import RESCORE, UNSCORED, PlannedEpoch


@dataclass(frozen=True)
class ScoringPolicy:
    source: str = "latest"  # selection.scores: latest | training
    stale_only: bool = False  # selection.rescore_stale
    fraction: float = 1.0  # selection.rescore_fraction

    @classmethod
    def of(cls, selection: SelectionConfig) -> ScoringPolicy:
        return cls(selection.scores, selection.rescore_stale, selection.rescore_fraction)

    def pass_due(self, planned: PlannedEpoch, scores: torch.Tensor) -> bool:
        """Whether a scoring pass runs before the epoch's re-selection (the plan's ``scoring``:
        always for ``rescore``, where a sample has no score yet for ``unscored``)."""
        return planned.scoring == RESCORE or (planned.scoring == UNSCORED and bool(torch.isnan(scores).any()))

    def pass_indices(self, scores: torch.Tensor, trained: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The samples a pass scores, ascending (module docstring)."""
        unscored = torch.isnan(scores)
        if self.source == "training":
            return unscored.nonzero().squeeze(1)
        due = (~trained | unscored) if self.stale_only else torch.ones_like(unscored)
        if self.fraction < 1:
            known = (due & ~unscored).nonzero().squeeze(1)
            keep = round(self.fraction * known.numel())
            due[known] = False
            due[known[torch.randperm(known.numel(), generator=generator)[:keep]]] = True
        return due.nonzero().squeeze(1)

    def writes(self, from_pass: bool, all_data: bool) -> bool:
        """Whether observed losses enter the score table: a pass's always; a training forward's
        unless free scores are read and the epoch trains on a subset."""
        return from_pass or self.source == "latest" or all_data
