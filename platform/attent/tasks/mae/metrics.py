"""Downstream evaluation metrics of the Multi-Modal MAE workload: classification, semantic
segmentation and depth, as torchmetrics ``Metric`` objects.

Evaluation runs sharded over ranks (rank r evaluates items r, r + world, ...). Every metric here
keeps only *sum* states (a confusion matrix, counts, sums) and reduces them over the whole
evaluation set, so ``compute()`` gives the same value on every rank and the same value as one
process evaluating everything: torchmetrics all-gathers and sums the states in ``compute()``
whenever a ``torch.distributed`` process group is initialised. ``compute()`` is then a collective
call: every rank must call it (a rank whose shard was empty too; its states are zeros).

- classification: ``top1_accuracy`` = correct / items, torchmetrics ``MulticlassAccuracy``
  (``average="micro"``, top-1 of the logits).
- semantic segmentation: ``miou`` = mean over the classes *present* of the dataset-level IoU
  TP / (TP + FP + FN), from one confusion matrix accumulated over all evaluated pixels
  (torchmetrics ``MulticlassJaccardIndex``, ``average="macro"``, ``zero_division=0``). See
  ``build_metrics`` for what "present" means and why that torchmetrics metric fits.
- depth: ``delta1`` and ``abs_rel`` over all valid pixels of the evaluation set (pixel-weighted:
  every valid pixel counts once, a mean over pixels, *not* a mean of per-image values), each a
  torchmetrics ``MeanMetric`` of a per-pixel quantity with float64 sums. A pixel is valid where
  the ground truth is finite and > 0 (0 marks missing depth). Predictions are clamped to at least
  ``MIN_DEPTH`` (1e-3 m) before the ratios, so a prediction <= 0 scores as a (very wrong) depth of
  1 mm instead of giving inf/NaN. A NaN prediction stays NaN in ``abs_rel`` (and counts as a miss
  in ``delta1``): a broken model shows, rather than being dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchmetrics import Metric
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

METRIC_NAMES = {"classification": ("top1_accuracy",), "semseg": ("miou",), "depth": ("delta1", "abs_rel")}
LOWER_IS_BETTER = {"abs_rel"}

MIN_DEPTH = 1e-3  # metres: predictions are clamped to at least this before ratios
DELTA1_THRESHOLD = 1.25
# (prediction, target) -> per metric name, the arguments of its update()
UpdateInputs = Callable[[torch.Tensor, torch.Tensor], dict[str, tuple[torch.Tensor, ...]]]


class DownstreamMetrics:
    """The metrics of one downstream task (``METRIC_NAMES[kind]``), fed by ``update`` with one
    batch of model outputs and targets and read by ``compute`` (synced over ranks)."""

    def __init__(self, kind: str, metrics: dict[str, Metric], inputs: UpdateInputs):
        self.kind = kind
        self.metrics = metrics  # name -> torchmetrics Metric, in METRIC_NAMES[kind] order
        self._inputs = inputs

    def update(self, prediction: torch.Tensor, target: torch.Tensor) -> None:
        """classification: logits [B, C], target [B] long; semseg: logits [B, C, H, W], target
        [B, H, W] long (ignore_index pixels ignored); depth: prediction and target [B, 1, H, W]
        in metres (target 0 = invalid)."""
        for name, args in self._inputs(prediction.detach(), target.detach()).items():
            self.metrics[name].update(*args)

    def compute(self) -> dict[str, float]:
        """``{name: value}`` over everything updated so far, on all ranks when torch.distributed
        is initialised (a collective: every rank must call it). NaN where nothing was evaluated."""
        return {name: float(metric.compute()) for name, metric in self.metrics.items()}

    def reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()

    def to(self, device: torch.device | str) -> DownstreamMetrics:
        for metric in self.metrics.values():
            metric.to(device)
        return self

    def __repr__(self) -> str:
        return f"DownstreamMetrics({self.kind!r}, {list(self.metrics)})"


def build_metrics(kind: str, *, num_classes: int | None = None, ignore_index: int = 255) -> DownstreamMetrics:
    """The metrics of downstream task ``kind`` (``classification``, ``semseg`` or ``depth``).

    ``num_classes`` is required for classification and semseg; ``ignore_index`` applies to semseg
    targets only (classification has no ignore label, so 255 stays a valid class of a
    1000-class problem) and must not be a class id.

    Semantic segmentation mIoU -- which classes count: a class counts when it occurs, over the
    whole evaluation set, in the ground truth or in the predictions at non-ignored pixels; a
    class that occurs in neither has IoU 0/0 and is left out of the mean (it is not averaged in
    as 0), while a class that is only predicted has IoU 0 and counts. Pixels labelled
    ``ignore_index`` are dropped with their predictions (a prediction there is no false
    positive). This is the usual (mmsegmentation) definition: NaN-mean of the per-class IoUs of
    the dataset confusion matrix.

    What torchmetrics 1.9 does, checked against its source: ``MulticlassJaccardIndex`` keeps one
    [C, C] confusion matrix (state reduced by sum over ranks), drops target == ignore_index
    pixels before counting (an ignore_index >= C is fine), and with ``average="macro"`` gives
    weight 0 to classes whose confusion-matrix row and column are both empty -- exactly the
    classes absent from ground truth and predictions -- so the macro mean is over the classes
    present. (With ``average="none"`` such a class reads 0 with ``zero_division=0``, and with
    ``zero_division=nan`` the macro mean becomes NaN, so neither is used.)
    ``torchmetrics.segmentation.MeanIoU`` does not fit: it has no ignore_index (a 255 label
    raises) and it averages per-image IoUs (classes present per image) instead of the
    dataset-level IoU.
    """
    if kind not in METRIC_NAMES:
        raise ValueError(f"unknown downstream metrics kind {kind!r}: one of {sorted(METRIC_NAMES)}")
    if kind == "depth":
        return _depth_metrics()
    if num_classes is None or num_classes < 1:
        raise ValueError(f"{kind} metrics need num_classes >= 1, got {num_classes!r}")
    if kind == "classification":
        accuracy = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        return DownstreamMetrics(
            kind, {"top1_accuracy": accuracy}, lambda logits, labels: {"top1_accuracy": (logits, labels)}
        )
    if 0 <= ignore_index < num_classes:
        raise ValueError(f"ignore_index {ignore_index} is a class id (num_classes={num_classes})")
    jaccard = MulticlassJaccardIndex(num_classes, average="macro", ignore_index=ignore_index, zero_division=0.0)
    return DownstreamMetrics(kind, {"miou": jaccard}, lambda logits, labels: {"miou": (_semseg_labels(logits), labels)})


def _semseg_labels(logits: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] logits -> [B, H, W] predicted classes (already labels: left as they are)."""
    return logits.argmax(dim=1) if logits.is_floating_point() else logits


def _depth_metrics() -> DownstreamMetrics:
    metrics = {name: MeanMetric(nan_strategy="disable").set_dtype(torch.float64) for name in METRIC_NAMES["depth"]}
    return DownstreamMetrics("depth", metrics, _depth_inputs)


def _depth_inputs(prediction: torch.Tensor, target: torch.Tensor) -> dict[str, tuple[torch.Tensor]]:
    """Per valid pixel (finite target > 0): whether max(pred/gt, gt/pred) < 1.25, and
    |pred - gt| / gt, with pred clamped to at least MIN_DEPTH."""
    if prediction.shape != target.shape:
        raise ValueError(f"depth prediction {tuple(prediction.shape)} and target {tuple(target.shape)} differ in shape")
    valid = torch.isfinite(target) & (target > 0)
    gt = target[valid].double()
    pred = prediction[valid].double().clamp(min=MIN_DEPTH)
    ratio = torch.maximum(pred / gt, gt / pred)
    return {"delta1": ((ratio < DELTA1_THRESHOLD).double(),), "abs_rel": ((pred - gt).abs() / gt,)}
