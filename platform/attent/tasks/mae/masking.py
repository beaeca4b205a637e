"""Which patch tokens the encoder sees: random masking (MAE) and the Dirichlet allocation of a
visible-token budget across modalities (MultiMAE).

Tokens of all modalities are numbered in one sequence: modality m's patch j is token m * N + j
(N patches per modality). A mask is a bool tensor [B, M * N], True where the token is hidden.

Training draws from torch's generator (fresh masks each step). Scoring draws per sample from a
generator seeded by (seed, sample index, round): a sample's mask is the same whichever batch it
sits in, and every sample of one scoring round is judged on a mask of its own, fixed for that
round, so scores compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Masks:
    visible: torch.Tensor  # LongTensor[B, budget]: token ids the encoder sees, ascending
    hidden: torch.Tensor  # BoolTensor[B, M * N]: True where the decoder must reconstruct


def allocate(proportions: torch.Tensor, budget: int, capacity: int) -> torch.Tensor:
    """Visible tokens per modality, LongTensor[B, M]: each row sums to ``budget`` exactly, with
    no modality above ``capacity`` (its patch count). Largest-remainder rounding of
    proportions x budget; a modality's excess over capacity goes to those with room."""
    batch, modalities = proportions.shape
    if not 0 < budget <= capacity * modalities:
        raise ValueError(
            f"visible budget {budget} must lie in [1, {capacity * modalities}] "
            f"({modalities} modalities x {capacity} patches)"
        )
    share = proportions.double() / proportions.double().sum(dim=1, keepdim=True) * budget
    counts = share.floor().long()
    remainder = share - counts
    short = budget - counts.sum(dim=1)  # in [0, M)
    order = remainder.argsort(dim=1, descending=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(modalities).expand(batch, -1))
    counts += (rank < short[:, None]).long()
    for _ in range(modalities):  # each pass fills at least one modality up to capacity
        excess = (counts - capacity).clamp_min(0).sum(dim=1)
        if not excess.any():
            break
        counts = counts.clamp_max(capacity)
        room = capacity - counts
        give = torch.minimum(
            room, (room.double() / room.sum(1, keepdim=True).clamp_min(1) * excess[:, None]).ceil().long()
        )
        give = _trim(give, excess)
        counts += give
    return counts


def _trim(give: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """Cut ``give`` (rounded up) so each row sums to ``total``, taking from the last columns."""
    over = give.sum(dim=1) - total
    for column in reversed(range(give.shape[1])):
        cut = torch.minimum(over, give[:, column])
        give[:, column] -= cut
        over -= cut
    return give


def masks_from(counts: torch.Tensor, noise: torch.Tensor) -> Masks:
    """Keep, in each modality, the ``counts[b, m]`` patches with the lowest ``noise[b, m]``."""
    batch, modalities, patches = noise.shape
    rank = noise.argsort(dim=2).argsort(dim=2)  # each patch's position in its modality's order
    keep = rank < counts[:, :, None]
    hidden = ~keep.reshape(batch, modalities * patches)
    budget = int(counts[0].sum())
    visible = (~hidden).nonzero()[:, 1].reshape(batch, budget)  # row-major: ascending ids per row
    return Masks(visible=visible, hidden=hidden)


def random_masks(
    batch: int, modalities: int, patches: int, budget: int, *, alpha: float | None, device: torch.device | str = "cpu"
) -> Masks:
    """Training masks from torch's generator. ``alpha``: Dirichlet concentration of the
    per-sample split of the budget across modalities; None splits it evenly."""
    if alpha is None or modalities == 1:
        proportions = torch.ones(batch, modalities)
    else:
        proportions = torch.distributions.Dirichlet(torch.full((modalities,), float(alpha))).sample((batch,))
    counts = allocate(proportions, budget, patches)
    return _to(masks_from(counts, torch.rand(batch, modalities, patches)), device)


def seeded_masks(
    indices: torch.Tensor,
    round_: int,
    *,
    seed: int,
    modalities: int,
    patches: int,
    budget: int,
    alpha: float | None,
    device: torch.device | str = "cpu",
) -> Masks:
    """Masks fixed by (seed, sample index, round): one numpy generator per sample."""
    proportions, noise = [], []
    for index in indices.tolist():
        rng = np.random.default_rng([seed, int(index), round_ + 1])  # round -1 (evaluation) is allowed
        proportions.append(
            np.ones(modalities)
            if alpha is None or modalities == 1
            else rng.dirichlet(np.full(modalities, float(alpha)))
        )
        noise.append(rng.random((modalities, patches)))
    counts = allocate(torch.as_tensor(np.stack(proportions)), budget, patches)
    return _to(masks_from(counts, torch.as_tensor(np.stack(noise))), device)


def _to(masks: Masks, device: torch.device | str) -> Masks:
    return Masks(visible=masks.visible.to(device), hidden=masks.hidden.to(device))
