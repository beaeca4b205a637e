"""The multi-modal loader: layout refusals, items (shapes, dtypes, units, indices), limited
subsets, deterministic scoring views, and augmentation that keeps the modalities aligned."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from attent.tasks.batches import stack_items
from attent.tasks.mae.data import IMAGENET_MEAN, IMAGENET_STD, augment_images, load_multimodal
from attent.tasks.mae.files import check_multimodal_root, read_metadata
from attent.tasks.mae.scenes import SCENE_CLASSES, SEMSEG_CLASSES, write_dataset
from PIL import Image

MEAN, STD = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes") / "data"
    write_dataset(root, train=40, test=10, size=32, workers=1)
    return root


def write_sample(root, split, cls, name, *, size=(40, 30), semseg_top=3, seed=0):
    """One hand-made sample: random rgb, depth in mm (some 0), semseg ids below semseg_top."""
    rng = np.random.default_rng(seed)
    w, h = size
    for modality, array in [
        ("rgb", rng.integers(0, 256, (h, w, 3), dtype=np.uint8)),
        ("depth", rng.integers(0, 5000, (h, w)).astype(np.uint16)),
        ("semseg", rng.integers(0, semseg_top, (h, w)).astype(np.uint8)),
    ]:
        folder = root / split / modality / cls
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(folder / name)


@pytest.fixture
def tiny(tmp_path):
    """Two classes, no dataset.json, 40 x 30 files (not square, not the loader's size)."""
    root = tmp_path / "tiny"
    for split in ("train", "test"):
        for k, cls in enumerate(("dog", "cat")):
            write_sample(root, split, cls, "001.png", seed=k)
    return root


# --- refusals -------------------------------------------------------------------------------


def test_missing_root_or_modality_folder_is_named(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="attent data scenes"):
        check_multimodal_root(tmp_path / "nowhere")
    shutil.rmtree(tiny / "test" / "depth")
    with pytest.raises(FileNotFoundError, match=str(tiny / "test" / "depth")):
        check_multimodal_root(tiny)
    check_multimodal_root(tiny, modalities=("rgb", "semseg"))  # not asked for: fine


def test_file_names_differing_between_modalities_are_shown(tiny):
    write_sample(tiny, "train", "dog", "002.png")
    (tiny / "train" / "depth" / "dog" / "002.png").unlink()
    with pytest.raises(ValueError, match="1 file.*rgb has train/dog/002.png but depth has no such file"):
        check_multimodal_root(tiny)


def test_an_empty_split_is_refused(tiny):
    for path in (tiny / "test").rglob("*.png"):
        path.unlink()
    with pytest.raises(ValueError, match="holds no images"):
        check_multimodal_root(tiny)


def test_without_metadata_semseg_needs_its_class_count(tiny):
    assert read_metadata(tiny) is None
    with pytest.raises(ValueError, match="num_semseg_classes"):
        load_multimodal(tiny, img_size=32)
    splits = load_multimodal(tiny, img_size=32, num_semseg_classes=3)
    assert splits.scene_classes == ["cat", "dog"] and splits.semseg_classes == ["0", "1", "2"]
    assert splits.train.labels.tolist() == [0, 1]
    item = splits.test[1]  # 40 x 30 files: shorter side to 32, centre crop
    assert item["rgb"].shape == (3, 32, 32) and item["semseg"].shape == (32, 32)
    with pytest.raises(ValueError, match="not below num_semseg_classes=2"):
        load_multimodal(tiny, img_size=32, num_semseg_classes=2, cache=True)


# --- items ----------------------------------------------------------------------------------


def test_items_have_the_documented_shapes_units_and_indices(scenes):
    splits = load_multimodal(scenes, img_size=32)
    assert splits.scene_classes == list(SCENE_CLASSES)
    assert splits.semseg_classes == list(SEMSEG_CLASSES)
    assert len(splits.train) == 40 and len(splits.test) == 10
    assert torch.bincount(splits.train.labels).tolist() == [8] * 5
    for i in (0, 7, 9):
        item = splits.test[i]
        assert item["index"] == i and item["label"] == int(splits.test.labels[i])
        assert SCENE_CLASSES[item["label"]] == splits.test.paths[i]["rgb"].parent.name
        assert item["rgb"].shape == (3, 32, 32) and item["rgb"].dtype == torch.float32
        pixels = item["rgb"] * STD + MEAN
        assert pixels.min() >= -1e-6 and pixels.max() <= 1 + 1e-6
        assert item["depth"].shape == (1, 32, 32) and item["depth"].dtype == torch.float32
        assert item["semseg"].shape == (32, 32) and item["semseg"].dtype == torch.long
        assert int(item["semseg"].max()) < len(SEMSEG_CLASSES)
        mm = np.array(Image.open(splits.test.paths[i]["depth"])).astype(np.float32)
        np.testing.assert_allclose(item["depth"][0].numpy(), mm / 1000, rtol=1e-6)
        assert ((item["depth"][0] == 0) == (item["semseg"] == 0)).all()  # no hit = background
    batch = stack_items([splits.train[i] for i in range(4)])
    assert batch["index"].tolist() == [0, 1, 2, 3] and batch["label"].dtype == torch.long
    assert batch["rgb"].shape == (4, 3, 32, 32) and batch["semseg"].shape == (4, 32, 32)


def test_lazy_decoding_matches_the_cache_and_resizes(scenes):
    cached = load_multimodal(scenes, img_size=32, cache=True).test
    lazy = load_multimodal(scenes, img_size=32, cache=False).test
    assert cached.store is not None and lazy.store is None
    for key in ("rgb", "depth", "semseg"):
        assert torch.equal(cached[3][key], lazy[3][key])
    small = load_multimodal(scenes, img_size=16, modalities=("depth", "semseg"), cache=False).test
    item = small[3]
    assert set(item) == {"index", "label", "depth", "semseg"} and item["depth"].shape == (1, 16, 16)
    assert set(item["depth"].unique().tolist()) <= set(cached[3]["depth"].unique().tolist())  # nearest


def test_limited_is_stratified_deterministic_and_renumbered(scenes):
    splits = load_multimodal(scenes, img_size=32)
    small = splits.limited(20, 5, seed=0)
    assert len(small.train) == 20 and len(small.test) == 5
    assert torch.bincount(small.train.labels).tolist() == [4] * 5
    assert torch.bincount(small.test.labels, minlength=5).tolist() == [1] * 5
    assert [small.train[i]["index"] for i in range(20)] == list(range(20))
    assert [small.train[i]["label"] for i in range(20)] == small.train.labels.tolist()
    chosen = [p["rgb"] for p in small.train.paths]
    assert chosen == [p["rgb"] for p in splits.limited(20, 5, seed=0).train.paths]
    assert chosen != [p["rgb"] for p in splits.limited(20, 5, seed=1).train.paths]
    original = [p["rgb"] for p in splits.train.paths]
    j = original.index(chosen[7])
    plain = small.train.without_augmentation()
    assert torch.equal(plain[7]["rgb"], splits.train.without_augmentation()[j]["rgb"])
    assert plain[7]["index"] == 7 and small.train.augment and not plain.augment
    with pytest.raises(ValueError, match="train_limit=41"):
        splits.limited(41, None, seed=0)


def test_validation_is_held_out_of_the_train_split_unaugmented(scenes):
    splits = load_multimodal(scenes, img_size=32)
    held = splits.limited(20, 5, seed=0, val_limit=10)
    train, val, test = ({p["rgb"] for p in getattr(held, split).paths} for split in ("train", "val", "test"))

    assert (len(train), len(val), len(test)) == (20, 10, 5)
    assert not train & val and not val & test and not train & test
    assert val <= {p["rgb"] for p in splits.train.paths}
    assert torch.bincount(held.val.labels).tolist() == [2] * 5 and not held.val.augment
    without = splits.limited(20, 5, seed=0)
    assert [p["rgb"] for p in held.train.paths] == [p["rgb"] for p in without.train.paths]
    assert [p["rgb"] for p in held.test.paths] == [p["rgb"] for p in without.test.paths]
    with pytest.raises(ValueError, match="val_limit=30 \\+ train_limit=20 = 50 exceed the 40 training samples"):
        splits.limited(20, None, seed=0, val_limit=30)


def test_scoring_view_is_deterministic_and_augmentation_is_random(scenes):
    train = load_multimodal(scenes, img_size=32).train
    plain = train.without_augmentation()
    assert plain.paths == train.paths and torch.equal(plain.labels, train.labels)
    torch.manual_seed(0)
    first = plain[5]
    torch.manual_seed(1)
    assert all(torch.equal(first[k], plain[5][k]) for k in ("rgb", "depth", "semseg"))
    with Image.open(plain.paths[5]["rgb"]) as img:
        expected = torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(first["rgb"] * STD + MEAN, expected, atol=1e-5, rtol=0)
    views = []
    for seed in range(4):
        torch.manual_seed(seed)
        views.append(train[5]["rgb"])
    assert any(not torch.equal(views[0], v) for v in views[1:])
    torch.manual_seed(2)
    assert torch.equal(train[5]["rgb"], views[2])  # same seed, same crop
    assert load_multimodal(scenes, img_size=32, augment=False).train.augment is False


def test_augmentation_moves_every_modality_alike(scenes):
    """One label map drawn into all three modalities stays the same map after augmentation."""
    semseg = torch.zeros(1, 32, 32, dtype=torch.uint8)
    semseg[0, 4:14, 3:12], semseg[0, 18:30, 15:29], semseg[0, 2:9, 20:31] = 1, 2, 3
    images = {
        "rgb": (semseg * 60).expand(3, -1, -1).contiguous(),
        "depth": torch.from_numpy(semseg.numpy().astype(np.uint16) * 1000 + 500),
        "semseg": semseg,
    }  # uint16 like decoded depth PNGs
    seen = set()
    for seed in range(12):
        torch.manual_seed(seed)
        out = augment_images(images)
        assert out["depth"].dtype == torch.uint16
        assert torch.equal(out["depth"].int(), out["semseg"].int() * 1000 + 500)
        # rgb (bilinear) agrees wherever the 3 x 3 neighbourhood is one region
        label = out["semseg"][0].float()
        pooled = torch.nn.functional.max_pool2d(label[None], 3, 1, 1)[0]
        inner = pooled == -torch.nn.functional.max_pool2d(-label[None], 3, 1, 1)[0]
        diff = (out["rgb"][0].float() - label * 60).abs()[inner]
        assert inner.sum() > 100 and diff.max() <= 2
        seen.add(out["semseg"].numpy().tobytes())
    assert len(seen) > 6  # the crops (and flips) differ between seeds
    # real scenes: no surface <-> zero depth <-> black rgb, after augmentation too
    train = load_multimodal(scenes, img_size=32).train
    for seed in range(5):
        torch.manual_seed(seed)
        item = train[seed]
        assert ((item["depth"][0] == 0) == (item["semseg"] == 0)).all()
