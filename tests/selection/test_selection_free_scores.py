"""Free scores (``selection.scores: training``, beyond the paper) under the cycles reading: a
re-selection ranks by the training forwards of the full-data epochs before it (the warm-up, the
previous cycle's full epochs), so no scoring pass runs; a subset epoch's losses do not enter the
table; a pass scores only samples that no full-data epoch scored."""

from __future__ import annotations

import pytest
import torch
from attent.selection.config import SelectionConfig
from attent.selection.plan import build_plan
from attent.selection.selector import Selector
from pydantic import ValidationError

E, N = 21, 40
FREE = SelectionConfig(
    strategy="soft",
    soft_logits="raw",
    rescore=True,  # as the vit preset sets it: free scores still run no pass
    scores="training",
    ratio={"kind": "incremental", "start": 0.2, "end": 0.8},
    interval={"kind": "cycles", "cycles": 4, "start": 1, "end": 4},
)


def no_pass(indices):
    raise AssertionError(f"a scoring pass of {indices.numel()} samples ran")


def train(selector: Selector, epoch: int, losses: torch.Tensor, score_fn=no_pass) -> torch.Tensor:
    subset = selector.begin_epoch(epoch, score_fn).clone()
    selector.update(losses[subset], subset)
    selector.end_epoch()
    return subset


def test_a_cycle_ranks_by_the_full_data_epochs_before_it_and_runs_no_pass():
    selector = Selector(range(N), selection=FREE, epochs=E, seed=0)
    full_losses = torch.arange(N, dtype=torch.float) + 1.0
    plan = build_plan(FREE, E)
    for epoch in range(E):
        # a subset epoch's losses differ from every full-data epoch's, and must not be scores
        losses = full_losses * (epoch + 1) if plan[epoch].all_data or epoch == 0 else -full_losses
        subset = train(selector, epoch, losses)
        if plan[epoch].all_data or epoch == 0:
            assert subset.numel() == N
            last_full = losses
        else:
            assert subset.numel() < N
        assert torch.equal(selector.scores, last_full)  # the latest full-data epoch's, never a subset's
    assert sum(1 for p in plan if p.selects) == 10  # ten re-draws, and not one pass
    assert selector.seconds["scoring"] == 0.0


def test_a_pass_scores_only_the_samples_no_full_data_epoch_scored():
    selector = Selector(range(N), selection=FREE.model_copy(update={"warmup_epochs": 0}), epochs=E, seed=0)
    asked = []

    def score_fn(indices):
        asked.append(indices.clone())
        yield indices, torch.ones(indices.numel())

    selector.begin_epoch(0, score_fn)  # no warm-up: nothing is scored yet
    assert torch.equal(asked[0], torch.arange(N))
    assert "free scores" in build_plan(FREE, E).label


def test_free_scores_need_the_cycles_full_data_epochs():
    with pytest.raises(ValidationError, match="scores: training .* interval kind cycles"):
        SelectionConfig(preset="vit", scores="training")
