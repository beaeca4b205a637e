"""The offline multi-modal scenes: hand-computed renders (depth, labels, shading, shadows),
determinism, and the files write_dataset / `attent data scenes` put on disk."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import trimesh
from attent.cli.main import main as cli_main
from attent.tasks.mae.scenes import (
    SCENE_CLASSES,
    SEMSEG_CLASSES,
    Camera,
    depth_to_png,
    random_scene,
    render,
    write_dataset,
)
from PIL import Image

SPHERE = SEMSEG_CLASSES.index("sphere")
CUBE = SEMSEG_CLASSES.index("cube")


def sphere_at(radius: float, distance: float) -> trimesh.Trimesh:
    mesh = trimesh.creation.icosphere(subdivisions=4, radius=radius)
    mesh.apply_translation((0, 0, -distance))
    return mesh


def test_sphere_on_the_optical_axis_has_hand_computed_depth_labels_and_silhouette():
    r, d, fov, size = 1.0, 5.0, 50.0, 33  # odd size: the centre pixel's ray is the optical axis
    camera = Camera((0, 0, 0), (0, 0, -1), fov_deg=fov, size=size)
    scene = render([(sphere_at(r, d), SPHERE, (1.0, 0.0, 0.0))], camera, light_dir=(0, 0, 1), ambient=0.2)
    c = size // 2
    assert scene.depth_m[c, c] == pytest.approx(d - r, rel=0.01)
    assert scene.semseg[c, c] == SPHERE
    assert tuple(scene.rgb[c, c]) == pytest.approx((255, 0, 0), abs=3)  # lit head-on
    assert scene.depth_m[0, 0] == 0 and scene.semseg[0, 0] == 0 and not scene.rgb[0, 0].any()
    # every clearly-inside pixel: z-depth of the analytic ray/sphere hit, t * cos(angle to axis)
    _, dirs = camera.rays()
    cos = -dirs[:, 2]
    disc = r**2 - d**2 * (1 - cos**2)
    inside = disc > 0.3 * r**2
    expected = (d * cos - np.sqrt(np.where(inside, disc, 0))) * cos
    np.testing.assert_allclose(scene.depth_m.ravel()[inside], expected[inside], rtol=0.01)
    # silhouette: a disc of angular radius asin(r/d)
    radius_px = math.tan(math.asin(r / d)) / math.tan(math.radians(fov / 2)) * size / 2
    assert (scene.semseg == SPHERE).sum() == pytest.approx(math.pi * radius_px**2, rel=0.1)
    assert ((scene.depth_m > 0) == (scene.semseg == SPHERE)).all()


def test_plane_facing_the_camera_has_the_same_z_depth_in_every_pixel():
    d, fov, size = 4.0, 60.0, 16
    wall = trimesh.creation.box(extents=(100, 100, 0.1))
    wall.apply_translation((0, 0, -(d + 0.05)))  # its front face at z = -d
    camera = Camera((0, 0, 0), (0, 0, -1), fov_deg=fov, size=size)
    scene = render([(wall, CUBE, (0.5, 0.5, 0.5))], camera, light_dir=(0, 0, 1), ambient=0.3)
    np.testing.assert_allclose(scene.depth_m, d, rtol=1e-4)
    corner_ray_length = d * math.hypot(1, *[math.tan(math.radians(fov / 2)) * (1 - 1 / size)] * 2)
    assert corner_ray_length > 1.2 * d  # so the check above tells z-depth from ray length
    assert (scene.semseg == CUBE).all()


def test_shadow_rays_darken_the_floor_behind_an_object():
    floor = trimesh.creation.box(extents=(20, 0.1, 20))
    floor.apply_translation((0, -0.05, 0))  # top face at y = 0
    block = trimesh.creation.box(extents=(1, 1, 1))
    block.apply_translation((0, 3, 0))  # light along (1, 1, 0): its shadow falls around x = -3
    camera = Camera((0, 10, 0), (0, 0, 0), up=(0, 0, -1), fov_deg=60, size=32)  # looking down
    objects = [(floor, 1, (1.0, 1.0, 1.0)), (block, CUBE, (1.0, 1.0, 1.0))]
    column = round((-3 / 10 / math.tan(math.radians(30)) + 1) / 2 * 32 - 0.5)  # x = -3 on the floor
    lit, unlit = (render(objects, camera, (1, 1, 0), ambient=0.2, shadows=s).rgb for s in (True, False))
    assert lit[16, column, 0] == pytest.approx(0.2 * 255, abs=2)  # ambient only
    assert lit[16, 31 - column, 0] == pytest.approx((0.2 + 0.8 / math.sqrt(2)) * 255, abs=2)
    assert unlit[16, column, 0] == unlit[16, 31 - column, 0]


def test_random_scenes_are_deterministic_balanced_and_dominated_by_their_class():
    a, b = random_scene(0, "train", 7, 32), random_scene(0, "train", 7, 32)
    for x, y in [(a.rgb, b.rgb), (a.depth_m, b.depth_m), (a.semseg, b.semseg)]:
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.rgb, random_scene(1, "train", 7, 32).rgb)
    assert not np.array_equal(a.rgb, random_scene(0, "test", 7, 32).rgb)
    assert a.label == 7 % len(SCENE_CLASSES)
    assert a.rgb.shape == (32, 32, 3) and a.depth_m.dtype == np.float32 and a.semseg.dtype == np.uint8
    assert set(np.unique(a.semseg)) <= set(range(len(SEMSEG_CLASSES)))
    assert ((a.depth_m == 0) == (a.semseg == 0)).all()
    big = random_scene(0, "train", 3, 64)
    assert big.rgb.shape == (64, 64, 3) and big.label == 3


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The same 20 + 10 scenes written by one and by two worker processes."""
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    summary = write_dataset(one / "d", train=20, test=10, size=32, seed=3, workers=1)
    write_dataset(two / "d", train=20, test=10, size=32, seed=3, workers=2)
    return one / "d", two / "d", summary


def test_write_dataset_is_identical_for_any_worker_count(written):
    one, two, summary = written
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert len(files) == 3 * 30 + 1
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    for rel in files:
        assert (one / rel).read_bytes() == (two / rel).read_bytes(), rel
    assert summary["train"] == 20 and summary["test"] == 10 and summary["seconds"] > 0
    assert summary["per_class"]["train"] == dict.fromkeys(SCENE_CLASSES, 4)
    assert summary["per_class"]["test"] == dict.fromkeys(SCENE_CLASSES, 2)


def test_written_files_round_trip_and_describe_themselves(written):
    root = written[0]
    meta = json.loads((root / "dataset.json").read_text())
    assert meta["semseg_classes"] == list(SEMSEG_CLASSES)
    assert meta["scene_classes"] == list(SCENE_CLASSES)
    assert meta["depth_unit_m"] == 0.001 and meta["image_size"] == 32
    assert meta["generator"]["seed"] == 3 and meta["generator"]["counts"] == {"train": 20, "test": 10}
    scene = random_scene(3, "test", 6, 32)
    cls = SCENE_CLASSES[scene.label]
    with Image.open(root / "test" / "depth" / cls / "000006.png") as img:
        assert img.mode.startswith("I;16")
        mm = np.array(img).astype(np.int64)
    np.testing.assert_array_equal(mm, depth_to_png(scene.depth_m))
    np.testing.assert_allclose(mm / 1000, scene.depth_m, atol=0.0005 + 1e-6)
    assert (mm[scene.depth_m == 0] == 0).all() and (mm[scene.depth_m > 0] > 0).all()
    with Image.open(root / "test" / "rgb" / cls / "000006.png") as img:
        assert img.mode == "RGB" and np.array_equal(np.array(img), scene.rgb)
    with Image.open(root / "test" / "semseg" / cls / "000006.png") as img:
        assert img.mode == "L" and np.array_equal(np.array(img), scene.semseg)


def test_the_scene_class_is_the_most_frequent_object_label(written):
    root, dominated, total = written[0], 0, 0
    for path in (root / "train" / "semseg").rglob("*.png"):
        counts = np.bincount(np.array(Image.open(path)).ravel(), minlength=len(SEMSEG_CLASSES))
        dominated += SCENE_CLASSES[int(counts[2:].argmax())] == path.parent.name
        total += 1
    assert total == 20 and dominated >= 0.9 * total


def test_write_dataset_refuses_a_used_folder_and_bad_sizes(written, tmp_path):
    with pytest.raises(ValueError, match="already holds"):
        write_dataset(written[0], train=2, test=2)
    with pytest.raises(ValueError, match="size=8"):
        write_dataset(tmp_path / "x", train=2, test=2, size=8)


def test_cli_data_scenes_writes_the_layout(tmp_path, capsys):
    out = tmp_path / "cli"
    assert (
        cli_main(["data", "scenes", "--out", str(out), "--train", "5", "--test", "5", "--size", "32", "--workers", "1"])
        == 0
    )
    line = capsys.readouterr().out
    assert "5 train + 5 test scenes at 32 px" in line
    assert len(list((out / "train" / "depth").rglob("*.png"))) == 5
    assert cli_main(["data", "scenes", "--out", str(out), "--train", "5"]) == 2  # refused
    assert "already holds" in capsys.readouterr().err
