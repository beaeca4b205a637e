"""The decoded cache (``attent data cache``) and integer shipping: a cache's round trip (the
same integers as decoding the files, whichever process builds it), its refusals (other files,
another size, none where one is required), the tasks reading it, and the device-side step
(``Task.prepare``) giving the very floats the loader's float items give (torch.equal)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from attent.tasks import cache as decoded
from attent.tasks.batches import stack_items
from attent.tasks.mae import data as mae_data
from attent.tasks.mae import decode as mae_decode
from attent.tasks.mae.scenes import write_dataset
from attent.tasks.vision import data as vision_data
from attent.tasks.vision import folder as vision_folder
from PIL import Image

KEYS = ("rgb", "depth", "semseg")


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache-scenes") / "data"
    write_dataset(root, train=30, test=10, size=32, workers=1)
    return root


@pytest.fixture(scope="module")
def scene_cache(scenes):
    return mae_data.build_cache(scenes, img_size=32, workers=1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An image folder of JPEG and PNG photos of several sizes, none at the task's 24 px."""
    root = tmp_path_factory.mktemp("cache-folder") / "images"
    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("test", 4)):
        for k in range(count):
            path = root / split / f"c{k % 2}" / f"{k:03d}.{'jpg' if k % 3 else 'png'}"
            path.parent.mkdir(parents=True, exist_ok=True)
            w, h = int(rng.integers(30, 60)), int(rng.integers(20, 50))
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return root


def same(a: dict, b: dict, keys=KEYS) -> bool:
    return all(torch.equal(a[k], b[k]) for k in keys if k in a)


# --- the multi-modal cache ------------------------------------------------------------------


def test_a_scene_cache_holds_what_decoding_the_files_gives(scenes, scene_cache):
    assert scene_cache["out"] == str(decoded.default_folder(scenes, 32))
    assert {s: e["count"] for s, e in scene_cache["splits"].items()} == {"train": 30, "test": 10}
    files = mae_data.load_multimodal(scenes, img_size=32, cache=False, cache_path=None)
    cached = mae_data.load_multimodal(scenes, img_size=32, cache_path="auto")  # found beside the data
    assert files.train.store is None and isinstance(cached.train.store, mae_decode.DiskStore)
    for split in ("train", "test"):
        plain, fast = getattr(files, split), getattr(cached, split)
        for i in range(len(plain)):
            assert same(plain.images(i), fast.images(i))  # the stored integers, bit for bit
            torch.manual_seed(i)
            expected = plain[i]
            torch.manual_seed(i)
            assert same(expected, fast[i])  # augmented items too (train): the same crop, the same floats
    limited = cached.limited(10, 5, seed=0, val_limit=5)
    reference = files.limited(10, 5, seed=0, val_limit=5)
    assert all(same(limited.val[i], reference.val[i]) for i in range(5))  # subsets keep their rows


def test_a_parallel_build_writes_the_same_arrays(scenes, scene_cache, tmp_path):
    out = mae_data.build_cache(scenes, tmp_path / "two", img_size=32, workers=2)
    assert out["workers"] == 2
    for split in ("train", "test"):
        one = decoded.arrays(decoded.default_folder(scenes, 32), split, KEYS)
        two = decoded.arrays(tmp_path / "two", split, KEYS)
        assert all(np.array_equal(one[m].array, two[m].array) for m in KEYS)
        assert one["rgb"].dtype == np.uint8 and one["depth"].dtype == np.uint16 and one["rgb"].shape[1:] == (32, 32, 3)


def test_device_side_normalisation_equals_the_loaders_floats(scenes, scene_cache):
    """Integer items collated, then ``to_model_inputs``: the float batch of the float items."""
    for cache_path in (None, "auto"):
        train = mae_data.load_multimodal(scenes, img_size=32, cache_path=cache_path).train
        for dataset in (train, train.without_augmentation()):
            torch.manual_seed(3)
            floats = stack_items([dataset[i] for i in range(8)])
            torch.manual_seed(3)
            shipped = stack_items([dataset.with_integers()[i] for i in range(8)])
            assert shipped["rgb"].dtype == torch.uint8 and shipped["depth"].dtype == torch.uint16
            assert shipped["semseg"].dtype == torch.uint8
            prepared = mae_data.to_model_inputs(shipped, dataset.fmt.depth_unit_m)
            assert same(prepared, floats) and prepared["rgb"].is_contiguous()
            assert mae_data.to_model_inputs(prepared, 0.001)["rgb"] is prepared["rgb"]  # idempotent


def test_a_cache_of_other_files_or_size_is_refused(scenes, scene_cache, tmp_path):
    with pytest.raises(FileNotFoundError, match="attent data cache"):
        mae_data.load_multimodal(scenes, img_size=16, cache_path="required")
    assert mae_data.load_multimodal(scenes, img_size=16, cache_path="auto").train.store is not None  # small: memory
    with pytest.raises(ValueError, match="at 32 px, not multimodal at 16 px"):
        mae_data.load_multimodal(scenes, img_size=16, cache_path=str(decoded.default_folder(scenes, 32)))
    # a file gone since the build: the listing no longer matches
    moved = tmp_path / "data"
    import shutil

    shutil.copytree(scenes, moved)
    for modality in KEYS:
        victim = sorted((moved / "test" / modality).rglob("*.png"))[0]
        victim.unlink()
    with pytest.raises(ValueError, match="built from other files"):
        mae_data.load_multimodal(moved, img_size=32, cache_path="auto")


def test_mapped_arrays_pickle_as_their_path(scene_cache):
    array = decoded.arrays(decoded.Path(scene_cache["out"]), "train", ["rgb"])["rgb"]
    first = array.row(0)
    assert array._array is not None
    copy = pickle.loads(pickle.dumps(array))
    assert copy._array is None and len(pickle.dumps(array)) < 1000  # no pixels in the pickle
    assert np.array_equal(copy.row(0), first)


def test_the_cli_builds_a_cache_from_an_experiment(scenes, tmp_path, capsys):
    from attent.cli.main import main

    spec = tmp_path / "exp.yaml"
    spec.write_text(
        f"name: c\ntask: {{name: multimae, data_path: {scenes}, img_size: 16}}\ntrain: {{epochs: 1, batch_size: 8}}\n"
    )
    assert main(["data", "cache", str(spec), "--out", str(tmp_path / "c16"), "--workers", "1"]) == 0
    assert "10 test samples at 16 px" in capsys.readouterr().out
    index = decoded.read_index(tmp_path / "c16")
    assert index["img_size"] == 16 and index["modalities"] == list(KEYS)
    loaded = mae_data.load_multimodal(scenes, img_size=16, cache_path=str(tmp_path / "c16"))
    assert isinstance(loaded.test.store, mae_decode.DiskStore)


# --- the image folder cache -----------------------------------------------------------------


def test_an_image_folder_cache_round_trip_and_its_floats(folder, tmp_path):
    index = vision_folder.build_cache(folder, tmp_path / "cache", img_size=24, workers=1)
    assert {s: e["count"] for s, e in index["splits"].items()} == {"train": 12, "test": 4}
    files = vision_folder.load_image_folder(folder, img_size=24, cache_path=None)
    cached = vision_folder.load_image_folder(folder, img_size=24, cache_path=str(tmp_path / "cache"))
    assert cached.train.cache is not None and files.train.cache is None
    for split in ("train", "test"):
        plain, fast = getattr(files, split), getattr(cached, split)
        for i in range(len(plain)):
            assert torch.equal(plain.pixels(i), fast.pixels(i)) and fast.pixels(i).dtype == torch.uint8
            assert torch.equal(plain[i]["image"], fast[i]["image"])
        shipped = stack_items([fast.with_integers()[i] for i in range(len(fast))])
        floats = stack_items([plain[i] for i in range(len(plain))])
        prepared = vision_data.model_inputs(shipped, plain.stats, 24)
        assert shipped["image"].dtype == torch.uint8 and torch.equal(prepared["image"], floats["image"])
    # the uint8 resize is within one level of the float resize of the full-size image
    with Image.open(files.train.paths[0]) as img:
        chw = torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1)
    full = torch.nn.functional.interpolate(chw[None].float(), size=(24, 24), mode="bilinear", antialias=True)[0]
    assert (files.train.pixels(0).float() - full).abs().max() <= 1.0
    with pytest.raises(ValueError, match="3-channel images, the task reads 1"):
        vision_folder.load_image_folder(folder, img_size=24, in_chans=1, cache_path=str(tmp_path / "cache"))


def test_native_size_images_are_prepared_on_the_device_as_in_the_loader():
    """Digits shipped as uint8 8 x 8 and resized to 16 px in ``model_inputs``: the floats the
    items resized one by one give (the batched resize is the per-image one)."""
    splits = vision_data.load_digits(img_size=16)
    train = splits.train
    floats = stack_items([train[i] for i in range(32)])
    shipped = stack_items([train.with_integers()[i] for i in range(32)])
    assert shipped["image"].shape == (32, 1, 8, 8) and shipped["image"].dtype == torch.uint8
    assert torch.equal(vision_data.model_inputs(shipped, train.stats, 16)["image"], floats["image"])


# --- the tasks ------------------------------------------------------------------------------


def test_the_tasks_ship_integers_and_prepare_the_same_inputs(scenes, scene_cache, folder):
    from attent.tasks.mae.config import MultiMAETaskConfig
    from attent.tasks.mae.task import MaskedPretrainingTask
    from attent.tasks.vision.config import VisionTaskConfig
    from attent.tasks.vision.task import VisionTask

    vision = VisionTask(
        VisionTaskConfig(dataset="image_folder", data_path=str(folder), img_size=24, model={"patch_size": 4}), seed=0
    )
    mae = MaskedPretrainingTask(
        MultiMAETaskConfig(data_path=str(scenes), img_size=32, model={"patch_size": 8}, visible_tokens=12), seed=0
    )
    assert isinstance(mae.train_dataset().store, mae_decode.DiskStore)  # auto: the cache beside the data
    for task in (vision, mae):
        items = [task.scoring_dataset()[i] for i in range(6)]
        shipped, model_inputs = task.loader_collate(items), task.collate(items)
        assert all(not v.is_floating_point() for k, v in shipped.items() if k in ("image", *KEYS))
        prepared = task.prepare(shipped)
        assert all(torch.equal(prepared[k], model_inputs[k]) for k in model_inputs)
        model = task.build_model().eval()
        with torch.no_grad():
            torch.testing.assert_close(
                task.score(model, shipped, 0), task.score(model, model_inputs, 0), rtol=0, atol=0
            )


def test_config_cache_path_keywords_and_checks(scenes, scene_cache, tmp_path):
    from attent.tasks.mae.config import MultiMAETaskConfig
    from attent.tasks.vision.config import VisionTaskConfig

    config = MultiMAETaskConfig(data_path=str(scenes), img_size=32, cache_path="required")
    config.check_data()  # the cache is there
    with pytest.raises(FileNotFoundError, match=f"attent data cache {scenes} --img-size 64"):
        MultiMAETaskConfig(data_path=str(scenes), img_size=64, cache_path="required").check_data()
    relative = MultiMAETaskConfig(data_path="d", cache_path="c").with_absolute_paths(tmp_path)
    assert relative.cache_path == str(tmp_path / "c") and relative.data_path == str(tmp_path / "d")
    assert MultiMAETaskConfig(data_path="d").with_absolute_paths(tmp_path).cache_path == "auto"
    job = MultiMAETaskConfig(data_path="d", cache_path="/x").downstream_task({"data_path": "e"}, pretrained=None)
    assert job["cache_path"] == "auto"  # the pretraining's cache is not the job's data's
    with pytest.raises(ValueError, match="drop cache_path"):
        VisionTaskConfig(dataset="digits", cache_path="required")
