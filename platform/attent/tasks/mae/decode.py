"""Multi-modal files decoded once to their stored integers at S x S, and where they are kept.

``decode`` is the one decoding of a file (shorter side resized to S, centre crop; rgb bilinear
with antialias, depth and semseg nearest): the loaders and ``attent data cache`` both call it,
so a decoded cache holds bitwise what the files give. A split's decoded images live in memory
(``MemoryStore``) or in a decoded cache's memory-mapped arrays (``DiskStore``,
``attent.tasks.cache``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torchvision.transforms import InterpolationMode

from attent.tasks import cache as decoded
from attent.tasks.config import DataError, unreadable
from attent.tasks.mae.files import IGNORE_INDEX

CACHE_LIMIT_BYTES = 200 * 2**20  # without a decoded cache, cache=None decodes a split up front below this size
CACHE_KIND = "multimodal"  # index.json's kind of a decoded cache of this layout
BYTES_PER_PIXEL = {"rgb": 3, "depth": 2, "semseg": 1}  # decoded and stored at img_size
INTERPOLATION = {
    "rgb": InterpolationMode.BILINEAR,
    "depth": InterpolationMode.NEAREST_EXACT,
    "semseg": InterpolationMode.NEAREST_EXACT,
}
DEPTH_MODES = ("I;16", "I;16B", "I;16L", "I", "L")  # integer depth PNGs (values in depth units)


@dataclass(frozen=True)
class Format:
    """How the files of a dataset are read: which modalities, at what size, in what units."""

    modalities: tuple[str, ...]
    img_size: int
    depth_unit_m: float = 0.001
    num_semseg_classes: int | None = None  # checked when given: ids must be below it, or 255


# --- decoding -------------------------------------------------------------------------------


def _pixels(path: Path, modality: str) -> np.ndarray:
    """A file's pixels as uint8 [H, W, 3] (rgb), uint16 [H, W] (depth) or uint8 [H, W] (semseg)."""
    try:
        with Image.open(path) as img:
            if modality == "rgb":
                return np.array(img.convert("RGB"))
            if modality == "depth" and img.mode not in DEPTH_MODES:
                raise DataError(f"{path}: depth must be an integer PNG (16-bit), not mode {img.mode}")
            values = np.asarray(img).astype(np.int64)  # 'P' semseg: palette indices, not colours
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:  # PIL's errors for broken files
        raise unreadable(path, f"{modality} image", exc) from exc
    top = 65535 if modality == "depth" else 255
    if values.ndim != 2 or values.min() < 0 or values.max() > top:
        raise DataError(
            f"{path}: {modality} must be one channel of values 0..{top}, "
            f"got shape {values.shape} and range {values.min()}..{values.max()}"
        )
    return values.astype(np.uint16 if modality == "depth" else np.uint8)


def decode(path: Path, modality: str, fmt: Format) -> torch.Tensor:
    """One file as a [C, S, S] tensor in its stored dtype: shorter side resized to S, centre crop."""
    t = torch.from_numpy(np.ascontiguousarray(_pixels(path, modality)))
    t = t.permute(2, 0, 1) if t.ndim == 3 else t[None]
    size = fmt.img_size
    if tuple(t.shape[-2:]) != (size, size):
        t = TF.resize(t, [size], interpolation=INTERPOLATION[modality], antialias=modality == "rgb")
        t = TF.center_crop(t, [size, size])
    if modality == "semseg" and fmt.num_semseg_classes is not None:
        bad = (t >= fmt.num_semseg_classes) & (t != IGNORE_INDEX)
        if bad.any():
            raise DataError(
                f"{path}: semseg ids {sorted(set(t[bad].tolist()))[:5]} are not below "
                f"num_semseg_classes={fmt.num_semseg_classes} (nor {IGNORE_INDEX}, ignore)"
            )
    return t.contiguous()


def decode_all(paths: list[dict[str, Path]], fmt: Format) -> dict[str, torch.Tensor]:
    """Every file of every sample, stacked per modality: {modality: [N, C, S, S]}."""
    return {m: torch.stack([decode(p[m], m, fmt) for p in paths]) for m in fmt.modalities}


def stored_rows(img_size: int, modalities: tuple[str, ...]) -> dict[str, tuple[tuple[int, ...], str]]:
    """A decoded cache's row per modality: rgb uint8 [S, S, 3] (as decoded: channels last, the
    layout the uint8 crop is fastest on), depth uint16 [S, S], semseg uint8 [S, S]."""
    shapes = {"rgb": ((img_size, img_size, 3), "uint8"), "depth": ((img_size, img_size), "uint16")}
    return {m: shapes.get(m, ((img_size, img_size), "uint8")) for m in modalities}


def decode_row(paths: list[dict[str, Path]], fmt: Format, i: int) -> dict[str, np.ndarray]:
    """Sample i decoded as ``decode`` does, in the cache's row layout (``stored_rows``)."""
    rows = {}
    for m in fmt.modalities:
        t = decode(paths[i][m], m, fmt)
        rows[m] = (t.permute(1, 2, 0) if m == "rgb" else t[0]).numpy()
    return rows


class MemoryStore:
    """Decoded images held in memory: {modality: [N, C, S, S]} (``decode_all``)."""

    def __init__(self, images: dict[str, torch.Tensor]):
        self.images = images

    def image(self, modality: str, row: int) -> torch.Tensor:
        return self.images[modality][row]


class DiskStore:
    """A decoded cache's arrays of one split, memory-mapped (``attent.tasks.cache``); rows come
    out as ``decode`` gives them ([C, S, S]; rgb a channels-last view of its [S, S, 3] row)."""

    def __init__(self, arrays: dict[str, decoded.MappedArray], folder: Path):
        self.arrays, self.folder = arrays, folder

    def image(self, modality: str, row: int) -> torch.Tensor:
        t = torch.from_numpy(self.arrays[modality].row(row))
        return t.permute(2, 0, 1) if modality == "rgb" else t[None]


Store = MemoryStore | DiskStore


def sample_keys(found: list[dict[str, str]], modality: str) -> list[str]:
    """A split's samples as a decoded cache lists them: "<class>/<stem>", the same in every
    modality folder."""
    return [os.path.splitext(f[modality])[0] for f in found]


def cached_store(index: dict, folder: Path, split: str, keys: list[str], fmt: Format) -> DiskStore:
    """A split's arrays in a decoded cache, after checking they are this split's samples, at
    this size, with these modalities and semseg ids below the task's class count."""
    entry = decoded.check(index, folder, kind=CACHE_KIND, img_size=fmt.img_size, split=split, keys=keys)
    missing = [m for m in fmt.modalities if m not in entry["arrays"]]
    rebuild = f"rebuild it with `{decoded.command(index.get('source', '<root>'), fmt.img_size)} --force`"
    if missing:
        raise ValueError(f"{folder} caches {sorted(entry['arrays'])}, not {missing}; {rebuild}")
    built = index.get("num_semseg_classes")
    if "semseg" in fmt.modalities and fmt.num_semseg_classes is not None and built and built > fmt.num_semseg_classes:
        raise ValueError(
            f"{folder} was built for {built} semseg classes, more than num_semseg_classes="
            f"{fmt.num_semseg_classes}; {rebuild}"
        )
    return DiskStore(decoded.arrays(folder, split, fmt.modalities), folder)


def want_cache(cache: bool | None, n: int, fmt: Format) -> bool:
    """cache=None: decode up front when the split is small once decoded at img_size."""
    if cache is not None:
        return cache
    size = n * fmt.img_size**2 * sum(BYTES_PER_PIXEL[m] for m in fmt.modalities)
    return size < CACHE_LIMIT_BYTES
