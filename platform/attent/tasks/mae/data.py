"""Multi-modal (rgb, depth, semseg) image data in MultiMAE's layout, for the Multi-Modal MAE task.

One loader for the offline scenes (``scenes.py``) and for real sets prepared as MultiMAE does
(NYUv2, ImageNet-S50 with pseudo labels): ``<root>/<split>/{rgb,depth,semseg}/<class>/<name>``.
Items are ``{"index": i, "label": scene class, "rgb": [3,S,S], "depth": [1,S,S] metres,
"semseg": [S,S] ids}``, ``index`` the item's position in its dataset (the Selector keys its
score table on it), so subsets are new datasets (``select``), not ``torch.utils.data.Subset``.

Every file is first brought to S x S (``decode.py``: shorter side resized to S, centre crop; rgb bilinear with
antialias, depth and semseg nearest); training items then get MultiMAE's augmentation, the same
random resized crop and horizontal flip on every modality. Where the data has a decoded cache
(``attent data cache``: every sample at S x S in memory-mapped uint8 / uint16 arrays, see
``attent.tasks.cache``) the items are read from it; else small splits are decoded once into
memory and large ones per item.

Datasets with ``integers`` (the training and scoring sets a task hands the engine) yield the
stored integers instead: rgb uint8 [3,S,S], depth uint16 [1,S,S] (depth units), semseg uint8
[S,S], a quarter of the bytes; ``to_model_inputs`` makes the float inputs from them on whatever
device the batch is on, the same values as the float items (the same operations on the same
integers).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torchvision.transforms.v2.functional as TF
from torch.utils.data import Dataset
from torchvision.transforms import RandomResizedCrop

from attent.contract import DATASET_EVAL, DATASET_TRAIN, DATASET_VALIDATION, DatasetDescription
from attent.tasks import cache as decoded
from attent.tasks.mae.decode import (
    CACHE_KIND,
    INTERPOLATION,
    Format,
    MemoryStore,
    Store,
    cached_store,
    decode,
    decode_all,
    decode_row,
    sample_keys,
    stored_rows,
    want_cache,
)
from attent.tasks.mae.files import MODALITIES, SPLITS, read_metadata, scan_root
from attent.tasks.task import stratified_holdout, stratified_subset

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_SCALE, CROP_RATIO = (0.2, 1.0), (3 / 4, 4 / 3)  # the paper's and the released code's (MAE's) crop


# --- model inputs ---------------------------------------------------------------------------

_STATS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """ImageNet's mean and std as [3, 1, 1] float32 on a device (made once per device)."""
    if device not in _STATS:
        _STATS[device] = (
            torch.tensor(IMAGENET_MEAN, device=device).view(3, 1, 1),
            torch.tensor(IMAGENET_STD, device=device).view(3, 1, 1),
        )
    return _STATS[device]


def to_model_inputs(batch: dict[str, Any], depth_unit_m: float) -> dict[str, Any]:
    """Stored integers -> model inputs, for an item or a batch, on the device they are on: rgb
    uint8 -> (x / 255 - mean) / std, depth uint16 -> float metres (0 stays 0: invalid),
    semseg uint8 -> long. Float (already prepared) values pass as they are."""
    out = dict(batch)
    rgb = batch.get("rgb")
    if rgb is not None and rgb.dtype == torch.uint8:
        mean, std = _stats(rgb.device)
        out["rgb"] = ((rgb.float() / 255 - mean) / std).contiguous()
    depth = batch.get("depth")
    if depth is not None and not depth.is_floating_point():
        out["depth"] = depth.float() * depth_unit_m
    semseg = batch.get("semseg")
    if semseg is not None and semseg.dtype != torch.long:
        out["semseg"] = semseg.long()
    return out


def augment_images(images: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MultiMAE's training augmentation, identical on every modality: a random resized crop
    (scale CROP_SCALE, aspect 3/4-4/3; nearest for depth and semseg) and a horizontal flip.
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
        store: Store | None = None,
        rows: torch.Tensor | None = None,
        integers: bool = False,
    ):
        self.paths, self.labels, self.fmt = paths, labels.long(), fmt
        self.rows = torch.arange(len(paths)) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        assert len(paths) == len(self.labels) == len(self.rows)
        self.augment, self.store, self.integers = augment, store, integers

    def __len__(self) -> int:
        return len(self.labels)

    def images(self, i: int) -> dict[str, torch.Tensor]:
        """Sample i at img_size in stored dtypes (uint8 rgb / semseg, uint16 depth), unaugmented."""
        if self.store is not None:
            row = int(self.rows[i])
            return {m: self.store.image(m, row) for m in self.fmt.modalities}
        return {m: decode(self.paths[i][m], m, self.fmt) for m in self.fmt.modalities}

    def __getitem__(self, i: int) -> dict[str, Any]:
        images = self.images(i)
        if self.augment:
            images = augment_images(images)
        item: dict[str, Any] = {"index": i, "label": int(self.labels[i])}
        for m in ("rgb", "depth", "semseg"):  # the batch's key order, whatever the modalities' order
            if m in images:
                item[m] = images[m][0] if m == "semseg" else images[m]
        return item if self.integers else to_model_inputs(item, self.fmt.depth_unit_m)

    def _like(self, **changes: Any) -> MultiModalDataset:
        kept = {
            "paths": self.paths,
            "labels": self.labels,
            "fmt": self.fmt,
            "augment": self.augment,
            "store": self.store,
            "rows": self.rows,
            "integers": self.integers,
        }
        kept.update(changes)
        return MultiModalDataset(kept.pop("paths"), kept.pop("labels"), kept.pop("fmt"), **kept)

    def select(self, indices: torch.Tensor) -> MultiModalDataset:
        """A new dataset of these samples, re-indexed from 0 (store, augmentation and item
        kind kept; the stored images are not copied)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self._like(paths=[self.paths[i] for i in idx.tolist()], labels=self.labels[idx], rows=self.rows[idx])

    def without_augmentation(self) -> MultiModalDataset:
        """The same files in the same order, without random transforms (deterministic scoring)."""
        return self._like(augment=False)

    def with_integers(self, integers: bool = True) -> MultiModalDataset:
        """The same samples yielding the stored integers (``integers``) or the model's floats."""
        return self._like(integers=integers)


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


def load_multimodal(
    root: str | os.PathLike,
    *,
    modalities: tuple[str, ...] = MODALITIES,
    img_size: int,
    augment: bool = True,
    cache: bool | None = None,
    num_semseg_classes: int | None = None,
    splits: tuple[str, str] = SPLITS,
    cache_path: str | None = None,
) -> MultiModalSplits:
    """The (train, test) splits of a multi-modal root; only the train split is augmented.
    ``cache_path`` (``attent.tasks.cache.locate``): the decoded cache to read the images from;
    without one, ``cache`` says whether to decode them into memory first (None: when small).
    Raises FileNotFoundError / ValueError (files.check_multimodal_root) for a broken layout, and
    for a decoded cache of other files or another size."""
    root, modalities = Path(root).expanduser(), tuple(modalities)
    found = scan_root(root, splits=splits, modalities=modalities)
    meta = read_metadata(root) or {}
    classes = _class_names(meta, found, root, splits, modalities[0])
    semseg = _semseg_names(meta, num_semseg_classes, modalities, root)
    fmt = Format(
        modalities, img_size, float(meta.get("depth_unit_m", 0.001)), len(semseg) if "semseg" in modalities else None
    )
    folder = decoded.locate(cache_path, root, img_size)
    index = decoded.read_index(folder) if folder is not None else None
    datasets = []
    for split, augmented in zip(splits, (augment, False)):
        paths = [{m: root / split / m / f[m] for m in modalities} for f in found[split]]
        ids = {name: k for k, name in enumerate(classes)}
        labels = torch.tensor([ids[f[modalities[0]].split("/")[0]] for f in found[split]])
        if index is not None:
            stored = cached_store(index, folder, split, sample_keys(found[split], modalities[0]), fmt)
        else:
            stored = MemoryStore(decode_all(paths, fmt)) if want_cache(cache, len(paths), fmt) else None
        datasets.append(MultiModalDataset(paths, labels, fmt, augment=augmented, store=stored))
    return MultiModalSplits(datasets[0], datasets[1], classes, semseg)


def build_cache(
    root: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    img_size: int,
    modalities: tuple[str, ...] = MODALITIES,
    num_semseg_classes: int | None = None,
    splits: tuple[str, ...] = SPLITS,
    workers: int | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Decode every sample of a multi-modal root once, as ``load_multimodal`` decodes it (the
    same ``decode``: bitwise the same images), into a decoded cache at ``out`` (default
    ``<root>/.attent-cache/<img_size>px``). Semseg ids are checked against the class count as
    they are decoded. Returns the cache's index with the build's seconds and bytes."""
    root, modalities = Path(root).expanduser(), tuple(modalities)
    found = scan_root(root, splits=splits, modalities=modalities)
    meta = read_metadata(root) or {}
    semseg = _semseg_names(meta, num_semseg_classes, modalities, root)
    fmt = Format(
        modalities, img_size, float(meta.get("depth_unit_m", 0.001)), len(semseg) if "semseg" in modalities else None
    )
    parts = {}
    for split in splits:
        paths = [{m: root / split / m / f[m] for m in modalities} for f in found[split]]
        parts[split] = decoded.Split(
            sample_keys(found[split], modalities[0]), partial(decode_row, paths, fmt), stored_rows(img_size, modalities)
        )
    return decoded.build(
        out or decoded.default_folder(root, img_size),
        kind=CACHE_KIND,
        img_size=img_size,
        source=root,
        splits=parts,
        workers=workers,
        force=force,
        meta={"modalities": list(modalities), "num_semseg_classes": fmt.num_semseg_classes},
        progress=progress,
    )


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
