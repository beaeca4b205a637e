"""What every integration checks of the train loader a user hands its framework: that it draws
from the selection's sampler. Imports no framework, so each integration can use it."""

from __future__ import annotations

from typing import Any

ATTRIBUTES = ("sampler", "batch_sampler")  # where a DataLoader (and accelerate's wrapper of one) keeps its sampler


def draws_from(loader: Any, sampler: Any, depth: int = 4) -> bool:
    """Whether ``loader`` draws its samples from ``sampler`` itself (not a copy, not a sampler
    that wraps it).

    Follows ``sampler`` and ``batch_sampler`` attributes down from the loader: a DataLoader's own
    sampler, its batch sampler's, and the shards accelerate wraps them in.

    Args:
        loader: a DataLoader, or a framework's wrapper of one.
        sampler: the selection's sampler (``Selector.sampler``).
        depth: how many attributes deep to look.

    Returns:
        True if ``sampler`` is found at most ``depth`` attributes below ``loader``.

    Examples:
        >>> from torch.utils.data import DataLoader, SequentialSampler
        >>> mine = SequentialSampler(range(8))
        >>> draws_from(DataLoader(range(8), sampler=mine), mine), draws_from(DataLoader(range(8)), mine)
        (True, False)
    """
    if loader is sampler:
        return True
    if depth == 0 or loader is None:
        return False
    return any(draws_from(getattr(loader, name, None), sampler, depth - 1) for name in ATTRIBUTES)
