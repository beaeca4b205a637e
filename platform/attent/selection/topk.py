"""The kernels behind ``strategies.select``: the indices of the k largest keys, exact and in O(N),
and the noise that turns scores into Gumbel-top-k or uniform keys, drawn bit for bit as
``torch.rand`` draws it (a resumed run replays its selections).

Every function returns the chosen indices as a LongTensor sorted ascending (a set, not a
ranking), ties broken towards the lower index, so results compare exactly across ranks and
resumes. No sort of all N and no ``topk``: one pass brackets the k-th largest key by a strided
sample and gathers the band around it, an exact search runs in that band, one pass writes the
indices. Above 16 * SAMPLE keys on CPU both passes stream over cache-sized blocks.

Cost on one core (1 torch thread, k = N/2, a 2-vCPU AMD EPYC VM shared with other work; median
of 3 calls, ``benchmarks/results/selection_scaling/selection_scaling.md``): 10M scores take 0.04 s hard, 0.08 s
random, 0.11 s soft; 100M take 0.34 s, 0.72 s and 1.8 s (fastest call 0.95 s). At 100M soft
needs ~1.0 s of user CPU, most of it the noise: ~0.29 s for the Mersenne-Twister draws, ~0.24 s
for the logs; the rest of its wall-clock is first-touch page faults of two fresh 400 MB buffers
(noise, indices) and waiting for the core.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def gumbel_top_k(scores: torch.Tensor, k: int, temperature: float, generator) -> torch.Tensor:
    """The k largest keys scores + T * Gumbel noise (finite scores, T > 0). Large float32 CPU
    scores stream (``gumbel_top_k_blocks``: the same keys bit for bit)."""
    n = scores.numel()
    if (
        streams(n, scores)
        and scores.dtype == torch.float32
        and uniform_bits_match()
        and temperature <= torch.finfo(torch.float32).max
    ):
        return gumbel_top_k_blocks(scores, k, temperature, generator)
    noise = gumbel(n, generator, scores.dtype, scores.device)
    return top_k(noise.mul_(temperature).add_(scores), k)  # scores + T*G, in place


def uniform_top_k(n: int, k: int, generator, device: torch.device) -> torch.Tensor:
    """The k largest of n uniform keys ``torch.rand(n, generator=generator)``: k of n uniformly."""
    if n > 16 * SAMPLE and device.type == "cpu" and uniform_bits_match():
        # torch.rand(n) == bits * 2**-24 exactly, so the top k of the 24-bit integers are the top k
        # of the uniform keys: same stream, same indices, no conversion to float
        return top_k_blocks(uniform_bits(n, generator), k)
    return top_k(torch.rand(n, generator=generator, dtype=torch.float32, device=device), k)


def gumbel(n: int, generator, dtype, device) -> torch.Tensor:
    # Gumbel(0,1) = -log(-log U). U = 0 would give -inf (a sample never drawn): clamp it away.
    u = torch.rand(n, generator=generator, dtype=dtype, device=device)
    return u.clamp_(min=torch.finfo(dtype).tiny).log_().neg_().log_().neg_()


def top_k(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (ascending) of the k largest keys, ties broken towards the lower index.

    torch.topk breaks ties arbitrarily and costs a partial sort; instead find the exact k-th
    largest value, take everything above it, then the lowest-index keys equal to it.
    """
    if streams(keys.numel(), keys):
        return top_k_blocks(as_numpy(keys), k)
    threshold = kth_largest(keys, k)
    mask = keys > threshold
    missing = k - int(torch.count_nonzero(mask))
    if missing:
        mask[nonzero(keys == threshold)[:missing]] = True
    return nonzero(mask)


def nonzero(mask: torch.Tensor) -> torch.Tensor:
    """Ascending indices of the True entries of a 1-D bool mask. On CPU numpy's nonzero is
    several times faster than torch's (10M entries: ~25 ms vs ~150 ms on one core)."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy())).long()
    return mask.nonzero().squeeze(1)


SAMPLE = 1 << 16  # keys sampled to bracket the threshold


def kth_largest(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The exact k-th largest key. For large inputs a strided sample brackets it, so the exact
    search (kthvalue) runs on a narrow band of keys instead of all N; if the bracket misses
    (an unusual value layout), fall back to kthvalue over everything."""
    n = keys.numel()
    if n <= 16 * SAMPLE:
        return torch.kthvalue(keys, n - k + 1).values
    if streams(n, keys):
        return threshold_blocks(as_numpy(keys), k)[0]
    sample = keys[:: n // SAMPLE].sort(descending=True).values
    m, expected = sample.numel(), k * sample.numel() / n
    margin = 6 * math.sqrt(expected * (1 - k / n)) + 32
    hi_rank, lo_rank = math.floor(expected - margin), math.ceil(expected + margin)
    hi = sample[hi_rank - 1] if hi_rank >= 1 else keys.new_tensor(math.inf)
    lo = sample[lo_rank - 1] if lo_rank <= m else keys.new_tensor(-math.inf)
    above = int(torch.count_nonzero(keys > hi))  # count_nonzero: ~10x faster than bool sum()
    band = keys[nonzero((keys <= hi) & (keys >= lo))]
    needed = k - above
    if not 1 <= needed <= band.numel():
        return torch.kthvalue(keys, n - k + 1).values
    return torch.kthvalue(band, band.numel() - needed + 1).values


# --- large CPU inputs: the same results, in cache-sized blocks -----------------------------------
# Above 16 * SAMPLE keys on CPU the threshold search and the index extraction stream over the keys
# in blocks of BLOCK (512 KB of float32, stays in cache): no full-size masks or copies, one pass
# to count above the bracket and gather the band, one to write the indices (100M float32 keys,
# k = N/2: ~0.13 s + ~0.12 s on one core, against ~1.8 s for kthvalue over all N). Large buffers
# come from numpy, which asks the kernel for transparent huge pages (torch's allocator does not):
# first-touch page faults of 400 MB then typically cost ~0.05 s instead of ~0.15-0.2 s here.

BLOCK = 1 << 17  # keys per block of the streaming passes
STREAM_DTYPES = (torch.float32, torch.float64)


def streams(n: int, keys: torch.Tensor) -> bool:
    return n > 16 * SAMPLE and keys.device.type == "cpu" and keys.dtype in STREAM_DTYPES


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().resolve_conj().resolve_neg().numpy()


def aligned_empty(n: int, dtype) -> np.ndarray:
    """An uninitialised numpy buffer, 64-byte aligned as torch's own allocations are."""
    dtype = np.dtype(dtype)
    raw = np.empty(n * dtype.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + n * dtype.itemsize].view(dtype)


BITS = 24  # float32 digits: torch.rand(float32) on CPU is (32-bit draw mod 2**24) * 2**-24
BITS_MATCH: bool | None = None


def uniform_bits_match() -> bool:
    """Whether ``random_(0, 2**24)`` on int32 reproduces ``torch.rand`` exactly: the same 24-bit
    integers and the same generator state after (checked once per process against this torch
    build, across a Mersenne-Twister refill; if a torch release changes either kernel, the
    streaming noise paths are simply not used)."""
    global BITS_MATCH
    if BITS_MATCH is None:
        n = 2 * 624 + 3
        reference, candidate = (torch.Generator().manual_seed(20240229) for _ in range(2))
        expected = torch.rand(n, generator=reference)
        bits = torch.empty(n, dtype=torch.int32).random_(0, 1 << BITS, generator=candidate)
        BITS_MATCH = torch.equal(bits.float() * 2.0**-BITS, expected) and torch.equal(
            reference.get_state(), candidate.get_state()
        )
    return BITS_MATCH


def uniform_bits(n: int, generator) -> np.ndarray:
    """int32 numpy array B with ``torch.rand(n, generator=generator) == B * 2**-24``, consuming the
    same draws (a third faster than torch.rand: an integer kernel, no float conversion)."""
    bits = aligned_empty(n, np.int32)
    torch.from_numpy(bits).random_(0, 1 << BITS, generator=generator)
    return bits


def uniform_f32(n: int, generator, low: float) -> np.ndarray:
    """``torch.rand(n, generator=generator).clamp_(min=low)`` as a float32 numpy array: the bits
    of uniform_bits converted in place, block by block through a small buffer (exact: an integer
    below 2**24 times 2**-24)."""
    bits = uniform_bits(n, generator)
    values = bits.view(np.float32)
    source, target = torch.from_numpy(bits), torch.from_numpy(values)
    buffer = torch.empty(min(BLOCK, n))
    for start in range(0, n, BLOCK):
        block = buffer[: min(BLOCK, n - start)]
        block.copy_(source[start : start + BLOCK])
        torch.clamp(block.mul_(2.0**-BITS), min=low, out=target[start : start + BLOCK])
    return values


def gumbel_top_k_blocks(scores: torch.Tensor, k: int, temperature: float, generator) -> torch.Tensor:
    """The soft branch of ``select`` for large float32 CPU scores, with the same keys bit for bit.
    The noise buffer holds T * (-G) = T * log(-log U) (the logs as whole-tensor ops, as gumbel
    makes them); the first pass of top_k_blocks turns it into scores - T * (-G), which equals
    scores + T * G exactly (negation is exact). (A temperature beyond float32's range, where
    T * G can be NaN, stays on the whole-tensor path.)"""
    noise = uniform_f32(scores.numel(), generator, low=torch.finfo(torch.float32).tiny)
    torch.from_numpy(noise).log_().neg_().log_()
    if temperature != 1.0:  # x * 1.0 == x exactly: the default temperature skips a pass
        torch.from_numpy(noise).mul_(temperature)
    return top_k_blocks(noise, k, scores=as_numpy(scores))


def top_k_blocks(keys: np.ndarray, k: int, scores: np.ndarray | None = None) -> torch.Tensor:
    """top_k of a large 1-D CPU array. With ``scores``, ``keys`` holds T * (-G) on entry and is
    replaced by the keys ``scores - keys`` block by block during the first pass."""
    threshold, greater, tie_blocks = threshold_blocks(keys, k, scores)
    t = keys.dtype.type(threshold.item())
    out = np.empty(k, np.int64)
    mask = np.empty(min(BLOCK, keys.size), bool)
    missing, pos = k - greater, 0
    for start in range(0, keys.size, BLOCK):
        block = keys[start : start + BLOCK]
        m = np.greater(block, t, out=mask[: block.size])
        if missing and (tie_blocks is None or start in tie_blocks):
            take = np.flatnonzero(block == t)[:missing]  # the lowest-index keys equal to t
            m[take] = True
            missing -= take.size
        found = np.flatnonzero(m)
        np.add(found, start, out=out[pos : pos + found.size])
        pos += found.size
    assert pos == k and not missing, (pos, k, missing)
    return torch.from_numpy(out)


def threshold_blocks(keys: np.ndarray, k: int, scores: np.ndarray | None = None):
    """(t, greater, tie_blocks) for a large 1-D CPU array: t the exact k-th largest key (a 0-d
    tensor, as kth_largest), greater the number of keys > t, tie_blocks the starts of the blocks
    holding keys equal to t (None when unknown: the bracket missed and kthvalue ran over all keys).

    The strided sample brackets t as in kth_largest; one pass then counts the keys above the
    bracket and gathers the band inside it, block by block, so that the exact search, the count
    and the blocks holding ties all come from the band."""
    n = keys.size
    step = n // SAMPLE
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
    size = min(BLOCK, n)
    over, inside = np.empty(size, bool), np.empty(size, bool)
    for start in range(0, n, BLOCK):
        block = keys[start : start + BLOCK]
        if scores is not None:
            np.subtract(scores[start : start + BLOCK], block, out=block)
        a, b = over[: block.size], inside[: block.size]
        above += np.count_nonzero(np.greater(block, hi, out=a))
        np.greater_equal(block, lo, out=b)
        np.greater(b, a, out=b)  # lo <= key and not key > hi
        bands.append(block[b])

    band = torch.from_numpy(np.concatenate(bands))
    needed = k - above
    if not 1 <= needed <= band.numel():  # the bracket missed: search everything
        threshold = torch.kthvalue(torch.from_numpy(keys), n - k + 1).values
        t = keys.dtype.type(threshold.item())
        greater = sum(np.count_nonzero(keys[s : s + BLOCK] > t) for s in range(0, n, BLOCK))
        return threshold, greater, None
    threshold = torch.kthvalue(band, band.numel() - needed + 1).values
    t = keys.dtype.type(threshold.item())
    greater = above + int(np.count_nonzero(band.numpy() > t))
    tie_blocks = {i * BLOCK for i, part in enumerate(bands) if (part == t).any()}
    return threshold, greater, tie_blocks
