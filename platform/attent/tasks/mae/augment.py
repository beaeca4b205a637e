"""The fine-tuning augmentations of the Multi-Modal MAE downstream jobs (``task.augmentation``),
applied to the items the data module yields (``{"index", "label", "rgb", "depth", "semseg"}``:
the model's floats, RGB normalised and depth in metres, or the stored integers, uint8 RGB and
uint16 depth; semseg ids [S, S]), so they need nothing of how files are read or stored:

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

from attent.tasks.mae.data import IMAGENET_MEAN, IMAGENET_STD
from attent.tasks.mae.files import IGNORE_INDEX

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
    if t.dtype not in (torch.uint8, torch.float32):  # e.g. stored uint16 depth: nearest keeps the values
        return TF.resize(t.float(), [size, size], interpolation=InterpolationMode.NEAREST_EXACT).to(t.dtype)
    return TF.resize(t, [size, size], interpolation=InterpolationMode.NEAREST_EXACT)


def _pad_value(key: str, t: torch.Tensor) -> torch.Tensor:
    """[C, 1, 1] fill of a modality in ``t``'s dtype: stored integers (uint8 RGB) or the model's
    floats (normalised RGB), depth 0 and semseg 255 either way."""
    if key == "rgb":
        grey = torch.full((3, 1, 1), float(RGB_PAD)) if not t.is_floating_point() else (RGB_PAD / 255 - _MEAN) / _STD
        return grey.to(t.dtype)
    return torch.full((1, 1, 1), 0 if key == "depth" else IGNORE_INDEX, dtype=t.dtype)


def large_scale_jitter(item: dict[str, Any], scale: tuple[float, float] = LSJ_SCALE) -> dict[str, Any]:
    """One LSJ draw on a square item (see the module docstring); the item's size and dtypes are
    kept, for the model's floats and for stored integers alike."""
    size = item["rgb"].shape[-1]
    flip = bool(torch.rand(()) < 0.5)
    factor = scale[0] + (scale[1] - scale[0]) * float(torch.rand(()))
    scaled = max(1, round(size * factor))
    pad = max(0, size - scaled)
    top, left = (int(torch.randint(0, max(0, scaled - size) + 1, ())) for _ in range(2))
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
            canvas = _pad_value(key, t).expand(t.shape[0], size, size).clone()
            canvas[:, :scaled, :scaled] = t  # the image top-left, padding right and bottom
            t = canvas
        t = t[:, top : top + size, left : left + size]
        out[key] = t[0].to(item[key].dtype) if key == "semseg" else t.contiguous()
    return out


_RAND_AUGMENT = RandAugment(num_ops=RAND_AUGMENT_OPS, magnitude=RAND_AUGMENT_MAGNITUDE)


def rand_augment(item: dict[str, Any]) -> dict[str, Any]:
    """RandAugment on the RGB image (on uint8, as RandAugment expects: stored integers as they
    are, the model's floats converted there and back); other modalities untouched
    (classification reads RGB only)."""
    if not item["rgb"].is_floating_point():
        return {**item, "rgb": _RAND_AUGMENT(item["rgb"])}
    rgb = ((item["rgb"] * _STD + _MEAN) * 255).round().clamp(0, 255).to(torch.uint8)
    rgb = _RAND_AUGMENT(rgb).float() / 255
    return {**item, "rgb": (rgb - _MEAN) / _STD}


_APPLY = {"lsj": large_scale_jitter, "rand_augment": rand_augment}


class Augmented(Dataset):
    """A multi-modal dataset's items with a fine-tuning augmentation on top (``lsj`` on the
    unaugmented items, ``rand_augment`` after the data module's crop). Indices, labels, subsets,
    the item kind (``with_integers``) and the unaugmented copy are the dataset's; any other
    attribute is read from it."""

    def __init__(self, dataset, augmentation: str):
        if augmentation not in _APPLY:
            raise ValueError(f"augmentation {augmentation!r} adds nothing here; choose one of {sorted(_APPLY)}")
        self.dataset, self.augmentation = dataset, augmentation

    def __getattr__(self, name: str) -> Any:  # only for names not found on the wrapper
        if name.startswith("__") or name in ("dataset", "augmentation"):  # unpickling: no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _APPLY[self.augmentation](self.dataset[i])

    def select(self, indices: torch.Tensor) -> Augmented:
        return Augmented(self.dataset.select(indices), self.augmentation)

    def with_integers(self, integers: bool = True) -> Augmented:
        return Augmented(self.dataset.with_integers(integers), self.augmentation)

    def without_augmentation(self):
        return self.dataset.without_augmentation()
