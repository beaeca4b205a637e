"""Pure selection functions: which k of N samples the learner sees next.

All functions return the chosen indices as a LongTensor sorted ascending (a set, not a ranking), so
results compare exactly across ranks and resumes. They run in O(N), with no sort of all N and no
``topk``: the noise, one pass that brackets the k-th largest key by a strided sample and gathers
the band around it, an exact search in that band, one pass that writes the indices.

Cost on one core (1 torch thread, k = N/2, a 2-vCPU AMD EPYC VM shared with other work; median
of 3 calls, ``benchmarks/results/selection_scaling.md``): 10M scores take 0.04 s hard, 0.08 s
random, 0.11 s soft; 100M take 0.34 s, 0.72 s and 1.8 s (fastest call 0.95 s). At 100M soft
needs ~1.0 s of user CPU, most of it the noise, which is kept bit for bit what torch.rand and two
logs give (resumed runs replay their selections): ~0.29 s for the Mersenne-Twister draws, ~0.24 s
for the logs; the rest of its wall-clock is first-touch page faults of two fresh 400 MB buffers
(noise, indices) and waiting for the core.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .schedules import check_ratio

STRATEGIES = ("hard", "soft", "random")


def budget(num_samples: int, ratio: float) -> int:
    """Number of samples a ratio keeps: round(ratio * N), at least 1."""
    check_ratio(ratio)
    return max(1, min(num_samples, round(ratio * num_samples)))




def select(scores: torch.Tensor, k: int, strategy: str, *, temperature: float = 1.0,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick k distinct indices of ``scores`` (1-D, finite).

    - ``hard``: exactly the k largest scores; ties broken towards the lower index.
    - ``soft``: Gumbel-top-k, i.e. k draws without replacement with probabilities proportional to
      softmax(scores / temperature). T -> 0 gives ``hard``, T -> inf gives ``random``.
    - ``random``: k uniform draws without replacement.
    """
    _check_scores(scores)
    scores = scores.detach()  # a choice of indices: never part of an autograd graph
    n = scores.numel()
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n:
        raise ValueError(f"k must be an integer in [1, {n}] (the number of scores), got {k!r}")
    if strategy == "hard":
        return _top_k(scores, k)
    if strategy == "soft":
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
        # argmax(s/T + G) == argmax(s + T*G) for T > 0: scaling the noise instead of the scores
        # keeps tiny temperatures from overflowing to inf. The noise must be added *before* any
        # ordering; dividing already-perturbed keys by T (the authors' code) changes nothing.
        if (_streams(n, scores) and scores.dtype == torch.float32 and _uniform_bits_match()
                and temperature <= torch.finfo(torch.float32).max):
            return _soft_blocks(scores, k, temperature, generator)  # the same keys, streamed
        gumbel = _gumbel(n, generator, scores.dtype, scores.device)
        return _top_k(gumbel.mul_(temperature).add_(scores), k)  # scores + T*G, in place
    if strategy == "random":
        if n > 16 * _SAMPLE and scores.device.type == "cpu" and _uniform_bits_match():
            # torch.rand(n) == bits * 2**-24 exactly, so the top k of the 24-bit integers are the top k
            # of the uniform keys: same stream, same indices, no conversion to float
            return _top_k_blocks(_uniform_bits(n, generator), k)
        keys = torch.rand(n, generator=generator, dtype=torch.float32, device=scores.device)
        return _top_k(keys, k)
    raise ValueError(f"unknown selection strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def weighted_sample(weights: torch.Tensor, k: int, *,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """k distinct indices drawn without replacement with probability proportional to ``weights``
    (successive draws, the Efraimidis-Spirakis / Gumbel-top-k scheme). Zero weights are never drawn."""
    if weights.ndim != 1 or not torch.isfinite(weights).all() or (weights < 0).any():
        raise ValueError("weights must be a 1-D tensor of finite, non-negative numbers")
    positive = int((weights > 0).sum())
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= positive:
        raise ValueError(f"k must be an integer in [1, {positive}] (the positive weights), got {k!r}")
    gumbel = _gumbel(weights.numel(), generator, torch.float64, weights.device)
    return _top_k(torch.log(weights.double()) + gumbel, k)


def _check_scores(scores: torch.Tensor) -> None:
    if not isinstance(scores, torch.Tensor) or scores.ndim != 1 or scores.numel() == 0:
        raise ValueError("scores must be a non-empty 1-D tensor")
    if not scores.is_floating_point():
        raise ValueError(f"scores must be floating point, got {scores.dtype}")
    lowest, highest = torch.aminmax(scores.detach())  # one pass; NaN propagates, inf shows at an end
    if not (math.isfinite(lowest) and math.isfinite(highest)):
        bad = (~torch.isfinite(scores)).nonzero().squeeze(1)
        raise ValueError(f"{bad.numel()} scores are NaN or infinite (first at indices "
                         f"{bad[:5].tolist()}); check the per-sample losses")


def _gumbel(n: int, generator, dtype, device) -> torch.Tensor:
    # Gumbel(0,1) = -log(-log U). U = 0 would give -inf (a sample never drawn): clamp it away.
    u = torch.rand(n, generator=generator, dtype=dtype, device=device)
    return u.clamp_(min=torch.finfo(dtype).tiny).log_().neg_().log_().neg_()


def _top_k(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (ascending) of the k largest keys, ties broken towards the lower index.

    torch.topk breaks ties arbitrarily and costs a partial sort; instead find the exact k-th
    largest value, take everything above it, then the lowest-index keys equal to it.
    """
    if _streams(keys.numel(), keys):
        return _top_k_blocks(_numpy(keys), k)
    threshold = _kth_largest(keys, k)
    mask = keys > threshold
    missing = k - int(torch.count_nonzero(mask))
    if missing:
        mask[_nonzero(keys == threshold)[:missing]] = True
    return _nonzero(mask)


def _nonzero(mask: torch.Tensor) -> torch.Tensor:
    """Ascending indices of the True entries of a 1-D bool mask. On CPU numpy's nonzero is
    several times faster than torch's (10M entries: ~25 ms vs ~150 ms on one core)."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy())).long()
    return mask.nonzero().squeeze(1)


_SAMPLE = 1 << 16  # keys sampled to bracket the threshold


def _kth_largest(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The exact k-th largest key. For large inputs a strided sample brackets it, so the exact
    search (kthvalue) runs on a narrow band of keys instead of all N; if the bracket misses
    (an unusual value layout), fall back to kthvalue over everything."""
    n = keys.numel()
    if n <= 16 * _SAMPLE:
        return torch.kthvalue(keys, n - k + 1).values
    if _streams(n, keys):
        return _threshold_blocks(_numpy(keys), k)[0]
    sample = keys[:: n // _SAMPLE].sort(descending=True).values
    m, expected = sample.numel(), k * sample.numel() / n
    margin = 6 * math.sqrt(expected * (1 - k / n)) + 32
    hi_rank, lo_rank = math.floor(expected - margin), math.ceil(expected + margin)
    hi = sample[hi_rank - 1] if hi_rank >= 1 else keys.new_tensor(math.inf)
    lo = sample[lo_rank - 1] if lo_rank <= m else keys.new_tensor(-math.inf)
    above = int(torch.count_nonzero(keys > hi))  # count_nonzero: ~10x faster than bool sum()
    band = keys[_nonzero((keys <= hi) & (keys >= lo))]
    needed = k - above
    if not 1 <= needed <= band.numel():
        return torch.kthvalue(keys, n - k + 1).values
    return torch.kthvalue(band, band.numel() - needed + 1).values


# --- large CPU inputs: the same results, in cache-sized blocks -----------------------------------
# Above 16 * _SAMPLE keys on CPU the threshold search and the index extraction stream over the keys
# in blocks of _BLOCK (512 KB of float32, stays in cache): no full-size masks or copies, one pass
# to count above the bracket and gather the band, one to write the indices (100M float32 keys,
# k = N/2: ~0.13 s + ~0.12 s on one core, against ~1.8 s for kthvalue over all N). Large buffers
# come from numpy, which asks the kernel for transparent huge pages (torch's allocator does not):
# first-touch page faults of 400 MB then typically cost ~0.05 s instead of ~0.15-0.2 s here.

_BLOCK = 1 << 17  # keys per block of the streaming passes
_STREAM_DTYPES = (torch.float32, torch.float64)


def _streams(n: int, keys: torch.Tensor) -> bool:
    return n > 16 * _SAMPLE and keys.device.type == "cpu" and keys.dtype in _STREAM_DTYPES


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().resolve_conj().resolve_neg().numpy()


def _aligned_empty(n: int, dtype) -> np.ndarray:
    """An uninitialised numpy buffer, 64-byte aligned as torch's own allocations are."""
    dtype = np.dtype(dtype)
    raw = np.empty(n * dtype.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + n * dtype.itemsize].view(dtype)


_BITS = 24  # float32 digits: torch.rand(float32) on CPU is (32-bit draw mod 2**24) * 2**-24
_BITS_MATCH: bool | None = None


def _uniform_bits_match() -> bool:
    """Whether ``random_(0, 2**24)`` on int32 reproduces ``torch.rand`` exactly: the same 24-bit
    integers and the same generator state after (checked once per process against this torch
    build, across a Mersenne-Twister refill; if a torch release changes either kernel, the
    streaming noise paths are simply not used)."""
    global _BITS_MATCH
    if _BITS_MATCH is None:
        n = 2 * 624 + 3
        reference, candidate = (torch.Generator().manual_seed(20240229) for _ in range(2))
        expected = torch.rand(n, generator=reference)
        bits = torch.empty(n, dtype=torch.int32).random_(0, 1 << _BITS, generator=candidate)
        _BITS_MATCH = (torch.equal(bits.float() * 2.0 ** -_BITS, expected)
                       and torch.equal(reference.get_state(), candidate.get_state()))
    return _BITS_MATCH


def _uniform_bits(n: int, generator) -> np.ndarray:
    """int32 numpy array B with ``torch.rand(n, generator=generator) == B * 2**-24``, consuming the
    same draws (a third faster than torch.rand: an integer kernel, no float conversion)."""
    bits = _aligned_empty(n, np.int32)
    torch.from_numpy(bits).random_(0, 1 << _BITS, generator=generator)
    return bits


def _uniform_f32(n: int, generator, low: float) -> np.ndarray:
    """``torch.rand(n, generator=generator).clamp_(min=low)`` as a float32 numpy array: the bits
    of _uniform_bits converted in place, block by block through a small buffer (exact: an integer
    below 2**24 times 2**-24)."""
    bits = _uniform_bits(n, generator)
    values = bits.view(np.float32)
    source, target = torch.from_numpy(bits), torch.from_numpy(values)
    buffer = torch.empty(min(_BLOCK, n))
    for start in range(0, n, _BLOCK):
        block = buffer[:min(_BLOCK, n - start)]
        block.copy_(source[start:start + _BLOCK])
        torch.clamp(block.mul_(2.0 ** -_BITS), min=low, out=target[start:start + _BLOCK])
    return values


def _soft_blocks(scores: torch.Tensor, k: int, temperature: float, generator) -> torch.Tensor:
    """The soft branch of ``select`` for large float32 CPU scores, with the same keys bit for bit.
    The noise buffer holds T * (-G) = T * log(-log U) (the logs as whole-tensor ops, as _gumbel
    makes them); the first pass of _top_k_blocks turns it into scores - T * (-G), which equals
    scores + T * G exactly (negation is exact). (A temperature beyond float32's range, where
    T * G can be NaN, stays on the whole-tensor path.)"""
    noise = _uniform_f32(scores.numel(), generator, low=torch.finfo(torch.float32).tiny)
    torch.from_numpy(noise).log_().neg_().log_()
    if temperature != 1.0:  # x * 1.0 == x exactly: the default temperature skips a pass
        torch.from_numpy(noise).mul_(temperature)
    return _top_k_blocks(noise, k, scores=_numpy(scores))


def _top_k_blocks(keys: np.ndarray, k: int, scores: np.ndarray | None = None) -> torch.Tensor:
    """_top_k of a large 1-D CPU array. With ``scores``, ``keys`` holds T * (-G) on entry and is
    replaced by the keys ``scores - keys`` block by block during the first pass."""
    threshold, greater, tie_blocks = _threshold_blocks(keys, k, scores)
    t = keys.dtype.type(threshold.item())
    out = np.empty(k, np.int64)
    mask = np.empty(min(_BLOCK, keys.size), bool)
    missing, pos = k - greater, 0
    for start in range(0, keys.size, _BLOCK):
        block = keys[start:start + _BLOCK]
        m = np.greater(block, t, out=mask[:block.size])
        if missing and (tie_blocks is None or start in tie_blocks):
            take = np.flatnonzero(block == t)[:missing]  # the lowest-index keys equal to t
            m[take] = True
            missing -= take.size
        found = np.flatnonzero(m)
        np.add(found, start, out=out[pos:pos + found.size])
        pos += found.size
    assert pos == k and not missing, (pos, k, missing)
    return torch.from_numpy(out)


def _threshold_blocks(keys: np.ndarray, k: int, scores: np.ndarray | None = None):
    """(t, greater, tie_blocks) for a large 1-D CPU array: t the exact k-th largest key (a 0-d
    tensor, as _kth_largest), greater the number of keys > t, tie_blocks the starts of the blocks
    holding keys equal to t (None when unknown: the bracket missed and kthvalue ran over all keys).

    The strided sample brackets t as in _kth_largest; one pass then counts the keys above the
    bracket and gathers the band inside it, block by block, so that the exact search, the count
    and the blocks holding ties all come from the band."""
    n = keys.size
    step = n // _SAMPLE
    if scores is None:
        sample = torch.from_numpy(keys[::step])
    else:  # the same subtraction the pass below makes, on the sampled positions only
        sample = torch.from_numpy(scores[::step]) - torch.from_numpy(keys[::step])
    sample = sample.sort(descending=True).values
    m, expected = sample.numel(), k * sample.numel() / n
    margin = 6 * math.sqrt(expected * (1 - k / n)) + 32
    hi_rank, lo_rank = math.floor(expected - margin), math.ceil(expected + margin)
    big = np.inf if keys.dtype.kind == "f" else np.iinfo(keys.dtype).max
    small = -np.inf if keys.dtype.kind == "f" else np.iinfo(keys.dtype).min
    hi = keys.dtype.type(sample[hi_rank - 1].item() if hi_rank >= 1 else big)
    lo = keys.dtype.type(sample[lo_rank - 1].item() if lo_rank <= m else small)

    above, bands = 0, []
    size = min(_BLOCK, n)
    over, inside = np.empty(size, bool), np.empty(size, bool)
    for start in range(0, n, _BLOCK):
        block = keys[start:start + _BLOCK]
        if scores is not None:
            np.subtract(scores[start:start + _BLOCK], block, out=block)
        a, b = over[:block.size], inside[:block.size]
        above += np.count_nonzero(np.greater(block, hi, out=a))
        np.greater_equal(block, lo, out=b)
        np.greater(b, a, out=b)  # lo <= key and not key > hi
        bands.append(block[b])

    band = torch.from_numpy(np.concatenate(bands))
    needed = k - above
    if not 1 <= needed <= band.numel():  # the bracket missed: search everything
        threshold = torch.kthvalue(torch.from_numpy(keys), n - k + 1).values
        t = keys.dtype.type(threshold.item())
        greater = sum(np.count_nonzero(keys[s:s + _BLOCK] > t) for s in range(0, n, _BLOCK))
        return threshold, greater, None
    threshold = torch.kthvalue(band, band.numel() - needed + 1).values
    t = keys.dtype.type(threshold.item())
    greater = above + int(np.count_nonzero(band.numpy() > t))
    tie_blocks = {i * _BLOCK for i, part in enumerate(bands) if (part == t).any()}
    return threshold, greater, tie_blocks
