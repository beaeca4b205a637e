"""Image classification data: Fashion-MNIST, sklearn digits and class-per-subfolder image folders.

Every dataset is map-style and yields ``{"index": i, "image": FloatTensor[C, H, W], "label": int}``
with ``index`` its own position (the Selector keys its score table on it), so subsets are
new datasets (``select``) rather than ``torch.utils.data.Subset`` views. Images are stored as
uint8 and normalised per item: 60k Fashion-MNIST images take 47 MB and load in well under a second.

Datasets with ``integers`` (the training and scoring sets the task hands the engine) yield the
stored ``uint8`` image instead (Fashion-MNIST and digits at their native size, folder images at
img_size); ``model_inputs`` makes the float image of a batch of them on its device, the same
values as the float items. Folder images are resized to img_size in uint8 (torch's antialiased
bilinear uint8 kernel) once per read, or once for good in a decoded cache (``attent data cache``,
``attent.tasks.cache``), which the dataset then reads instead of the files (``folder.py``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from attent.tasks.task import stratified_holdout, stratified_subset
from attent.tasks.vision.files import (
    DIGITS_STATS,
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_STATS,
    ensure_fashion_mnist,
    find_fashion_mnist,
    idx_file,
    plain_idx,
)

# --- items and batches ----------------------------------------------------------------------


def to_model_input(image: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, img_size: int) -> torch.Tensor:
    """uint8 [C, H, W] (or a batch [B, C, H, W]) -> normalised float [(B,) C, img_size, img_size]."""
    x = image.float() / 255
    if x.shape[-2:] != (img_size, img_size):
        batch = x if x.ndim == 4 else x[None]
        x = F.interpolate(batch, size=(img_size, img_size), mode="bilinear", antialias=True, align_corners=False)
        x = x if image.ndim == 4 else x[0]
    return ((x - mean) / std).contiguous()


_STATS: dict[tuple[tuple, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def model_inputs(
    batch: dict[str, Any], stats: tuple[Sequence[float], Sequence[float]], img_size: int
) -> dict[str, Any]:
    """A batch of stored uint8 images -> the float batch ``stack_items`` gives of float items, on the
    device the batch is on (the same operations on the same integers: the same values). A float
    batch passes as it is."""
    image = batch["image"]
    if image.is_floating_point():
        return batch
    key = (tuple(map(tuple, stats)), image.device)
    if key not in _STATS:  # made once per device: no host-to-device copy per batch
        _STATS[key] = tuple(torch.tensor(s, device=image.device).view(-1, 1, 1) for s in stats)
    mean, std = _STATS[key]
    return {**batch, "image": to_model_input(image, mean, std, img_size)}


def resize_uint8(chw: torch.Tensor, img_size: int) -> torch.Tensor:
    """uint8 [C, H, W] -> uint8 [C, img_size, img_size]: torch's antialiased bilinear uint8
    kernel (fastest on a channels-last image, as decoded), within 1 of the float resize."""
    if tuple(chw.shape[-2:]) == (img_size, img_size):
        return chw
    out = F.interpolate(chw[None], size=(img_size, img_size), mode="bilinear", antialias=True, align_corners=False)
    return out[0]


class TensorImageDataset(Dataset):
    """Images held in memory as uint8 [N, C, H, W]."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        *,
        img_size: int,
        stats: tuple[Sequence[float], Sequence[float]],
        integers: bool = False,
    ):
        assert images.dtype == torch.uint8 and images.ndim == 4 and len(images) == len(labels)
        self.images, self.labels = images, labels.long()
        self.img_size, self.stats, self.integers = img_size, stats, integers
        self._mean = torch.tensor(stats[0]).view(-1, 1, 1)
        self._std = torch.tensor(stats[1]).view(-1, 1, 1)

    @property
    def in_chans(self) -> int:
        return self.images.shape[1]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        image = (
            self.images[i] if self.integers else to_model_input(self.images[i], self._mean, self._std, self.img_size)
        )
        return {"index": i, "image": image, "label": int(self.labels[i])}

    def select(self, indices: torch.Tensor) -> TensorImageDataset:
        """A new dataset of these items, re-indexed from 0."""
        return TensorImageDataset(
            self.images[indices], self.labels[indices], img_size=self.img_size, stats=self.stats, integers=self.integers
        )

    def with_integers(self, integers: bool = True) -> TensorImageDataset:
        """The same images yielding the stored uint8 (native size) or the model's floats."""
        return TensorImageDataset(self.images, self.labels, img_size=self.img_size, stats=self.stats, integers=integers)


class ImageDataset(Protocol):
    """What a split of images offers, in memory (``TensorImageDataset``) or in files
    (``folder.ImageFolderDataset``)."""

    labels: torch.Tensor
    img_size: int
    stats: tuple[Sequence[float], Sequence[float]]

    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    def select(self, indices: torch.Tensor) -> ImageDataset: ...
    def with_integers(self, integers: bool = True) -> ImageDataset: ...


@dataclass(frozen=True)
class ImageSplits:
    """A train and a test set over the same classes, and a validation set drawn from the
    training pool when one is held out (else None)."""

    train: ImageDataset
    test: ImageDataset
    classes: tuple[str, ...]
    val: ImageDataset | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def limited(
        self, train_limit: int | None, test_limit: int | None, seed: int, val_limit: int | None = None
    ) -> ImageSplits:
        """Class-stratified random subsets: val_limit images of the training pool held out for
        validation (None: none), train_limit of the others to train on, test_limit of the test
        set (None: all)."""
        train, val, test = self.train, None, self.test
        if val_limit is not None:
            kept, held = stratified_holdout(train.labels, val_limit, train_limit, seed)
            train, val = train.select(kept), train.select(held)
        elif train_limit is not None:
            train = train.select(stratified_subset(train.labels, train_limit, seed, "train_limit"))
        if test_limit is not None:
            test = test.select(stratified_subset(test.labels, test_limit, seed, "test_limit"))
        return ImageSplits(train, test, self.classes, val)


# --- stratified sampling --------------------------------------------------------------------


def stratified_split(labels: torch.Tensor, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train indices, test indices), each class split test_fraction into test."""
    test = stratified_subset(labels, max(1, round(len(labels) * test_fraction)), seed)
    is_test = torch.zeros(len(labels), dtype=torch.bool)
    is_test[test] = True
    return torch.nonzero(~is_test).flatten(), test


# --- Fashion-MNIST --------------------------------------------------------------------------


def read_idx(path: Path) -> np.ndarray:
    """An idx file (optionally gzipped) as a uint8 array of its stored shape. A gzipped file is
    read from its decompressed copy in the cache (``files.plain_idx``): decompressing the 60k
    training images cost every worker 0.3 s of CPU."""
    plain = plain_idx(path) if path.suffix == ".gz" else path
    if plain:  # read straight into a writable array: no copy of the 47 MB of training images
        data = np.fromfile(plain, dtype=np.uint8)
    else:
        with gzip.open(path, "rb") as f:
            data = np.frombuffer(f.read(), dtype=np.uint8)
    head = data[:4].tobytes()
    if len(head) < 4 or head[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path} is not a uint8 idx file")
    ndim = head[3]
    shape = tuple(int.from_bytes(data[4 + 4 * d : 8 + 4 * d].tobytes(), "big") for d in range(ndim))
    return data[4 + 4 * ndim :].reshape(shape)


def load_fashion_mnist(
    path: str | os.PathLike | None = None, *, download: bool = False, img_size: int = 28
) -> ImageSplits:
    """The 60,000 / 10,000 Fashion-MNIST train / test images, 1 x 28 x 28, resized to img_size."""
    folder = ensure_fashion_mnist(path, download)

    def split(name: str) -> TensorImageDataset:
        images = read_idx(idx_file(folder, name, "images"))
        images = torch.from_numpy(images if images.flags.writeable else images.copy())
        labels = torch.from_numpy(read_idx(idx_file(folder, name, "labels")).astype(np.int64))
        return TensorImageDataset(images.unsqueeze(1), labels, img_size=img_size, stats=FASHION_MNIST_STATS)

    return ImageSplits(split("train"), split("test"), FASHION_MNIST_CLASSES)


# --- sklearn digits -------------------------------------------------------------------------


def digits_file() -> Path:
    """sklearn's digits file (``sklearn.datasets.load_digits`` reads it), found without importing
    sklearn: that import costs each Ray worker about 1.5 s of CPU, more than the rest of a
    digits run's data set-up."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("sklearn's digits need scikit-learn: pip install scikit-learn")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def load_digits(*, img_size: int = 8, test_fraction: float = 0.2, seed: int = 0) -> ImageSplits:
    """sklearn's 1,797 8x8 handwritten digits, split class-stratified into train / test."""
    table = np.loadtxt(digits_file(), delimiter=",")  # 64 pixels and the label per row, as sklearn reads it
    # Pixel values are 0..16; rescale to the uint8 range the datasets store.
    images = torch.from_numpy(np.round(table[:, :-1].reshape(-1, 8, 8) * (255 / 16)).astype(np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    train, test = stratified_split(labels, test_fraction, seed)
    full = TensorImageDataset(images, labels, img_size=img_size, stats=DIGITS_STATS)
    return ImageSplits(full.select(train), full.select(test), tuple(str(d) for d in range(10)))


# --- what a run records of its data (MLflow run inputs) --------------------------------------


def data_source(dataset: str, data_path: str | os.PathLike | None) -> str:
    """Where a dataset's files are: sklearn's digits file, the Fashion-MNIST idx folder, the
    image folder."""
    if dataset == "digits":
        return str(digits_file())
    if dataset == "fashion_mnist":
        return str(find_fashion_mnist(data_path).resolve())
    return str(Path(data_path).expanduser().resolve())


def fingerprint(dataset: ImageDataset) -> str:
    """A hash of a dataset's content: its images (in memory; Fashion-MNIST's 47 MB hash in about
    0.1 s) or, for a folder, its files' paths, and its labels."""
    digest = hashlib.sha256()
    if isinstance(dataset, TensorImageDataset):
        digest.update(dataset.images.contiguous().numpy())
    else:
        digest.update("\n".join(map(str, dataset.paths)).encode())
    digest.update(dataset.labels.numpy())
    return digest.hexdigest()
