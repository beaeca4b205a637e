"""An epoch's selection metrics (``Selector.metrics``) from the Selector's sums over the epoch: the
rows the engine logs and the integrations report, under ``metric_names``. Its own module beside
the Selector, whose private sums it reads (``end_epoch`` merges them across ranks first); it
imports nothing of the Selector (the Selector imports it)."""

from __future__ import annotations

import math

import torch

from . import metric_names as names
from .distributed import all_reduce_sums


def merged_sums(selector) -> tuple[float, float, float, float, float, float, list[float]]:
    """The epoch's sums over every rank (a collective): (loss sum, samples seen in training, of
    them with a finite loss, scored, trained with padding counted once, non-finite losses left out
    of the scores, component loss sums)."""
    loss_sum = selector._loss_sum
    loss_sum = loss_sum if torch.is_tensor(loss_sum) else torch.tensor(0.0, dtype=torch.float64)
    device = loss_sum.device
    components = selector._component_sums
    if components is None:
        components = torch.zeros(len(selector.components), dtype=torch.float64, device=device)
    counted = torch.as_tensor(selector._counted, dtype=torch.float64, device=device).reshape(1)
    counts = [
        selector._seen,
        selector._scored,
        selector.sampler.recorded(),
        selector._skipped - selector._skipped_before,
    ]
    counts = torch.tensor(counts, dtype=torch.float64, device=device)
    totals = all_reduce_sums(torch.cat([loss_sum.reshape(1), counted, counts, components.to(device)]))
    loss_sum, counted, seen, scored, trained, nonfinite, *component_sums = totals.tolist()
    return loss_sum, seen, counted, scored, trained, nonfinite, component_sums


def epoch_metrics(selector, loss_sum: float, seen: float, component_sums: list[float], nonfinite: float) -> dict:
    """The metrics row of the Selector's latest epoch, from its sums (over ranks once merged):
    ``seen`` the samples with a finite loss the sums are over."""
    last = selector.history[-1] if selector.history else None
    row = {
        names.EPOCH: selector.next_epoch,
        names.SELECTED_RATIO: selector.subset.numel() / selector.num_samples,
        names.SELECTED: selector.subset.numel(),
        names.SELECTION_HARDNESS: last.hardness if last else math.nan,
        names.SELECTION_OVERLAP: last.overlap if last else math.nan,
        names.SCORE_AGREEMENT: last.score_agreement if last else math.nan,
        names.SAMPLES_BACKPROPAGATED: selector.samples_backpropagated,
        names.SAMPLES_FORWARDED: selector.samples_forwarded,
        names.SAMPLES_SCORED: selector._scored,
        names.SAMPLES_NONFINITE: nonfinite,
        names.TRAIN_LOSS: loss_sum / seen if seen else math.nan,
        names.SUBSET_CHECKSUM: selector._checksum,
    }
    sums = component_sums or [0.0] * len(selector.components)
    for name, total, weight in zip(selector.components, sums, selector.component_weights.tolist()):
        row[names.component_loss_metric(name)] = total / max(seen, 1)
        row[names.component_weight_metric(name)] = weight
    return row
