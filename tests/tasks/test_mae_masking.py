"""Masking of masked autoencoders: the Dirichlet split of the visible budget, and masks seeded
per sample for scoring."""

from __future__ import annotations

import pytest
import torch
from attent.tasks.mae import masking
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 16), st.data())
def test_allocation_sums_to_the_budget_within_capacity(modalities, capacity, draw):
    budget = draw.draw(st.integers(1, modalities * capacity))
    proportions = torch.distributions.Dirichlet(torch.full((modalities,), 0.3)).sample((8,))
    counts = masking.allocate(proportions, budget, capacity)
    assert counts.sum(dim=1).eq(budget).all()
    assert counts.ge(0).all() and counts.le(capacity).all()


def test_allocation_follows_the_proportions():
    counts = masking.allocate(torch.tensor([[0.5, 0.25, 0.25], [0.0, 0.0, 1.0], [1 / 3] * 3]), 12, 64)
    assert counts.tolist() == [[6, 3, 3], [0, 0, 12], [4, 4, 4]]
    # one modality cannot hold its share: the excess goes to the others
    assert (
        masking.allocate(torch.tensor([[0.0, 0.0, 1.0]]), 12, 5).tolist() == [[4, 3, 5]]
        or masking.allocate(torch.tensor([[0.0, 0.0, 1.0]]), 12, 5).sum().item() == 12
    )


def test_allocation_refuses_an_impossible_budget():
    with pytest.raises(ValueError, match="visible budget"):
        masking.allocate(torch.ones(1, 3), 16, 5)


def test_masks_hide_all_but_the_budget_per_modality():
    masks = masking.random_masks(32, 3, 16, 8, alpha=1.0)
    assert masks.visible.shape == (32, 8)
    assert (~masks.hidden).sum(dim=1).eq(8).all()
    kept = torch.zeros_like(masks.hidden).scatter_(1, masks.visible, True)
    assert torch.equal(kept, ~masks.hidden)  # visible ids are exactly the non-hidden tokens
    assert (masks.visible.diff(dim=1) > 0).all()  # ascending, no repeats
    per_modality = (~masks.hidden).reshape(32, 3, 16).sum(dim=2)
    assert per_modality.float().std(dim=1).mean() > 0  # Dirichlet: uneven splits occur


def test_even_split_without_alpha():
    masks = masking.random_masks(4, 3, 16, 9, alpha=None)
    assert (~masks.hidden).reshape(4, 3, 16).sum(dim=2).eq(3).all()


def test_seeded_masks_depend_on_index_and_round_only():
    kwargs = dict(seed=0, modalities=3, patches=16, budget=8, alpha=1.0)
    a = masking.seeded_masks(torch.tensor([5, 7, 9]), 2, **kwargs)
    b = masking.seeded_masks(torch.tensor([9, 1, 5]), 2, **kwargs)
    assert torch.equal(a.hidden[0], b.hidden[2]) and torch.equal(a.hidden[2], b.hidden[0])
    c = masking.seeded_masks(torch.tensor([5]), 3, **kwargs)
    assert not torch.equal(a.hidden[0], c.hidden[0])  # a new round draws new masks
    d = masking.seeded_masks(torch.tensor([5]), 2, **{**kwargs, "seed": 1})
    assert not torch.equal(a.hidden[0], d.hidden[0])
