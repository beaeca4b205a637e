"""What the selection tests compare against: seeded generators, a sort-based top-k, and Hypothesis' quick settings."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings

FAST = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def reference_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Sort-based top-k: a stable descending sort keeps equal scores in index order, so ties
    go to the lower index."""
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[:k].sort().values
