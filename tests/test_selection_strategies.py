"""Pure selection functions: hard top-k, soft Gumbel-top-k, random, weighted sampling, budget.

Statistical tests use fixed generator seeds (so they are deterministic) and bounds of several
standard deviations (so a change of RNG stream does not make them flaky); each bound is far
tighter than the gap to the wrong behaviour it guards against.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attent.selection import topk
from attent.selection.strategies import STRATEGIES, budget, select, weighted_sample

FAST = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def reference_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Sort-based top-k: a stable descending sort keeps equal scores in index order, so ties
    go to the lower index."""
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[:k].sort().values


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


LAYOUTS = ["random", "ascending", "descending", "few_values", "constant", "strided_adversary", "spikes"]


def make_layout(layout: str, n: int, stride: int, seed: int) -> torch.Tensor:
    g = gen(seed)
    if layout == "random":
        return torch.randn(n, generator=g)
    if layout == "ascending":
        return torch.arange(n, dtype=torch.float32)
    if layout == "descending":
        return torch.arange(n, 0, -1, dtype=torch.float32)
    if layout == "few_values":
        return torch.randint(0, 4, (n,), generator=g).float()
    if layout == "constant":
        return torch.full((n,), 2.5)
    if layout == "strided_adversary":  # the strided sample only sees the large values
        keys = torch.zeros(n)
        keys[::stride] = 1.0
        return keys
    keys = torch.rand(n, generator=g)  # spikes: a few huge outliers
    keys[torch.randint(0, n, (5,), generator=g)] = 1e9
    return keys


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(LAYOUTS), n=st.integers(4097, 20_000), seed=st.integers(0, 2**16),
       frac=st.floats(0.0, 1.0))
def test_sampled_threshold_path_is_exact(layout, n, seed, frac):
    """With a small sample size the bracketing path (normally only for N > 1M) runs on small N;
    it must return the exact top-k for every layout, including ones where the bracket misses."""
    old, topk.SAMPLE = topk.SAMPLE, 256  # paths switch at N > 16 * 256 = 4096
    try:
        keys = make_layout(layout, n, n // topk.SAMPLE, seed)
        k = min(n, max(1, round(frac * n)))
        assert torch.equal(topk.kth_largest(keys, k), torch.sort(keys, descending=True).values[k - 1])
        assert torch.equal(select(keys, k, "hard"), reference_top_k(keys, k))
    finally:
        topk.SAMPLE = old


def test_sampled_threshold_uses_the_band_and_falls_back(monkeypatch):
    """The bracket narrows the exact search for ordinary data, and falls back to a full
    search (still exact) when the strided sample misrepresents the data."""
    monkeypatch.setattr(topk, "SAMPLE", 4096)  # paths switch at N > 65536
    calls = []
    real = torch.kthvalue

    def spy(t, *a, **kw):
        calls.append(t.numel())
        return real(t, *a, **kw)

    monkeypatch.setattr(torch, "kthvalue", spy)
    n = 200_000
    keys = torch.randn(n, generator=gen(1))
    assert torch.equal(select(keys, n // 2, "hard"), reference_top_k(keys, n // 2))
    assert len(calls) == 1 and calls[0] < n // 5  # only a narrow band was searched
    calls.clear()
    keys = make_layout("strided_adversary", n, n // 4096, 0)
    k = n // 2
    assert torch.equal(select(keys, k, "hard"), reference_top_k(keys, k))
    assert calls[-1] == n  # fell back to the whole input


def test_hard_large_input_with_ties_above_one_million():
    """The real sampled path (N > 16 * 2**16) with heavy ties."""
    n = 16 * topk.SAMPLE + 12_345
    scores = torch.randint(0, 50, (n,), generator=gen(3)).float()
    order = torch.sort(scores, descending=True, stable=True).indices
    for k in (7_777, n // 2 + 1):
        assert torch.equal(select(scores, k, "hard"), order[:k].sort().values)


# --- large CPU inputs: the streamed paths return what the whole-tensor path returns ------------
def whole_tensor_keys(scores, strategy, temperature, generator):
    """The keys of the whole-tensor path (the code all sizes used before streaming): the Gumbel
    noise from ``torch.rand`` scaled and added in place, or the uniform keys themselves."""
    if strategy == "hard":
        return scores
    if strategy == "soft":
        noise = topk.gumbel(scores.numel(), generator, scores.dtype, scores.device)
        return noise.mul_(temperature).add_(scores)
    return torch.rand(scores.numel(), generator=generator)


def test_uniform_bits_reproduce_torch_rand():
    """The integer kernel the streamed soft and random paths draw from gives torch.rand's values
    and leaves the generator where torch.rand leaves it (odd sizes, across refills of the
    Mersenne Twister's 624-word state)."""
    assert topk.uniform_bits_match()  # on this torch build the streamed paths are the ones in use
    tiny = torch.finfo(torch.float32).tiny
    for n in (1, 2, 623, 624, 625, 1251, 100_003, 300_001):
        g, reference = gen(n), gen(n)
        expected = torch.rand(n, generator=reference)
        bits = topk.uniform_bits(n, g)
        assert torch.equal(torch.from_numpy(bits).float() * 2.0 ** -24, expected)
        assert torch.equal(g.get_state(), reference.get_state())
        assert torch.equal(torch.from_numpy(topk.uniform_f32(n, g, tiny)),
                           torch.rand(n, generator=reference).clamp_(min=tiny))
        assert torch.equal(g.get_state(), reference.get_state())


def test_streamed_selection_equals_whole_tensor_path(monkeypatch):
    """Above 16 * _SAMPLE scores (2M here, not a multiple of the block size) every strategy takes
    the streamed path and returns the indices of the whole-tensor path, bit for bit, and consumes
    the same random numbers: selection histories replay across the change. Scores on a 0.01 grid
    make ties common (and the 24-bit uniform keys of ``random`` tie too)."""
    streamed = []
    real = topk.top_k_blocks
    monkeypatch.setattr(topk, "top_k_blocks", lambda *a, **kw: streamed.append(1) or real(*a, **kw))
    n = 2_000_003
    scores = torch.randint(0, 1000, (n,), generator=gen(5)).float() * 0.01
    for strategy, temperature in [("hard", 1.0), ("soft", 1.0), ("soft", 0.3), ("random", 1.0)]:
        reference = gen(11)
        keys = whole_tensor_keys(scores, strategy, temperature, reference)
        order = torch.sort(keys, descending=True, stable=True).indices
        for k in (1, 777, n // 2, n - 5, n):
            g = gen(11)
            got = select(scores, k, strategy, temperature=temperature, generator=g)
            assert torch.equal(got, order[:k].sort().values), (strategy, temperature, k)
            if strategy != "hard":
                assert torch.equal(g.get_state(), reference.get_state())
    assert len(streamed) == 4 * 5


def test_streamed_default_generator_float64_views_and_weights():
    """The streamed paths with the global generator, float64 and non-contiguous scores, and
    weighted_sample's float64 keys with -inf for zero weights."""
    n = 16 * topk.SAMPLE + 4_321
    scores = torch.randn(n, generator=gen(2))
    for strategy in ("soft", "random"):
        with torch.random.fork_rng():
            torch.manual_seed(4)
            got = select(scores, n // 3, strategy)
            torch.manual_seed(4)
            keys = whole_tensor_keys(scores, strategy, 1.0, None)
        assert torch.equal(got, reference_top_k(keys, n // 3))
    wide = torch.randn(2 * n, generator=gen(3), dtype=torch.float64)
    assert torch.equal(select(wide[::2], 1234, "hard"), reference_top_k(wide[::2], 1234))
    weights = torch.rand(n, generator=gen(6), dtype=torch.float64)
    weights[::3] = 0.0
    keys = torch.log(weights) + topk.gumbel(n, gen(8), torch.float64, weights.device)
    assert torch.equal(weighted_sample(weights, n // 2, generator=gen(8)), reference_top_k(keys, n // 2))


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(LAYOUTS), strategy=st.sampled_from(STRATEGIES), n=st.integers(4097, 12_000),
       block=st.sampled_from([257, 1000, 4096]), seed=st.integers(0, 2**16), frac=st.floats(0.0, 1.0))
def test_streamed_blocks_exact_for_every_layout(layout, strategy, n, block, seed, frac):
    """With a small sample and small blocks the streamed passes run on small N, across many block
    boundaries: exact for every layout and strategy, including heavy ties (tie blocks found from
    the band) and brackets that miss (ties searched block by block)."""
    old = topk.SAMPLE, topk.BLOCK
    topk.SAMPLE, topk.BLOCK = 256, block  # streamed at N > 16 * 256 = 4096
    try:
        scores = make_layout(layout, n, n // 256, seed)
        k = min(n, max(1, round(frac * n)))
        keys = whole_tensor_keys(scores, strategy, 0.5, gen(seed))
        got = select(scores, k, strategy, temperature=0.5, generator=gen(seed))
        assert torch.equal(got, reference_top_k(keys, k))
    finally:
        topk.SAMPLE, topk.BLOCK = old


# --- output format, all strategies ------------------------------------------------------------
@FAST
@given(values=st.one_of(tied_scores, any_scores), strategy=st.sampled_from(STRATEGIES),
       seed=st.integers(0, 1000), data=st.data())
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
    view = base[::2]                                   # non-contiguous
    grad = base[::2].clone().requires_grad_(True)      # e.g. losses not yet detached
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
        not torch.equal(select(scores, k, "soft", temperature=0.1, generator=gen(s)),
                        select(scores, k, "soft", temperature=10.0, generator=gen(s)))
        for s in range(20))
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
@given(weights=st.lists(st.sampled_from([0.0, 0.0, 1e-9, 0.5, 1.0, 7.0]), min_size=1, max_size=40)
       .filter(lambda w: any(x > 0 for x in w)), seed=st.integers(0, 1000), data=st.data())
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


@pytest.mark.parametrize("weights,k", [
    (torch.tensor([1.0, -1.0, 2.0]), 1),             # negative weight
    (torch.tensor([1.0, float("nan")]), 1),          # NaN
    (torch.tensor([1.0, float("inf")]), 1),          # inf
    (torch.ones(2, 2), 1),                           # 2-D
    (torch.tensor([1.0, 0.0, 0.0]), 2),              # k > positive weights
    (torch.zeros(3), 1),                             # nothing drawable
    (torch.ones(3), 0),                              # k < 1
    (torch.ones(3), 1.5),                            # k not int
    (torch.ones(0), 1),                              # empty
])
def test_weighted_sample_rejects_bad_input(weights, k):
    with pytest.raises(ValueError):
        weighted_sample(weights, k, generator=gen(0))


# --- budget ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,ratio,expected", [
    (100, 0.7, 70), (10, 0.7, 7), (10, 1.0, 10), (10, 0.01, 1), (1, 0.5, 1), (1000, 0.2, 200), (3, 0.5, 2),
])
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


# --- bad input to select -------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("scores,k", [
    (torch.tensor([1.0, float("nan"), 2.0]), 1),
    (torch.tensor([1.0, float("inf"), 2.0]), 1),
    (torch.tensor([1.0, -float("inf")]), 1),
    (torch.tensor([]), 1),
    (torch.ones(2, 3), 1),                # 2-D
    (torch.tensor(1.0), 1),               # 0-D
    (torch.arange(5), 1),                 # integer scores
    (torch.ones(5), 0),                   # k < 1
    (torch.ones(5), -1),
    (torch.ones(5), 6),                   # k > N
    (torch.ones(5), 2.0),                 # k not int
    (torch.ones(5), 2.5),
    (torch.ones(5), True),                # bool is not a count
    (torch.ones(5), None),
])
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
