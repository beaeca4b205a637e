"""The selection's collectives: observations all-gathered so every rank holds the same score
table, sums over ranks, and the check that every rank chose the same subset."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .strategies import subset_checksum


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _device() -> torch.device:
    """Where a collective's tensors live: NCCL reduces on the GPU, gloo on the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sums(values: torch.Tensor) -> torch.Tensor:
    """Each value of a 1-D float64 tensor summed over the ranks (the values themselves without a
    process group), on the CPU."""
    if not is_distributed():
        return values.cpu()
    tensor = values.to(_device(), torch.float64)
    dist.all_reduce(tensor)
    return tensor.cpu()


def all_agree(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (itself without a process group): one small all-reduce."""
    if not is_distributed():
        return flag
    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return bool(tensor.item())


def agreed_checksum(subset: torch.Tensor) -> float:
    """The subset's checksum, verified equal on every rank: the ranks' Selectors must never
    diverge (a silent divergence would train ranks on different data)."""
    checksum = subset_checksum(subset)
    if is_distributed():
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, checksum)
        if len(set(gathered)) != 1:
            raise RuntimeError(f"ranks selected different subsets (checksums {gathered})")
    return checksum


def all_gather_observations(indices: torch.Tensor, losses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate every rank's observations in rank order (identical on all ranks).
    ``losses`` is [n] or [n, C] (per-component losses).

    Ranks may hold different counts (the last batch, uneven shards), so sizes are exchanged
    first and tensors padded to the largest.
    """
    if not is_distributed():
        return indices, losses
    device = _device()
    world = dist.get_world_size()
    count = torch.tensor([indices.numel()], dtype=torch.long, device=device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    counts = [int(c) for c in counts]
    longest = max(counts)
    padded_idx = torch.zeros(longest, dtype=torch.long, device=device)
    padded_loss = torch.zeros((longest, *losses.shape[1:]), dtype=torch.float32, device=device)
    padded_idx[: indices.numel()] = indices.to(device)
    padded_loss[: losses.shape[0]] = losses.to(device, torch.float32)  # rows, not elements: losses may be [n, C]
    all_idx = [torch.empty_like(padded_idx) for _ in range(world)]
    all_loss = [torch.empty_like(padded_loss) for _ in range(world)]
    dist.all_gather(all_idx, padded_idx)
    dist.all_gather(all_loss, padded_loss)
    return (
        torch.cat([t[:c] for t, c in zip(all_idx, counts)]).cpu(),
        torch.cat([t[:c] for t, c in zip(all_loss, counts)]).cpu(),
    )
