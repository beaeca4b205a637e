"""Class-per-subfolder image folders: the files, or a decoded cache of them.

``decode_image`` is the one decoding of a file (grayscale or RGB, resized to img_size in uint8
by ``data.resize_uint8``): the dataset and ``attent data cache`` both call it, so a decoded cache
(``attent.tasks.cache``) holds bitwise what the files give.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from attent.tasks import cache as decoded
from attent.tasks.config import unreadable
from attent.tasks.vision.data import ImageSplits, resize_uint8, stratified_split, to_model_input
from attent.tasks.vision.files import IMAGE_FOLDER_STATS, check_image_folder, has_train_test, scan_classes

CACHE_KIND = "image_folder"  # index.json's kind of a decoded cache of an image folder


class ImageFolderDataset(Dataset):
    """Image files, converted to grayscale or RGB and resized to img_size in uint8: read from a
    decoded cache's rows (``cache``: a memory-mapped uint8 [N, S, S, C] array and the row of
    each image) when there is one, else decoded per read."""

    def __init__(
        self,
        paths: Sequence[Path],
        labels: torch.Tensor,
        *,
        img_size: int,
        in_chans: int,
        cache: decoded.MappedArray | None = None,
        rows: torch.Tensor | None = None,
        integers: bool = False,
    ):
        assert in_chans in (1, 3) and len(paths) == len(labels)
        self.paths, self.labels = list(paths), labels.long()
        self.img_size, self.in_chans = img_size, in_chans
        self.cache, self.integers = cache, integers
        self.rows = torch.arange(len(self.paths)) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        self.stats = IMAGE_FOLDER_STATS[in_chans]
        self._mean = torch.tensor(self.stats[0]).view(-1, 1, 1)
        self._std = torch.tensor(self.stats[1]).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def pixels(self, i: int) -> torch.Tensor:
        """Image i as uint8 [C, img_size, img_size] (from a cache: a channels-last view)."""
        if self.cache is not None:
            return torch.from_numpy(self.cache.row(int(self.rows[i]))).permute(2, 0, 1)
        return decode_image(self.paths[i], self.in_chans, self.img_size)

    def __getitem__(self, i: int) -> dict[str, Any]:
        image = self.pixels(i)
        if not self.integers:
            image = to_model_input(image, self._mean, self._std, self.img_size)
        return {"index": i, "image": image, "label": int(self.labels[i])}

    def _like(self, **changes: Any) -> ImageFolderDataset:
        kept = {"paths": self.paths, "labels": self.labels, "rows": self.rows, "integers": self.integers}
        kept.update(changes)
        return ImageFolderDataset(
            kept.pop("paths"),
            kept.pop("labels"),
            img_size=self.img_size,
            in_chans=self.in_chans,
            cache=self.cache,
            **kept,
        )

    def select(self, indices: torch.Tensor) -> ImageFolderDataset:
        """A new dataset of these items, re-indexed from 0 (a cache's images are not copied)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self._like(paths=[self.paths[i] for i in idx.tolist()], labels=self.labels[idx], rows=self.rows[idx])

    def with_integers(self, integers: bool = True) -> ImageFolderDataset:
        """The same images yielding the stored uint8 or the model's floats."""
        return self._like(integers=integers)


def decode_image(path: Path, in_chans: int, img_size: int) -> torch.Tensor:
    """An image file as uint8 [C, img_size, img_size] (grayscale or RGB; ``resize_uint8``)."""
    try:
        with Image.open(path) as img:
            pixels = np.atleast_3d(np.array(img.convert("L" if in_chans == 1 else "RGB")))
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:  # PIL's errors for broken files
        raise unreadable(path, "image", exc) from exc
    return resize_uint8(torch.from_numpy(pixels).permute(2, 0, 1), img_size)


def decode_row(paths: Sequence[Path], in_chans: int, img_size: int, i: int) -> dict[str, np.ndarray]:
    """Image i in a decoded cache's row layout: uint8 [S, S, C]."""
    return {"image": decode_image(paths[i], in_chans, img_size).permute(1, 2, 0).numpy()}


def _class_tensors(root: Path) -> tuple[tuple[str, ...], list[Path], torch.Tensor]:
    classes, paths, labels = scan_classes(root)
    return classes, paths, torch.tensor(labels, dtype=torch.long)


def folder_splits(root: Path) -> list[str]:
    """The folders of an image folder read as splits: ["train", "test"], or [""] (root itself)."""
    return ["train", "test"] if has_train_test(root) else [""]


def _split_name(folder: str) -> str:
    return folder or "all"


def _keys(root: Path, paths: list[Path]) -> list[str]:
    return [path.relative_to(root).as_posix() for path in paths]


def _cached(
    index: dict, cache_folder: Path, root: Path, folder: str, paths: list[Path], in_chans: int, img_size: int
) -> decoded.MappedArray:
    """The decoded cache's image array of one folder, after checking it holds these files at
    this size and in these channels."""
    entry = decoded.check(
        index, cache_folder, kind=CACHE_KIND, img_size=img_size, split=_split_name(folder), keys=_keys(root, paths)
    )
    if entry.get("in_chans") != in_chans:
        raise ValueError(
            f"{cache_folder} holds {entry.get('in_chans')}-channel images, the task reads {in_chans}; rebuild it "
            f"with `{decoded.command(root, img_size)} --color-mode {'grayscale' if in_chans == 1 else 'rgb'} --force`"
        )
    return decoded.arrays(cache_folder, _split_name(folder), ["image"])["image"]


def load_image_folder(
    root: str | os.PathLike,
    *,
    img_size: int,
    in_chans: int = 3,
    test_fraction: float = 0.2,
    seed: int = 0,
    cache_path: str | None = None,
) -> ImageSplits:
    """Class-per-subfolder images: root/train and root/test when both exist, otherwise a
    class-stratified split of root's images. ``cache_path`` (``attent.tasks.cache.locate``):
    the decoded cache to read them from instead of the files."""
    root = check_image_folder(root)
    cache_folder = decoded.locate(cache_path, root, img_size)
    index = decoded.read_index(cache_folder) if cache_folder is not None else None

    def dataset(folder: str) -> tuple[tuple[str, ...], ImageFolderDataset]:
        classes, paths, labels = _class_tensors(root / folder if folder else root)
        array = None if index is None else _cached(index, cache_folder, root, folder, paths, in_chans, img_size)
        return classes, ImageFolderDataset(paths, labels, img_size=img_size, in_chans=in_chans, cache=array)

    if has_train_test(root):
        classes, train = dataset("train")
        test_classes, test = dataset("test")
        if test_classes != classes:
            raise ValueError(
                f"{root}/train has classes {classes} but {root}/test has "
                f"{test_classes}; give both the same class subfolders"
            )
        return ImageSplits(train, test, classes)
    classes, full = dataset("")
    train, test = stratified_split(full.labels, test_fraction, seed)
    return ImageSplits(full.select(train), full.select(test), classes)


def build_cache(
    root: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    img_size: int,
    in_chans: int = 3,
    workers: int | None = None,
    force: bool = False,
    progress=None,
) -> dict[str, Any]:
    """Decode every image of an image folder once, as ``ImageFolderDataset`` decodes it
    (``decode_image``: bitwise the same uint8), into a decoded cache at ``out`` (default
    ``<root>/.attent-cache/<img_size>px``): one uint8 [N, S, S, C] array per folder read as a
    split (train and test, or all). Returns the cache's index with the build's seconds and bytes."""
    root = check_image_folder(root)
    splits = {}
    for folder in folder_splits(root):
        _, paths, _ = scan_classes(root / folder if folder else root)
        splits[_split_name(folder)] = decoded.Split(
            _keys(root, paths),
            partial(decode_row, paths, in_chans, img_size),
            {"image": ((img_size, img_size, in_chans), "uint8")},
            extra={"in_chans": in_chans},
        )
    return decoded.build(
        out or decoded.default_folder(root, img_size),
        kind=CACHE_KIND,
        img_size=img_size,
        source=root,
        splits=splits,
        workers=workers,
        force=force,
        progress=progress,
    )
