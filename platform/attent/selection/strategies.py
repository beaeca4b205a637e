"""Which k of N samples the learner sees next: AtteNT's three strategies, and weighted draws for
the baselines. Pure functions; the exact top-k and the noise streams are ``topk``'s."""

from __future__ import annotations

import math

import torch

from .topk import gumbel, gumbel_top_k, top_k, uniform_top_k

STRATEGIES = ("hard", "soft", "random")
SOFT_LOGITS = ("raw", "standardized", "log")


def select(
    scores: torch.Tensor, k: int, strategy: str, *, temperature: float = 1.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """k distinct indices of ``scores``, ascending: AtteNT's pick of the samples a learner sees next.

    - ``hard``: exactly the k largest scores; ties broken towards the lower index.
    - ``soft``: Gumbel-top-k, k draws without replacement with probabilities proportional to
      softmax(scores / T). T -> 0 gives ``hard``, T -> inf gives ``random``.
    - ``random``: k uniform draws without replacement (the scores' values are not read).

    Args:
        scores: the samples' scores (their losses), a non-empty 1-D floating-point tensor of
            finite numbers.
        k: how many samples to pick, an integer in [1, ``scores.numel()``].
        strategy: ``"hard"``, ``"soft"`` or ``"random"``.
        temperature: Soft's T, positive and finite; the other strategies ignore it.
        generator: the random stream of Soft's and Random's draws; None: torch's global one.

    Returns:
        The picked indices into ``scores``, ascending (LongTensor[k]).

    Raises:
        ValueError: scores that are not a non-empty 1-D floating-point tensor or hold NaN or
            infinity (the message names the first indices), a ``k`` out of range, a
            temperature that is not positive and finite, or an unknown strategy.

    Examples:
        >>> scores = torch.tensor([0.1, 0.9, 0.5, 0.7])
        >>> select(scores, 2, "hard").tolist()
        [1, 3]
        >>> len(select(scores, 3, "soft", temperature=0.5, generator=torch.Generator().manual_seed(0)))
        3
    """
    check_scores(scores)
    scores = scores.detach()  # a choice of indices: never part of an autograd graph
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= scores.numel():
        raise ValueError(f"k must be an integer in [1, {scores.numel()}] (the number of scores), got {k!r}")
    if strategy == "hard":
        return top_k(scores, k)
    if strategy == "soft":
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
        # argmax(s/T + G) == argmax(s + T*G) for T > 0: scaling the noise instead of the scores
        # keeps tiny temperatures from overflowing. The noise goes in *before* any ordering;
        # dividing already-perturbed keys by T (the authors' code) changes nothing.
        return gumbel_top_k(scores, k, temperature, generator)
    if strategy == "random":
        return uniform_top_k(scores.numel(), k, generator, scores.device)
    raise ValueError(f"unknown selection strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def soft_logits(scores: torch.Tensor, kind: str) -> torch.Tensor:
    """The logits Soft draws from, softmax(logits / T), made from per-sample scores:

    - ``raw``: the scores themselves (T is in the scores' own units: the paper's form);
    - ``standardized``: centred and divided by their standard deviation, so that T means the same
      on every task and loss scale (an affine rescaling of the scores changes nothing);
    - ``log``: log(score): a sample is drawn with probability proportional to score^(1/T)
      (scores must be >= 0; a zero score is drawn last).
    """
    if kind == "raw":
        return scores
    if kind == "standardized":
        scores = scores.double()
        spread = scores.std() if scores.numel() > 1 else scores.new_tensor(0.0)
        return (scores - scores.mean()) / spread if spread > 0 else torch.zeros_like(scores)
    if kind == "log":
        if (scores < 0).any():
            raise ValueError("soft_logits 'log' needs non-negative scores (losses)")
        return scores.double().clamp_min(torch.finfo(torch.float64).tiny).log()
    raise ValueError(f"unknown soft logits {kind!r}; choose one of {', '.join(SOFT_LOGITS)}")


def hardness(subset: torch.Tensor, scores: torch.Tensor) -> float:
    """How hard a pick of k samples is: the share of it inside the k highest ``scores`` (the hard
    pick), rescaled so that a uniform pick scores 0 in expectation and the hard pick 1. NaN when
    the pick is every sample (nothing to choose)."""
    n, k = scores.numel(), subset.numel()
    if k >= n or k == 0:
        return math.nan
    inside = torch.zeros(n, dtype=torch.bool)
    inside[top_k(scores.detach(), k)] = True
    share = inside[subset].float().mean().item()
    return (share - k / n) / (1 - k / n)


def overlap(subset: torch.Tensor, previous: torch.Tensor | None, num_samples: int) -> float:
    """Share of ``subset`` that was in the ``previous`` pick (NaN for the first pick)."""
    if previous is None or subset.numel() == 0:
        return math.nan
    before = torch.zeros(num_samples, dtype=torch.bool)
    before[previous] = True
    return before[subset].float().mean().item()


def subset_checksum(subset: torch.Tensor) -> float:
    """A number that tells subsets apart (the ``subset_checksum`` metric of the engine and of
    every integration): equal subsets give equal sums, whatever their order."""
    return float((subset.double() * 2.0**-20).sin().sum() + subset.numel())


def soft_weights(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) up to a constant, in float64, floored at the smallest positive double
    so that every sample keeps a chance (a reweighted draw needs pi_i > 0 to weigh 1 / pi_i)."""
    logits = logits.double()
    return ((logits - logits.max()) / temperature).exp().clamp_min(torch.finfo(torch.float64).tiny)


def inclusion_probabilities(weights: torch.Tensor, k: int) -> torch.Tensor:
    """pi_i = min(1, c * w_i) with sum(pi) = k: inclusion proportional to size, capped at 1 (the
    capped samples are always drawn and the rest share the remaining k). Needs k <= the number of
    positive weights."""
    w = weights.double()
    positive = int((w > 0).sum())
    if not 1 <= k <= positive:
        raise ValueError(f"k must lie in [1, {positive}] (the positive weights), got {k}")
    certain = torch.zeros(w.numel(), dtype=torch.bool)
    while True:
        free = ~certain & (w > 0)
        scale = (k - int(certain.sum())) / w[free].sum()
        newly = free & (scale * w >= 1)
        if not newly.any():
            return torch.where(certain, torch.ones_like(w), scale * w)
        certain |= newly


def systematic_sample(pi: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A draw of exactly k = sum(pi) distinct indices in which index i is included with probability
    pi_i exactly (0 <= pi_i <= 1): systematic sampling over a random order (Madow, 1949). Each
    sample owns a stretch of length pi_i of [0, k); k points spaced 1 apart from a uniform start
    pick the owners. Ascending indices."""
    k = round(float(pi.sum()))
    order = torch.randperm(pi.numel(), generator=generator)
    ends = torch.cumsum(pi.double()[order], 0)
    ends *= k / ends[-1]  # the exact total, so the last point falls inside
    points = torch.rand((), generator=generator, dtype=torch.float64) + torch.arange(k, dtype=torch.float64)
    owners = torch.searchsorted(ends, points, right=True).clamp_max(pi.numel() - 1)
    return order[owners].sort().values


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two 1-D tensors (NaN for fewer than 3 pairs or a constant)."""
    if a.numel() < 3:
        return math.nan
    ranks = []
    for x in (a, b):  # ordinal ranks: the inverse of the sorting permutation (one sort, not two)
        order = x.double().argsort()
        ranks.append(
            torch.empty(x.numel(), dtype=torch.float64).scatter_(0, order, torch.arange(x.numel(), dtype=torch.float64))
        )
    ranks = [r - r.mean() for r in ranks]
    spread = float(ranks[0].norm() * ranks[1].norm())
    return float((ranks[0] * ranks[1]).sum()) / spread if spread > 0 else math.nan


def weighted_sample(weights: torch.Tensor, k: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """k distinct indices drawn without replacement with probability proportional to ``weights``
    (successive draws, the Efraimidis-Spirakis / Gumbel-top-k scheme). Zero weights are never drawn."""
    if weights.ndim != 1 or not torch.isfinite(weights).all() or (weights < 0).any():
        raise ValueError("weights must be a 1-D tensor of finite, non-negative numbers")
    positive = int((weights > 0).sum())
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= positive:
        raise ValueError(f"k must be an integer in [1, {positive}] (the positive weights), got {k!r}")
    noise = gumbel(weights.numel(), generator, torch.float64, weights.device)
    return top_k(torch.log(weights.double()) + noise, k)


def check_scores(scores: torch.Tensor) -> None:
    if not isinstance(scores, torch.Tensor) or scores.ndim != 1 or scores.numel() == 0:
        raise ValueError("scores must be a non-empty 1-D tensor")
    if not scores.is_floating_point():
        raise ValueError(f"scores must be floating point, got {scores.dtype}")
    lowest, highest = torch.aminmax(scores.detach())  # one pass; NaN propagates, inf shows at an end
    if not (math.isfinite(lowest) and math.isfinite(highest)):
        bad = (~torch.isfinite(scores)).nonzero().squeeze(1)
        raise ValueError(
            f"{bad.numel()} scores are NaN or infinite (first at indices "
            f"{bad[:5].tolist()}); check the per-sample losses"
        )
