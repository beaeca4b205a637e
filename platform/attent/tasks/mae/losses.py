"""Per-sample reconstruction losses on the hidden patches: MSE for RGB, L1 for depth,
cross-entropy for semseg. Each sample's loss is its own (a masked mean over its own hidden
patches and valid pixels), never a batch mean: the score of a sample must not depend on the
batch it sits in."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attent.tasks.mae.config import NORM_RGB, MaskedAutoencoderSpec
from attent.tasks.mae.files import IGNORE_INDEX
from attent.tasks.mae.model import patchify, semseg_at

DEPTH_EPS = 1e-6


def standardize_depth(depth: torch.Tensor) -> torch.Tensor:
    """Each image's valid depths (> 0) to zero mean, unit std (MultiMAE's depth input and
    target: scale-free, so near and far scenes weigh alike); invalid pixels become 0."""
    valid = depth > 0
    count = valid.sum(dim=(1, 2, 3), keepdim=True).clamp_min(1)
    mean = (depth * valid).sum(dim=(1, 2, 3), keepdim=True) / count
    var = (((depth - mean) * valid) ** 2).sum(dim=(1, 2, 3), keepdim=True) / count
    return torch.where(valid, (depth - mean) / (var.sqrt() + DEPTH_EPS), torch.zeros_like(depth))


def masked_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-sample weighted mean over patches: values, weights [B, N] -> [B] (0 without weight)."""
    return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1e-8)


def rgb_loss(pred: torch.Tensor, rgb: torch.Tensor, hidden: torch.Tensor, patch: int, norm_pix: bool) -> torch.Tensor:
    target = patchify(rgb, patch)
    if norm_pix:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1e-6).sqrt()
    per_patch = ((pred.float() - target) ** 2).mean(dim=-1)
    return masked_mean(per_patch, hidden.float())


def depth_loss(pred: torch.Tensor, depth: torch.Tensor, hidden: torch.Tensor, patch: int) -> torch.Tensor:
    valid = patchify((depth > 0).float(), patch)  # [B, N, p*p]
    target = patchify(standardize_depth(depth), patch)
    error = ((pred.float() - target).abs() * valid).sum(dim=-1)  # [B, N]
    return (error * hidden).sum(dim=1) / (valid.sum(dim=-1) * hidden).sum(dim=1).clamp_min(1)


def semseg_loss(
    pred: torch.Tensor, labels: torch.Tensor, hidden: torch.Tensor, patch: int, classes: int
) -> torch.Tensor:
    b, n, _ = pred.shape
    target = patchify(labels[:, None].float(), patch).long()  # [B, N, p*p]
    # classes last, one row per pixel: cross-entropy over a contiguous [pixels, C] runs about twice
    # as fast on a CPU as over the class dimension of [B, C, N, p*p] (0.27 s -> 0.14 s forward and
    # backward at B=4, 224 px, 133 classes), with the same values
    logits = pred.float().reshape(-1, classes)
    ce = F.cross_entropy(logits, target.reshape(-1), reduction="none", ignore_index=IGNORE_INDEX).reshape(b, n, -1)
    valid = (target != IGNORE_INDEX).float()
    return (ce.sum(dim=-1) * hidden).sum(dim=1) / (valid.sum(dim=-1) * hidden).sum(dim=1).clamp_min(1)


def reconstruction_losses(
    predictions: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    hidden: torch.Tensor,
    *,
    spec: MaskedAutoencoderSpec,
    norm_pix: bool,
) -> torch.Tensor:
    """[B, M]: each sample's loss per modality, in the order of ``spec.modalities``, at the size the
    model ``spec`` predicts each at (semseg's at ``spec.semseg_stride`` times fewer pixels a side).
    RGB's is the RGB decoder's (normalised patches when ``norm_pix``), plus the extra ``norm_rgb``
    decoder's on normalised patches where the model has one (MultiMAE sums the two alike)."""
    columns = []
    for i, modality in enumerate(spec.modalities):
        own = hidden[:, i * spec.patches : (i + 1) * spec.patches].float()
        pred, patch = predictions[modality], spec.pixel_patch(modality)
        if modality == "rgb":
            loss = rgb_loss(pred, batch["rgb"], own, patch, norm_pix)
            if NORM_RGB in predictions:
                loss = loss + rgb_loss(predictions[NORM_RGB], batch["rgb"], own, patch, norm_pix=True)
            columns.append(loss)
        elif modality == "depth":
            columns.append(depth_loss(pred, batch["depth"], own, patch))
        else:
            labels = semseg_at(batch["semseg"], spec.semseg_stride)
            columns.append(semseg_loss(pred, labels, own, patch, spec.semseg_classes))
    return torch.stack(columns, dim=1)
