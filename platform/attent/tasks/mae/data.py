"""Multi-modal (rgb, depth, semseg) image data in MultiMAE's layout, for the Multi-Modal MAE task.

One loader for the offline scenes (``scenes.py``) and for real sets prepared as MultiMAE does
(NYUv2, ImageNet-S50 with pseudo labels): ``<root>/<split>/{rgb,depth,semseg}/<class>/<name>``.
Items are ``{"index": i, "label": scene class, "rgb": [3,S,S], "depth": [1,S,S] metres,
"semseg": [S,S] ids}``, ``index`` the item's position in its dataset (the AtteNT teacher keys its
score table on it), so subsets are new datasets (``select``), not ``torch.utils.data.Subset``.

Every file is first brought to S x S (shorter side resized to S, centre crop; rgb bilinear with
antialias, depth and semseg nearest); training items then get MultiMAE's augmentation, the same
random resized crop and horizontal flip on every modality. Small splits are decoded once into
uint8 / uint16 tensors; large ones are decoded per item.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import InterpolationMode, RandomResizedCrop

from attent.contract import DATASET_EVAL, DATASET_TRAIN, DATASET_VALIDATION, DatasetDescription
from attent.tasks.config import DataError, unreadable
from attent.tasks.mae.files import MODALITIES, SPLITS, read_metadata, scan_root
from attent.tasks.task import stratified_holdout, stratified_subset

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IGNORE_INDEX = 255  # semseg id of pixels without a label
CROP_SCALE, CROP_RATIO = (0.5, 1.0), (3 / 4, 4 / 3)  # MultiMAE's random resized crop
CACHE_LIMIT_BYTES = 200 * 2**20  # cache=None decodes a split up front below this decoded size
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


def augment_images(images: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MultiMAE's training augmentation, identical on every modality: a random resized crop
    (scale 0.5-1, aspect 3/4-4/3; nearest for depth and semseg) and a horizontal flip.
    Draws from torch's global generator (seeded per DataLoader worker)."""
    first = next(iter(images.values()))
    top, left, h, w = RandomResizedCrop.get_params(first, list(CROP_SCALE), list(CROP_RATIO))
    flip = bool(torch.rand(()) < 0.5)
    size = list(first.shape[-2:])
    out = {}
    for m, t in images.items():
        t = TF.resized_crop(t, top, left, h, w, size, interpolation=INTERPOLATION[m], antialias=m == "rgb")
        out[m] = t.flip(-1) if flip else t
    return out


# --- datasets -------------------------------------------------------------------------------


class MultiModalDataset(Dataset):
    """Aligned rgb / depth / semseg samples with scene labels; see the module docstring."""

    def __init__(
        self,
        paths: list[dict[str, Path]],
        labels: torch.Tensor,
        fmt: Format,
        *,
        augment: bool = False,
        cache: dict[str, torch.Tensor] | None = None,
    ):
        assert len(paths) == len(labels) and all(len(c) == len(paths) for c in (cache or {}).values())
        self.paths, self.labels, self.fmt = paths, labels.long(), fmt
        self.augment, self.cache = augment, cache
        self._mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self._std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def images(self, i: int) -> dict[str, torch.Tensor]:
        """Sample i at img_size in stored dtypes (uint8 rgb / semseg, uint16 depth), unaugmented."""
        if self.cache is not None:
            return {m: self.cache[m][i] for m in self.fmt.modalities}
        return {m: decode(self.paths[i][m], m, self.fmt) for m in self.fmt.modalities}

    def __getitem__(self, i: int) -> dict[str, Any]:
        images = self.images(i)
        if self.augment:
            images = augment_images(images)
        item: dict[str, Any] = {"index": i, "label": int(self.labels[i])}
        if "rgb" in images:
            item["rgb"] = (images["rgb"].float() / 255 - self._mean) / self._std
        if "depth" in images:
            item["depth"] = images["depth"].float() * self.fmt.depth_unit_m  # 0 stays 0: invalid
        if "semseg" in images:
            item["semseg"] = images["semseg"][0].long()
        return item

    def select(self, indices: torch.Tensor) -> MultiModalDataset:
        """A new dataset of these samples, re-indexed from 0 (cache and augmentation kept)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        cache = None if self.cache is None else {m: t[idx] for m, t in self.cache.items()}
        return MultiModalDataset(
            [self.paths[i] for i in idx.tolist()], self.labels[idx], self.fmt, augment=self.augment, cache=cache
        )

    def without_augmentation(self) -> MultiModalDataset:
        """The same files in the same order, without random transforms (deterministic scoring)."""
        return MultiModalDataset(self.paths, self.labels, self.fmt, augment=False, cache=self.cache)


@dataclass(frozen=True)
class MultiModalSplits:
    """A train and a test set over the same scene and semseg classes, and a validation set drawn
    from the train split when one is held out (else None)."""

    train: MultiModalDataset
    test: MultiModalDataset
    scene_classes: list[str]
    semseg_classes: list[str]  # names, or ["0", "1", ...] when the data does not name them
    val: MultiModalDataset | None = None

    @property
    def num_scene_classes(self) -> int:
        return len(self.scene_classes)

    @property
    def num_semseg_classes(self) -> int:
        return len(self.semseg_classes)

    def limited(
        self, train_limit: int | None, test_limit: int | None, seed: int, val_limit: int | None = None
    ) -> MultiModalSplits:
        """Class-stratified random subsets: val_limit samples of the train split held out for
        validation (None: none; never augmented), train_limit of the others to train on, and
        test_limit of the test split (None: all); deterministic in seed, items re-indexed by
        their position in the subset."""
        train, val, test = self.train, None, self.test
        if val_limit is not None:
            kept, held = stratified_holdout(train.labels, val_limit, train_limit, seed, unit="samples")
            train, val = train.select(kept), train.select(held).without_augmentation()
        elif train_limit is not None:
            train = train.select(stratified_subset(train.labels, train_limit, seed, "train_limit"))
        if test_limit is not None:
            test = test.select(stratified_subset(test.labels, test_limit, seed, "test_limit"))
        return replace(self, train=train, test=test, val=val)


def collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Items -> a batch: each key stacked; "index" and "label" as LongTensor[B]."""
    batch = {}
    for key in items[0]:
        values = [item[key] for item in items]
        batch[key] = torch.tensor(values, dtype=torch.long) if key in ("index", "label") else torch.stack(values)
    return batch


# --- loading --------------------------------------------------------------------------------


def _class_names(
    meta: dict, found: dict[str, list[dict[str, str]]], root: Path, splits: tuple[str, str], modality: str
) -> list[str]:
    """Scene classes: dataset.json's, else the train split's sorted class folders."""
    folders = {s: sorted({f[modality].split("/")[0] for f in found[s]}) for s in splits}
    if meta.get("scene_classes"):
        return list(meta["scene_classes"])
    unknown = sorted(set(folders[splits[1]]) - set(folders[splits[0]]))
    if unknown:
        raise ValueError(
            f"{root}/{splits[1]} has class folders {unknown} that "
            f"{root}/{splits[0]} lacks; give both splits the same classes"
        )
    return folders[splits[0]]


def _semseg_names(meta: dict, num_semseg_classes: int | None, modalities, root: Path) -> list[str]:
    """Semseg class names: dataset.json's, else ["0", ..., str(n-1)] from num_semseg_classes."""
    names = meta.get("semseg_classes")
    if names is not None:
        if num_semseg_classes is not None and num_semseg_classes != len(names):
            raise ValueError(
                f"num_semseg_classes={num_semseg_classes} but {root}/dataset.json names {len(names)} semseg classes"
            )
        return list(names)
    if num_semseg_classes is None:
        if "semseg" in modalities:
            raise ValueError(
                f"{root} has no dataset.json naming its semseg classes; pass "
                f"num_semseg_classes (e.g. 41 for NYUv2's 40 classes + background)"
            )
        return []
    return [str(i) for i in range(num_semseg_classes)]


def _want_cache(cache: bool | None, n: int, fmt: Format) -> bool:
    """cache=None: decode up front when the split is small once decoded at img_size."""
    if cache is not None:
        return cache
    size = n * fmt.img_size**2 * sum(BYTES_PER_PIXEL[m] for m in fmt.modalities)
    return size < CACHE_LIMIT_BYTES


def load_multimodal(
    root: str | os.PathLike,
    *,
    modalities: tuple[str, ...] = MODALITIES,
    img_size: int,
    augment: bool = True,
    cache: bool | None = None,
    num_semseg_classes: int | None = None,
    splits: tuple[str, str] = SPLITS,
) -> MultiModalSplits:
    """The (train, test) splits of a multi-modal root; only the train split is augmented.
    Raises FileNotFoundError / ValueError (files.check_multimodal_root) for a broken layout."""
    root, modalities = Path(root).expanduser(), tuple(modalities)
    found = scan_root(root, splits=splits, modalities=modalities)
    meta = read_metadata(root) or {}
    classes = _class_names(meta, found, root, splits, modalities[0])
    semseg = _semseg_names(meta, num_semseg_classes, modalities, root)
    fmt = Format(
        modalities, img_size, float(meta.get("depth_unit_m", 0.001)), len(semseg) if "semseg" in modalities else None
    )
    datasets = []
    for split, augmented in zip(splits, (augment, False)):
        paths = [{m: root / split / m / f[m] for m in modalities} for f in found[split]]
        ids = {name: k for k, name in enumerate(classes)}
        labels = torch.tensor([ids[f[modalities[0]].split("/")[0]] for f in found[split]])
        stored = decode_all(paths, fmt) if _want_cache(cache, len(paths), fmt) else None
        datasets.append(MultiModalDataset(paths, labels, fmt, augment=augmented, cache=stored))
    return MultiModalSplits(datasets[0], datasets[1], classes, semseg)


# --- what a run records of its data (MLflow run inputs) --------------------------------------


def fingerprint(dataset: MultiModalDataset) -> str:
    """A hash of a split's files (each sample's path per modality, in order) and scene labels;
    the files are not read again."""
    digest = hashlib.sha256()
    for sample in dataset.paths:
        digest.update("|".join(str(sample[m]) for m in sorted(sample)).encode() + b"\n")
    digest.update(dataset.labels.numpy())
    return digest.hexdigest()


def describe_splits(splits: MultiModalSplits, root: str | os.PathLike) -> list[DatasetDescription]:
    """The train, validation (when held out, from the train split) and test splits, after any
    limits, as a run's inputs, named after the root."""
    root = Path(root).expanduser().resolve()
    parts = (
        ("train", "train", DATASET_TRAIN, splits.train),
        ("val", "train", DATASET_VALIDATION, splits.val),
        ("test", "test", DATASET_EVAL, splits.test),
    )
    return [
        DatasetDescription(f"{root.name}-{split}", str(root / folder), context, len(dataset), fingerprint(dataset))
        for split, folder, context, dataset in parts
        if dataset is not None
    ]
