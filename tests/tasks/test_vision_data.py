"""Image datasets on real data: sklearn digits, Debian's Fashion-MNIST, PNG folders."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest
import torch
from attent.tasks.batches import stack_items
from attent.tasks.task import stratified_holdout
from attent.tasks.vision import data, files, folder
from attent.tasks.vision.config import VisionTaskConfig
from attent.tasks.vision.task import load_splits
from PIL import Image

DEBIAN_DIR = files.FASHION_MNIST_DEBIAN_DIRS[0]
needs_fashion_mnist = pytest.mark.skipif(
    not all((DEBIAN_DIR / f"{name}.gz").is_file() for name in files.FASHION_MNIST_FILES.values()),
    reason=f"Fashion-MNIST not in {DEBIAN_DIR}: `apt-get install dataset-fashion-mnist`",
)


def class_counts(dataset) -> list[int]:
    return torch.bincount(dataset.labels, minlength=10).tolist()


def contents(dataset) -> set[bytes]:
    """Each image's pixels and label (sklearn's 1,797 digits hold no two alike)."""
    return {dataset.images[i].numpy().tobytes() + bytes([int(dataset.labels[i])]) for i in range(len(dataset))}


# --- stratified sampling --------------------------------------------------------------------


def test_stratified_subset_keeps_class_shares_and_is_seeded():
    labels = torch.tensor([0] * 50 + [1] * 30 + [2] * 15 + [3] * 5)
    subset = data.stratified_subset(labels, 37, seed=3)

    assert len(subset) == 37 and len(subset.unique()) == 37
    assert torch.equal(subset, subset.sort().values)
    shares = 37 * torch.bincount(labels) / len(labels)
    assert (torch.bincount(labels[subset], minlength=4) - shares).abs().max() < 1
    assert torch.equal(subset, data.stratified_subset(labels, 37, seed=3))
    assert not torch.equal(subset, data.stratified_subset(labels, 37, seed=4))


def test_stratified_subset_refuses_more_than_available():
    with pytest.raises(ValueError, match="train_limit=101 must be between 1 and the 100"):
        data.stratified_subset(torch.zeros(100, dtype=torch.long), 101, 0, "train_limit")


# --- digits ---------------------------------------------------------------------------------


def test_digits_split_shapes_classes_and_determinism():
    splits = data.load_digits(seed=0)

    assert (len(splits.train), len(splits.test)) == (1438, 359)  # 1,797 images, 20% test
    assert splits.num_classes == 10
    assert min(class_counts(splits.test)) >= 34 and min(class_counts(splits.train)) >= 139
    item = splits.train[5]
    assert item["index"] == 5 and item["image"].shape == (1, 8, 8)
    assert item["image"].dtype == torch.float32 and 0 <= item["label"] <= 9
    assert torch.equal(data.load_digits(seed=0).test.images, splits.test.images)
    assert not torch.equal(data.load_digits(seed=1).test.images, splits.test.images)


def test_digits_are_sklearns_digits_read_without_importing_sklearn():
    """The file read directly (the sklearn import cost each worker ~1.5 s) holds exactly what
    sklearn.datasets.load_digits returns."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    reference = load_digits()
    images = torch.from_numpy(np.round(reference.images * (255 / 16)).astype(np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(reference.target.astype(np.int64))
    train, test = data.stratified_split(labels, 0.2, seed=0)
    splits = data.load_digits(seed=0)
    assert torch.equal(splits.train.images, images[train]) and torch.equal(splits.train.labels, labels[train])
    assert torch.equal(splits.test.images, images[test]) and torch.equal(splits.test.labels, labels[test])
    probe = "import sys; from attent.tasks.vision import data; data.load_digits(); print('sklearn' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_digits_train_and_test_are_disjoint():
    train, test = data.stratified_split(torch.arange(1797) % 10, 0.2, seed=0)

    assert len(train) + len(test) == 1797
    assert torch.equal(torch.cat([train, test]).sort().values, torch.arange(1797))


# --- the validation split and the seed that draws the data ------------------------------------


def test_validation_is_held_out_of_the_training_pool_apart_from_train_and_test():
    pool = data.load_digits(seed=0)
    splits = pool.limited(600, 100, seed=0, val_limit=200)
    train, val, test = contents(splits.train), contents(splits.val), contents(splits.test)

    assert (len(train), len(val), len(test)) == (600, 200, 100)
    assert not train & val and not val & test and not train & test
    assert val <= contents(pool.train)  # drawn from the training pool, the test set untouched
    assert torch.equal(splits.test.images, pool.limited(600, 100, seed=0).test.images)
    share = torch.bincount(pool.train.labels) / len(pool.train)  # class-stratified, as the limits are
    assert (torch.bincount(splits.val.labels) - 200 * share).abs().max() < 1
    assert (torch.bincount(splits.train.labels) - 600 * share).abs().max() < 1
    # by index: validation is the end of the stratified draw whose start train_limit takes
    kept, held = stratified_holdout(pool.train.labels, 200, 600, seed=0)
    assert not set(kept.tolist()) & set(held.tolist())
    assert torch.equal(splits.val.images, pool.train.images[held])
    assert torch.equal(splits.train.images, pool.train.images[kept])
    # so holding it out leaves the training images of a run without validation as they were
    assert torch.equal(splits.train.images, pool.limited(600, 100, seed=0).train.images)
    # without train_limit, every image not held out trains
    rest = pool.limited(None, None, seed=0, val_limit=200)
    assert len(rest.train) == 1438 - 200 and contents(rest.train) | contents(rest.val) == contents(pool.train)


def digits_splits(split_seed: int | None, seed: int) -> data.ImageSplits:
    config = VisionTaskConfig(dataset="digits", val_limit=100, train_limit=300, test_limit=100, split_seed=split_seed)
    return load_splits(config, seed)


def test_each_seed_draws_its_own_data_unless_split_seed_fixes_it():
    def same(a: data.ImageSplits, b: data.ImageSplits) -> list[bool]:
        return [torch.equal(getattr(a, split).images, getattr(b, split).images) for split in ("train", "val", "test")]

    assert same(digits_splits(None, 1), digits_splits(None, 1)) == [True] * 3
    assert same(digits_splits(None, 1), digits_splits(None, 2)) == [False] * 3  # train, validation and test
    assert same(digits_splits(7, 1), digits_splits(7, 2)) == [True] * 3
    assert same(digits_splits(0, 5), digits_splits(None, 0)) == [True] * 3  # split_seed 0: seed 0's data
    assert same(digits_splits(0, 5), digits_splits(7, 5)) == [False] * 3
    # the digits train / test split itself moves with the seed
    assert contents(load_splits(VisionTaskConfig(dataset="digits"), 1).test) != contents(
        load_splits(VisionTaskConfig(dataset="digits"), 2).test
    )


@pytest.mark.parametrize(
    "val_limit, train_limit, message",
    [
        (
            300,
            1200,
            "val_limit=300 + train_limit=1200 = 1500 exceed the 1438 training images both are drawn from "
            "(disjoint); lower one of them, or set train_limit to null to train on the other 1138",
        ),
        (1438, None, "val_limit=1438 must leave some of the 1438 training images to train on; lower it below 1438"),
    ],
)
def test_a_validation_split_that_does_not_fit_is_refused_in_one_line(val_limit, train_limit, message):
    with pytest.raises(ValueError) as error:
        load_splits(VisionTaskConfig(dataset="digits", val_limit=val_limit, train_limit=train_limit), 0)
    assert str(error.value) == message


def test_resize_and_collate():
    splits = data.load_digits(img_size=16)
    batch = stack_items([splits.train[i] for i in (3, 1, 4)])

    assert torch.equal(batch["index"], torch.tensor([3, 1, 4]))
    assert batch["image"].shape == (3, 1, 16, 16) and batch["image"].dtype == torch.float32
    assert batch["label"].dtype == torch.long
    assert torch.equal(batch["label"], splits.train.labels[[3, 1, 4]])


# --- Fashion-MNIST --------------------------------------------------------------------------


@needs_fashion_mnist
def test_fashion_mnist_from_debian_package(monkeypatch):
    monkeypatch.delenv(files.FASHION_MNIST_ENV, raising=False)
    assert files.find_fashion_mnist() == DEBIAN_DIR
    splits = data.load_fashion_mnist(DEBIAN_DIR)

    assert (len(splits.train), len(splits.test)) == (60000, 10000)
    assert splits.train.images.shape == (60000, 1, 28, 28)
    assert splits.train.images.dtype == torch.uint8
    assert class_counts(splits.train) == [6000] * 10 and class_counts(splits.test) == [1000] * 10
    # Normalised with the training set's own statistics.
    images = torch.stack([splits.train[i]["image"] for i in range(0, 60000, 60)])
    assert abs(images.mean().item()) < 0.05 and abs(images.std().item() - 1) < 0.05


@needs_fashion_mnist
def test_fashion_mnist_limits_give_stratified_subsets():
    limited = data.load_fashion_mnist(DEBIAN_DIR).limited(2000, 500, seed=0)

    assert class_counts(limited.train) == [200] * 10 and class_counts(limited.test) == [50] * 10
    assert limited.train[1999]["index"] == 1999
    again = data.load_fashion_mnist(DEBIAN_DIR).limited(2000, 500, seed=0)
    assert torch.equal(again.train.images, limited.train.images)


@needs_fashion_mnist
def test_fashion_mnist_validation_comes_from_the_training_images():
    pool = data.load_fashion_mnist(DEBIAN_DIR)
    splits = pool.limited(2000, 500, seed=3, val_limit=1000)

    assert class_counts(splits.val) == [100] * 10 and class_counts(splits.train) == [200] * 10
    kept, held = stratified_holdout(pool.train.labels, 1000, 2000, seed=3)
    assert not set(kept.tolist()) & set(held.tolist())
    assert torch.equal(splits.val.images, pool.train.images[held])
    without = pool.limited(2000, 500, seed=3)
    assert torch.equal(splits.train.images, without.train.images)
    assert torch.equal(splits.test.images, without.test.images)  # the 10,000 test images: not a source


@needs_fashion_mnist
def test_fashion_mnist_from_user_folders_plain_or_gzipped(tmp_path, monkeypatch):
    plain, torchvision_root = tmp_path / "plain", tmp_path / "tv"
    (torchvision_root / "FashionMNIST" / "raw").mkdir(parents=True)
    plain.mkdir()
    for name in files.FASHION_MNIST_FILES.values():
        with gzip.open(DEBIAN_DIR / f"{name}.gz") as src, open(plain / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
        shutil.copy(DEBIAN_DIR / f"{name}.gz", torchvision_root / "FashionMNIST" / "raw")

    assert files.find_fashion_mnist(str(plain)) == plain
    assert files.find_fashion_mnist(torchvision_root) == torchvision_root / "FashionMNIST" / "raw"
    monkeypatch.setenv(files.FASHION_MNIST_ENV, str(plain))
    assert files.find_fashion_mnist() == plain
    from_plain = data.load_fashion_mnist(plain)
    from_debian = data.load_fashion_mnist(DEBIAN_DIR)
    assert torch.equal(from_plain.test.images, from_debian.test.images)
    assert torch.equal(from_plain.train.labels, from_debian.train.labels)


def test_gzipped_idx_is_decompressed_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "IDX_CACHE", tmp_path / "cache")
    labels = np.arange(200, dtype=np.uint8) % 10
    source = tmp_path / "labels-idx1-ubyte.gz"
    with gzip.open(source, "wb") as f:
        f.write(b"\x00\x00\x08\x01" + len(labels).to_bytes(4, "big") + labels.tobytes())

    assert np.array_equal(data.read_idx(source), labels)
    (copy,) = (tmp_path / "cache").iterdir()
    assert copy.read_bytes()[8:] == labels.tobytes()  # the plain idx file, read from now on
    assert np.array_equal(data.read_idx(source), labels) and len(list((tmp_path / "cache").iterdir())) == 1

    with gzip.open(source, "wb") as f:  # a changed file gets a copy of its own
        f.write(b"\x00\x00\x08\x01" + (10).to_bytes(4, "big") + labels[:10].tobytes())
    assert np.array_equal(data.read_idx(source), labels[:10])


def test_missing_fashion_mnist_folder_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        files.find_fashion_mnist(tmp_path / "nowhere")
    message = str(error.value)
    for hint in (
        "apt-get install dataset-fashion-mnist",
        files.FASHION_MNIST_ENV,
        "download: true",
        str(tmp_path / "nowhere"),
    ):
        assert hint in message


def test_read_idx_refuses_other_files(tmp_path):
    (tmp_path / "bogus").write_bytes(b"not an idx file")
    with pytest.raises(ValueError, match="not a uint8 idx file"):
        data.read_idx(tmp_path / "bogus")


# --- image folders --------------------------------------------------------------------------


def write_pngs(root, classes: dict[str, int], count: int) -> None:
    """count solid-colour PNGs per class, of varied sizes; class name -> grey level."""
    for name, level in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            pixels = np.full((20 + 3 * i, 30, 3), level, dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")


def test_image_folder_grayscale_and_rgb(tmp_path):
    write_pngs(tmp_path, {"black": 0, "white": 255}, count=5)

    rgb = folder.load_image_folder(tmp_path, img_size=16, in_chans=3, seed=0)
    gray = folder.load_image_folder(tmp_path, img_size=12, in_chans=1, seed=0)

    assert rgb.classes == ("black", "white")
    assert (len(rgb.train), len(rgb.test)) == (8, 2)
    assert class_counts(rgb.test)[:2] == [1, 1]
    assert rgb.train[0]["image"].shape == (3, 16, 16)
    assert gray.train[0]["image"].shape == (1, 12, 12)
    for i in range(len(rgb.train)):  # black -> -1 and white -> +1 after normalisation
        item = rgb.train[i]
        expected = 1.0 if item["label"] == 1 else -1.0
        assert torch.allclose(item["image"], torch.full((3, 16, 16), expected), atol=1e-5)


def test_image_folder_with_train_and_test_subfolders(tmp_path):
    write_pngs(tmp_path / "train", {"a": 10, "b": 20, "c": 30}, count=4)
    write_pngs(tmp_path / "test", {"a": 10, "b": 20, "c": 30}, count=2)

    splits = folder.load_image_folder(tmp_path, img_size=8, in_chans=1)

    assert splits.classes == ("a", "b", "c")
    assert class_counts(splits.train)[:3] == [4, 4, 4]
    assert class_counts(splits.test)[:3] == [2, 2, 2]


def test_image_folder_validation_and_split_are_drawn_by_the_seed(tmp_path):
    write_pngs(tmp_path, {"a": 10, "b": 20, "c": 30}, count=10)

    def splits(seed: int) -> data.ImageSplits:
        config = VisionTaskConfig(dataset="image_folder", data_path=str(tmp_path), img_size=8, val_limit=6)
        return load_splits(config, seed)

    one, other = splits(0), splits(1)
    train, val, test = (set(map(str, getattr(one, split).paths)) for split in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (18, 6, 6)
    assert not train & val and not val & test and not train & test
    assert class_counts(one.val)[:3] == [2, 2, 2]
    assert set(map(str, other.test.paths)) != test and set(map(str, other.val.paths)) != val


def test_image_folder_missing_or_empty_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; expected one subfolder per class"):
        files.check_image_folder(tmp_path / "missing")
    (tmp_path / "only_class").mkdir()
    with pytest.raises(FileNotFoundError, match="1 class subfolders and 0 images"):
        files.check_image_folder(tmp_path)
