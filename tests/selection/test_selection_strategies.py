"""Pure selection functions: hard top-k, soft Gumbel-top-k, random, weighted sampling, budget.

Statistical tests use fixed generator seeds (so they are deterministic) and bounds of several
standard deviations (so a change of RNG stream does not make them flaky); each bound is far
tighter than the gap to the wrong behaviour it guards against.
"""

from __future__ import annotations

import math

import pytest
import torch
from attent.selection.strategies import STRATEGIES, select
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.selection_reference import FAST, gen, reference_top_k


def inclusion_counts(scores, k, strategy, draws, *, temperature=1.0, seed=0) -> torch.Tensor:
    g = gen(seed)
    counts = torch.zeros(scores.numel())
    for _ in range(draws):
        counts[select(scores, k, strategy, temperature=temperature, generator=g)] += 1
    return counts


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra = a.argsort().argsort().double()
    rb = b.argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


# --- scores: small sets of values so that ties are common ---------------------------------------
tied_scores = st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0]), min_size=1, max_size=80)
any_scores = st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=80)


# --- hard --------------------------------------------------------------------------------------
@FAST
@given(values=st.one_of(tied_scores, any_scores), data=st.data())
def test_hard_is_exact_top_k_with_ties_to_lower_index(values, data):
    scores = torch.tensor(values, dtype=torch.float32)
    k = data.draw(st.integers(1, scores.numel()))
    got = select(scores, k, "hard")
    assert torch.equal(got, reference_top_k(scores, k))


@FAST
@given(values=tied_scores, data=st.data())
def test_hard_float64_and_permutation_consistency(values, data):
    scores = torch.tensor(values, dtype=torch.float64)
    k = data.draw(st.integers(1, scores.numel()))
    got = select(scores, k, "hard")
    assert torch.equal(got, reference_top_k(scores, k))
    # every selected score >= every unselected score
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    mask[got] = True
    if k < scores.numel():
        assert scores[mask].min() >= scores[~mask].max()


def test_hard_all_equal_takes_first_k():
    assert select(torch.zeros(10), 4, "hard").tolist() == [0, 1, 2, 3]
    assert select(torch.ones(1), 1, "hard").tolist() == [0]
    assert select(torch.arange(10.0), 10, "hard").tolist() == list(range(10))


# --- output format, all strategies ------------------------------------------------------------
@FAST
@given(
    values=st.one_of(tied_scores, any_scores),
    strategy=st.sampled_from(STRATEGIES),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_result_is_k_distinct_sorted_valid_indices(values, strategy, seed, data):
    scores = torch.tensor(values)
    k = data.draw(st.integers(1, scores.numel()))
    got = select(scores, k, strategy, temperature=0.7, generator=gen(seed))
    assert got.dtype == torch.long and got.ndim == 1 and got.numel() == k
    assert bool((got[1:] > got[:-1]).all())  # strictly ascending, hence distinct
    assert 0 <= int(got.min()) and int(got.max()) < scores.numel()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_accepts_views_grad_and_float64(strategy):
    base = torch.randn(400, generator=gen(0), dtype=torch.float64)
    view = base[::2]  # non-contiguous
    grad = base[::2].clone().requires_grad_(True)  # e.g. losses not yet detached
    a = select(view, 50, strategy, generator=gen(1))
    b = select(grad, 50, strategy, generator=gen(1))
    c = select(view.contiguous(), 50, strategy, generator=gen(1))
    assert torch.equal(a, b) and torch.equal(a, c) and a.dtype == torch.long
    if strategy == "hard":
        assert torch.equal(a, reference_top_k(view, 50))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_k_equal_n_selects_everything(strategy):
    assert select(torch.randn(17), 17, strategy, generator=gen(0)).tolist() == list(range(17))


# --- soft ---------------------------------------------------------------------------------------
def test_soft_inclusion_frequency_rises_with_score():
    n, k, draws = 20, 5, 1000
    scores = torch.linspace(0.0, 4.0, n)[torch.randperm(n, generator=gen(9))]  # not index-ordered
    counts = inclusion_counts(scores, k, "soft", draws, temperature=1.0, seed=1)
    assert counts.sum() == k * draws
    assert spearman(scores, counts) > 0.95
    # ordered buckets of 5 by score: bucket means strictly increase
    order = scores.argsort()
    buckets = counts[order].reshape(4, 5).mean(1)
    assert bool((buckets[1:] > buckets[:-1]).all())
    # and it is not hard: the lowest-scored samples still get drawn sometimes
    assert counts[order[:5]].sum() > 0


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_soft_first_draw_matches_softmax(temperature):
    """k = 1: P(i) = softmax(scores / T)_i. T != 1, so a temperature that is ignored fails."""
    scores = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 0.25])
    draws = 3000
    counts = inclusion_counts(scores, 1, "soft", draws, temperature=temperature, seed=2)
    p = torch.softmax(scores.double() / temperature, 0)
    freq = counts.double() / draws
    sigma = (p * (1 - p) / draws).sqrt()
    assert bool(((freq - p).abs() < 5 * sigma).all()), (freq, p)
    chi2 = float(((counts.double() - draws * p) ** 2 / (draws * p)).sum())
    assert chi2 < 35.9  # df = 5, p-value 1e-6


def test_soft_second_draw_follows_without_replacement():
    """k = 2 inclusion probability of the top sample matches successive sampling from softmax."""
    scores = torch.tensor([2.0, 1.0, 0.0])
    p = torch.softmax(scores.double(), 0)
    # P(0 included) = p0 + sum_{j != 0} p_j * p0 / (1 - p_j)
    p_incl0 = p[0] + p[1] * p[0] / (1 - p[1]) + p[2] * p[0] / (1 - p[2])
    draws = 2000
    counts = inclusion_counts(scores, 2, "soft", draws, temperature=1.0, seed=5)
    sigma = math.sqrt(p_incl0 * (1 - p_incl0) / draws)
    assert abs(counts[0] / draws - float(p_incl0)) < 5 * sigma


@FAST
@given(n=st.integers(1, 300), seed=st.integers(0, 2**20), data=st.data())
def test_soft_tiny_temperature_equals_hard(n, seed, data):
    k = data.draw(st.integers(1, n))
    # distinct scores with a gap of 1e-2 >> T * max|Gumbel| (about 1e-6 * 17)
    scores = torch.randperm(n, generator=gen(seed)).float() * 1e-2 - 1.0
    got = select(scores, k, "soft", temperature=1e-6, generator=gen(seed))
    assert torch.equal(got, select(scores, k, "hard"))


def test_soft_tiny_temperature_no_overflow_on_large_scores():
    scores = torch.tensor([3e38, -3e38, 1e30, 0.0, 2e38])
    got = select(scores, 2, "soft", temperature=1e-30, generator=gen(0))
    assert got.tolist() == [0, 4]


def test_soft_huge_temperature_is_uniform():
    n, k, draws = 10, 3, 2000
    scores = torch.linspace(0.0, 5.0, n)  # e^5 ~ 150x preference at T = 1
    counts = inclusion_counts(scores, k, "soft", draws, temperature=1e6, seed=3)
    p = k / n
    sigma = math.sqrt(p * (1 - p) / draws)
    freq = counts / draws
    assert float((freq - p).abs().max()) < 5 * sigma
    # the same scores at T = 1 are far from uniform
    counts1 = inclusion_counts(scores, k, "soft", 500, temperature=1.0, seed=3)
    assert float((counts1 / 500 - p).abs().max()) > 20 * sigma


def test_temperature_acts_on_the_distribution():
    """The authors' bug: the temperature divided already-perturbed keys, so it could not change
    the top-k. Here T = 0.1 concentrates on the best samples and T = 10 spreads out."""
    n, k, draws = 12, 3, 800
    scores = torch.linspace(0.0, 1.0, n)
    cold = inclusion_counts(scores, k, "soft", draws, temperature=0.1, seed=4) / draws
    hot = inclusion_counts(scores, k, "soft", draws, temperature=10.0, seed=4) / draws
    total_variation = float((cold - hot).abs().sum()) / (2 * k)
    assert total_variation > 0.3
    top3 = slice(n - 3, n)
    assert float(cold[top3].mean()) > 0.8
    assert float(hot[top3].mean()) < 0.4
    # and with the very same noise (same seed), the two temperatures pick different subsets
    differ = sum(
        not torch.equal(
            select(scores, k, "soft", temperature=0.1, generator=gen(s)),
            select(scores, k, "soft", temperature=10.0, generator=gen(s)),
        )
        for s in range(20)
    )
    assert differ >= 10


# --- random ------------------------------------------------------------------------------------
def test_random_is_uniform_and_ignores_scores():
    n, k, draws = 10, 3, 2000
    scores = torch.linspace(-100.0, 100.0, n)
    counts = inclusion_counts(scores, k, "random", draws, seed=6)
    p = k / n
    sigma = math.sqrt(p * (1 - p) / draws)
    assert float((counts / draws - p).abs().max()) < 5 * sigma
    chi2 = float(((counts - draws * p) ** 2 / (draws * p)).sum())
    assert chi2 < 2 * 33.7  # df = 9, p 1e-5 is 33.7; inclusion counts are correlated (k = 3): x2 margin


def test_random_large_n_uniform_over_positions():
    n, k = 100_000, 20_000
    got = select(torch.arange(n, dtype=torch.float32), k, "random", generator=gen(7))
    per_decile = torch.bincount(got // (n // 10), minlength=10).double()
    assert float((per_decile - k / 10).abs().max()) < 6 * math.sqrt(k / 10)


# --- determinism -------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_same_seed_same_result(strategy):
    scores = torch.randn(1000, generator=gen(0))
    a = select(scores, 500, strategy, generator=gen(42))
    b = select(scores, 500, strategy, generator=gen(42))
    assert torch.equal(a, b)


@pytest.mark.parametrize("strategy", ["soft", "random"])
def test_different_seeds_differ(strategy):
    scores = torch.randn(1000, generator=gen(0))
    results = {tuple(select(scores, 500, strategy, generator=gen(s)).tolist()) for s in range(5)}
    assert len(results) == 5


def test_generator_state_advances():
    g = gen(0)
    scores = torch.randn(100)
    assert not torch.equal(select(scores, 50, "soft", generator=g), select(scores, 50, "soft", generator=g))


# --- bad input to select -------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    "scores,k",
    [
        (torch.tensor([1.0, float("nan"), 2.0]), 1),
        (torch.tensor([1.0, float("inf"), 2.0]), 1),
        (torch.tensor([1.0, -float("inf")]), 1),
        (torch.tensor([]), 1),
        (torch.ones(2, 3), 1),  # 2-D
        (torch.tensor(1.0), 1),  # 0-D
        (torch.arange(5), 1),  # integer scores
        (torch.ones(5), 0),  # k < 1
        (torch.ones(5), -1),
        (torch.ones(5), 6),  # k > N
        (torch.ones(5), 2.0),  # k not int
        (torch.ones(5), 2.5),
        (torch.ones(5), True),  # bool is not a count
        (torch.ones(5), None),
    ],
)
def test_select_rejects_bad_input(strategy, scores, k):
    with pytest.raises(ValueError):
        select(scores, k, strategy, generator=gen(0))


def test_select_rejects_non_tensor_and_unknown_strategy():
    with pytest.raises(ValueError):
        select([1.0, 2.0], 1, "hard")
    with pytest.raises(ValueError, match="unknown selection strategy"):
        select(torch.ones(5), 1, "gumbel")
    with pytest.raises(ValueError):
        select(torch.ones(5), 1, "HARD")


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf"), -float("inf")])
def test_soft_rejects_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        select(torch.ones(5), 2, "soft", temperature=temperature, generator=gen(0))


def test_nan_message_names_the_indices():
    scores = torch.zeros(10)
    scores[[3, 7]] = float("nan")
    with pytest.raises(ValueError, match=r"2 scores .*\[3, 7\]"):
        select(scores, 2, "hard")
