"""Large inputs: the sampled-threshold and streamed top-k paths return exactly what the whole-tensor path returns."""

from __future__ import annotations

import torch
from attent.selection import topk
from attent.selection.strategies import STRATEGIES, select, weighted_sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.selection_reference import gen, reference_top_k

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
@given(
    layout=st.sampled_from(LAYOUTS), n=st.integers(4097, 20_000), seed=st.integers(0, 2**16), frac=st.floats(0.0, 1.0)
)
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
        assert torch.equal(torch.from_numpy(bits).float() * 2.0**-24, expected)
        assert torch.equal(g.get_state(), reference.get_state())
        assert torch.equal(
            torch.from_numpy(topk.uniform_f32(n, g, tiny)), torch.rand(n, generator=reference).clamp_(min=tiny)
        )
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
@given(
    layout=st.sampled_from(LAYOUTS),
    strategy=st.sampled_from(STRATEGIES),
    n=st.integers(4097, 12_000),
    block=st.sampled_from([257, 1000, 4096]),
    seed=st.integers(0, 2**16),
    frac=st.floats(0.0, 1.0),
)
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
