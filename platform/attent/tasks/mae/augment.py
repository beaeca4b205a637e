"""The fine-tuning augmentations of the Multi-Modal MAE downstream jobs (``task.augmentation``),
applied to the items the data module yields (``{"index", "label", "rgb": [3, S, S] normalised,
"depth": [1, S, S] metres, "semseg": [S, S] ids}``), so they need nothing of how files are read:

    crop          the pretraining's own: a random resized crop and a horizontal flip, drawn in
                  the data module (``data.augment_images``); nothing is added here
    lsj           large scale jittering (Ghiasi et al., 2021), the paper's for NYUv2 semseg and
                  depth (its fine-tuning table), as MultiMAE's fine-tuning code draws it: a
                  horizontal flip, a resize by a factor drawn uniformly from [0.1, 2.0], padding
                  on the right and bottom up to S, and a random S x S crop; the same geometry on
                  every modality (RGB bilinear, depth and semseg nearest). Padding is grey 128 in
                  RGB (MultiMAE's pad colour), 0 in depth (invalid) and 255 in semseg (ignored),
                  so padded pixels carry no loss and no metric.
    rand_augment  the crop, then RandAugment on RGB: 2 operations at magnitude 9 (torchvision's),
                  standing in for the paper's Rand(9, 0.5) on ImageNet-S50 (timm's
                  ``rand-m9-mstd0.5``, which also jitters the magnitude with std 0.5)

Each draw comes from torch's global generator, as ``data.augment_images``' (seeded per
DataLoader worker).
"""

from __future__ import annotations

from typing import Any

import torch
import torchvision.transforms.v2.functional as TF
from torch.utils.data import Dataset
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import RandAugment

from attent.tasks.mae.data import IGNORE_INDEX, IMAGENET_MEAN, IMAGENET_STD

LSJ_SCALE = (0.1, 2.0)  # MultiMAE's RandomScale(scale_limit=(0.1 - 1, 2.0 - 1))
RGB_PAD = 128  # MultiMAE's pad colour (grey), before normalisation
RAND_AUGMENT_OPS, RAND_AUGMENT_MAGNITUDE = 2, 9

_MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
_STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


def data_side(augmentation: str) -> bool:
    """Whether the data module's own augmentation (the crop and flip) runs first."""
    return augmentation != "lsj"


def _resize(t: torch.Tensor, size: int, key: str) -> torch.Tensor:
    if key == "rgb":
        return TF.resize(t, [size, size], interpolation=InterpolationMode.BILINEAR, antialias=True)
    return TF.resize(t, [size, size], interpolation=InterpolationMode.NEAREST_EXACT)


def large_scale_jitter(item: dict[str, Any], scale: tuple[float, float] = LSJ_SCALE) -> dict[str, Any]:
    """One LSJ draw on a square item (see the module docstring); the item's size is kept."""
    size = item["rgb"].shape[-1]
    flip = bool(torch.rand(()) < 0.5)
    factor = scale[0] + (scale[1] - scale[0]) * float(torch.rand(()))
    scaled = max(1, round(size * factor))
    pad = max(0, size - scaled)
    top, left = (int(torch.randint(0, max(0, scaled - size) + 1, ())) for _ in range(2))
    fills = {
        "rgb": (RGB_PAD / 255 - _MEAN) / _STD,  # [3, 1, 1]: grey in normalised units
        "depth": torch.zeros(1, 1, 1),
        "semseg": torch.full((1, 1, 1), IGNORE_INDEX),
    }
    out = dict(item)
    for key in ("rgb", "depth", "semseg"):
        if key not in item:
            continue
        t = item[key]
        t = t[None].to(torch.uint8) if key == "semseg" else t  # ids 0..255: nearest resize in uint8
        if flip:
            t = t.flip(-1)
        t = _resize(t, scaled, key)
        if pad:
            canvas = fills[key].to(t.dtype).expand(t.shape[0], size, size).clone()
            canvas[:, :scaled, :scaled] = t  # the image top-left, padding right and bottom
            t = canvas
        t = t[:, top : top + size, left : left + size]
        out[key] = t[0].long() if key == "semseg" else t.contiguous()
    return out


_RAND_AUGMENT = RandAugment(num_ops=RAND_AUGMENT_OPS, magnitude=RAND_AUGMENT_MAGNITUDE)


def rand_augment(item: dict[str, Any]) -> dict[str, Any]:
    """RandAugment on the RGB image (uint8 in between, as RandAugment expects); other
    modalities untouched (classification reads RGB only)."""
    rgb = ((item["rgb"] * _STD + _MEAN) * 255).round().clamp(0, 255).to(torch.uint8)
    rgb = _RAND_AUGMENT(rgb).float() / 255
    return {**item, "rgb": (rgb - _MEAN) / _STD}


_APPLY = {"lsj": large_scale_jitter, "rand_augment": rand_augment}


class Augmented(Dataset):
    """A multi-modal dataset's items with a fine-tuning augmentation on top (``lsj`` on the
    unaugmented items, ``rand_augment`` after the data module's crop). Indices, labels,
    subsets and the unaugmented copy are the dataset's."""

    def __init__(self, dataset, augmentation: str):
        if augmentation not in _APPLY:
            raise ValueError(f"augmentation {augmentation!r} adds nothing here; choose one of {sorted(_APPLY)}")
        self.dataset, self.augmentation = dataset, augmentation

    @property
    def labels(self) -> torch.Tensor:
        return self.dataset.labels

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _APPLY[self.augmentation](self.dataset[i])

    def select(self, indices: torch.Tensor) -> Augmented:
        return Augmented(self.dataset.select(indices), self.augmentation)

    def without_augmentation(self):
        return self.dataset.without_augmentation()
