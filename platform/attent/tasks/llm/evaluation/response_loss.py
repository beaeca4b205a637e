"""Held-out response loss: the mean cross-entropy of an evaluation suite's reference answers, a
low-noise companion to generation accuracy (lower is better).

Answers are encoded exactly like training examples (same prompt path, template and truncation)
and the loss is the training loss's, token-weighted over all answers: the sum of every response
token's cross-entropy divided by the number of response tokens (a log-perplexity). Each rank
takes every world_size-th answer and the sums are all-reduced, so every rank returns the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from attent.tasks.llm.evaluation.suites import all_reduce_sums
from attent.tasks.llm.loss import FusedLoss, response_loss_sums


def response_loss_totals(
    model: nn.Module,
    dataset: Dataset,
    collate: Callable[[list[Any]], dict[str, torch.Tensor]],
    *,
    batch_size: int,
    chunk_tokens: int,
    fused: FusedLoss = "auto",
    rank: int = 0,
    world_size: int = 1,
) -> tuple[float, int, int]:
    """This rank's (summed response-token cross-entropy, response tokens, answers) over its
    share of ``dataset`` (items i = rank, rank + world_size, ...), without reduction."""
    device = next(model.parameters()).device
    items = [dataset[i] for i in range(rank, len(dataset), world_size)]
    items.sort(key=lambda item: len(item["input_ids"]))  # less padding; the sums do not care
    loss_sum, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(items), batch_size):
            batch = {k: v.to(device) for k, v in collate(items[start : start + batch_size]).items()}
            sums, counts = response_loss_sums(model, batch, chunk_tokens=chunk_tokens, fused=fused)
            loss_sum += float(sums.double().sum())
            tokens += int(counts.sum())
    return loss_sum, tokens, len(items)


def run_response_loss(
    name: str,
    model: nn.Module,
    dataset: Dataset,
    collate: Callable[[list[Any]], dict[str, torch.Tensor]],
    *,
    batch_size: int,
    chunk_tokens: int,
    fused: FusedLoss = "auto",
    rank: int = 0,
    world_size: int = 1,
    metric: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """{``metric`` (default ``<name>_test_response_loss``): mean response-token loss over all
    ranks' answers}."""
    loss_sum, tokens, answers = response_loss_totals(
        model,
        dataset,
        collate,
        batch_size=batch_size,
        chunk_tokens=chunk_tokens,
        fused=fused,
        rank=rank,
        world_size=world_size,
    )
    loss_sum, tokens, answers = all_reduce_sums([loss_sum, tokens, answers], next(model.parameters()).device)
    mean = loss_sum / tokens if tokens else 0.0
    if progress:
        progress(f"{name}_loss: response loss {mean:.4f} ({int(tokens)} tokens, {int(answers)} answers)")
    return {metric or f"{name}_test_response_loss": mean}
