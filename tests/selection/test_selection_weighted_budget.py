"""weighted_sample (frequencies, zero weights, bad input) and the selection budget (rounding, bounds, bad ratios)."""

from __future__ import annotations

import math

import pytest
import torch
from attent.selection.schedules import budget
from attent.selection.strategies import weighted_sample
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.selection_reference import FAST, gen


# --- weighted_sample ---------------------------------------------------------------------------
def test_weighted_sample_frequencies_proportional_to_weights():
    weights = torch.tensor([1.0, 2.0, 0.0, 4.0, 8.0, 0.0, 1.0])
    draws = 2500
    g = gen(8)
    counts = torch.zeros(weights.numel())
    for _ in range(draws):
        counts[weighted_sample(weights, 1, generator=g)] += 1
    p = (weights / weights.sum()).double()
    freq = counts.double() / draws
    assert counts[2] == 0 and counts[5] == 0
    sigma = (p * (1 - p) / draws).sqrt()
    assert bool(((freq - p).abs() <= 5 * sigma + 1e-12).all()), (freq, p)


@FAST
@given(
    weights=st.lists(st.sampled_from([0.0, 0.0, 1e-9, 0.5, 1.0, 7.0]), min_size=1, max_size=40).filter(
        lambda w: any(x > 0 for x in w)
    ),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_weighted_sample_never_draws_zero_weights(weights, seed, data):
    w = torch.tensor(weights, dtype=torch.float64)
    positive = int((w > 0).sum())
    k = data.draw(st.integers(1, positive))
    got = weighted_sample(w, k, generator=gen(seed))
    assert got.numel() == k and bool((w[got] > 0).all())
    assert bool((got[1:] > got[:-1]).all())
    if k == positive:
        assert torch.equal(got, (w > 0).nonzero().squeeze(1))


def test_weighted_sample_uniform_weights_is_uniform():
    n, k, draws = 8, 2, 1500
    g = gen(9)
    counts = torch.zeros(n)
    for _ in range(draws):
        counts[weighted_sample(torch.ones(n), k, generator=g)] += 1
    p = k / n
    assert float((counts / draws - p).abs().max()) < 5 * math.sqrt(p * (1 - p) / draws)


@pytest.mark.parametrize(
    "weights,k",
    [
        (torch.tensor([1.0, -1.0, 2.0]), 1),  # negative weight
        (torch.tensor([1.0, float("nan")]), 1),  # NaN
        (torch.tensor([1.0, float("inf")]), 1),  # inf
        (torch.ones(2, 2), 1),  # 2-D
        (torch.tensor([1.0, 0.0, 0.0]), 2),  # k > positive weights
        (torch.zeros(3), 1),  # nothing drawable
        (torch.ones(3), 0),  # k < 1
        (torch.ones(3), 1.5),  # k not int
        (torch.ones(0), 1),  # empty
    ],
)
def test_weighted_sample_rejects_bad_input(weights, k):
    with pytest.raises(ValueError):
        weighted_sample(weights, k, generator=gen(0))


# --- budget ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n,ratio,expected",
    [(100, 0.7, 70), (10, 0.7, 7), (10, 1.0, 10), (10, 0.01, 1), (1, 0.5, 1), (1000, 0.2, 200), (3, 0.5, 2)],
)
def test_budget(n, ratio, expected):
    assert budget(n, ratio) == expected


@given(n=st.integers(1, 10**7), ratio=st.floats(1e-9, 1.0))
@settings(deadline=None)
def test_budget_within_bounds(n, ratio):
    k = budget(n, ratio)
    assert 1 <= k <= n and abs(k - ratio * n) <= max(0.5, 1 - ratio * n) + 1e-9


@pytest.mark.parametrize("ratio", [0, 0.0, -0.1, 1.5, float("nan"), float("inf"), "0.5", None])
def test_budget_rejects_bad_ratio(ratio):
    with pytest.raises(ValueError):
        budget(100, ratio)
