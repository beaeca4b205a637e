"""Offline multi-modal scenes: aligned RGB, depth and semantic segmentation, rendered by ray casting.

Why: the Multi-Modal MAE workload needs pixel-aligned rgb / depth / semseg images with a scene
label, and the real sets (NYUv2, ImageNet-S50 with pseudo labels) are large downloads. These
scenes are rendered offline and deterministically with trimesh meshes and Embree ray casting
(embreex), and written in the layout MultiMAE reads (see ``files.py``):
``<out>/<split>/{rgb,depth,semseg}/<class>/<index:06d>.png`` plus ``<out>/dataset.json``.

A scene is a tiled floor, one dominant object (its shape is the scene class) and 1-3 smaller
distractors, lit by a directional light (Lambertian, with shadow rays) plus ambient light.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import trimesh
from PIL import Image
from trimesh.ray.ray_pyembree import RayMeshIntersector

SEMSEG_CLASSES = ("background", "floor", "sphere", "cube", "cylinder", "cone", "torus")
SCENE_CLASSES = ("sphere", "cube", "cylinder", "cone", "torus")
BACKGROUND, FLOOR = 0, 1  # semseg ids of "no surface" and of the floor
DEPTH_UNIT_M = 0.001  # depth PNGs store millimetres (NYUv2's raw convention); 0 = invalid
FOV_DEG = 55.0  # the generator's camera field of view
SIZES = (16, 256)  # image sizes write_dataset accepts (tested at 32-64)
MAX_ATTEMPTS = 8  # layouts drawn before accepting one whose dominant object is not the largest
MIN_DOMINANT_FRACTION = 0.04  # the dominant class must cover at least this share of the image
CHUNK = 200  # scenes per worker job
FORMAT_VERSION = 1  # bump when the renderer's output changes


@dataclass(frozen=True)
class Camera:
    """A pinhole camera producing size x size square images; fov_deg is the full field of view."""

    position: tuple[float, float, float]
    look_at: tuple[float, float, float]
    up: tuple[float, float, float] = (0.0, 1.0, 0.0)
    fov_deg: float = FOV_DEG
    size: int = 32

    def basis(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(right, up, forward) unit vectors in world coordinates."""
        forward = np.subtract(self.look_at, self.position).astype(np.float64)
        forward /= np.linalg.norm(forward)
        right = np.cross(forward, self.up)
        right /= np.linalg.norm(right)
        return right, np.cross(right, forward), forward

    def rays(self) -> tuple[np.ndarray, np.ndarray]:
        """(origins, unit directions), each [size*size, 3], through pixel centres in row-major
        order with row 0 at the top of the image."""
        right, up, forward = self.basis()
        t = math.tan(math.radians(self.fov_deg) / 2)
        c = (np.arange(self.size) + 0.5) / self.size * 2 - 1  # pixel centres in [-1, 1]
        u, v = np.meshgrid(c * t, -c * t)  # v: image rows go down, camera up goes up
        dirs = u.reshape(-1, 1) * right + v.reshape(-1, 1) * up + forward
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        return np.broadcast_to(np.asarray(self.position, np.float64), dirs.shape).copy(), dirs


@dataclass
class RenderedScene:
    """One view: rgb uint8 [H, W, 3]; depth_m float32 [H, W] z-depth in metres (0 = no hit);
    semseg uint8 [H, W] ids into SEMSEG_CLASSES; label the scene class (-1 when none)."""

    rgb: np.ndarray
    depth_m: np.ndarray
    semseg: np.ndarray
    label: int = -1


# --- rendering ------------------------------------------------------------------------------


def _concatenate(objects: Sequence[tuple[trimesh.Trimesh, int, object]]):
    """One mesh of all objects (faces in order) with per-face labels and albedos."""
    offsets = np.cumsum([0] + [len(m.vertices) for m, _, _ in objects])
    vertices = np.concatenate([m.vertices for m, _, _ in objects])
    faces = np.concatenate([m.faces + o for (m, _, _), o in zip(objects, offsets)])
    labels = np.concatenate([np.full(len(m.faces), lab, np.uint8) for m, lab, _ in objects])
    albedo = np.concatenate([np.broadcast_to(np.asarray(c, np.float64), (len(m.faces), 3)) for m, _, c in objects])
    return trimesh.Trimesh(vertices, faces, process=False), labels, albedo


def render(
    objects: Sequence[tuple[trimesh.Trimesh, int, object]],
    camera: Camera,
    light_dir: Sequence[float],
    ambient: float,
    *,
    shadows: bool = True,
    label: int = -1,
) -> RenderedScene:
    """Ray-cast objects = [(mesh, semseg id, albedo)], albedo an RGB triple in [0, 1] or one per
    face [n_faces, 3]. light_dir points from the surface towards the (directional) light.

    Each pixel's colour is albedo * (ambient + (1 - ambient) * max(0, n.l) * lit), n the hit
    triangle's normal turned towards the camera, lit 0 where a shadow ray hits something.
    Depth is the z-depth (distance along the optical axis), not the ray length."""
    mesh, face_label, face_albedo = _concatenate(objects)
    origins, dirs = camera.rays()
    caster = RayMeshIntersector(mesh)
    tri, ray, loc = caster.intersects_id(origins, dirs, multiple_hits=False, return_locations=True)
    normal = mesh.face_normals[tri]
    normal[np.einsum("ij,ij->i", normal, dirs[ray]) > 0] *= -1  # face the camera
    light = np.asarray(light_dir, np.float64) / np.linalg.norm(light_dir)
    lambert = np.clip(normal @ light, 0, None)
    if shadows and len(ray):
        lit = lambert > 0
        start = loc[lit] + normal[lit] * 1e-4 * mesh.scale  # step off the surface
        lambert[np.flatnonzero(lit)[caster.intersects_any(start, np.broadcast_to(light, start.shape))]] = 0
    shade = ambient + (1 - ambient) * lambert
    n = camera.size * camera.size
    rgb, depth, semseg = np.zeros((n, 3)), np.zeros(n, np.float32), np.zeros(n, np.uint8)
    rgb[ray] = face_albedo[tri] * shade[:, None]
    depth[ray] = (loc - origins[ray]) @ camera.basis()[2]
    semseg[ray] = face_label[tri]
    shape = (camera.size, camera.size)
    return RenderedScene(
        np.round(np.clip(rgb, 0, 1) * 255).astype(np.uint8).reshape(*shape, 3),
        depth.reshape(shape),
        semseg.reshape(shape),
        label,
    )


# --- random scenes --------------------------------------------------------------------------


@cache
def unit_shape(name: str) -> trimesh.Trimesh:
    """The shape centred on its bounding box, scaled so its farthest vertex is at distance 1
    (objects are then sized by one radius whatever their shape). Cached: built once per process."""
    make = {
        "sphere": lambda: trimesh.creation.icosphere(subdivisions=3),
        "cube": lambda: trimesh.creation.box(extents=(1, 1, 1)),
        "cylinder": lambda: trimesh.creation.cylinder(radius=0.6, height=1.6, sections=32),
        "cone": lambda: trimesh.creation.cone(radius=0.8, height=1.6, sections=32),
        "torus": lambda: trimesh.creation.torus(
            major_radius=0.7, minor_radius=0.3, major_sections=32, minor_sections=16
        ),
    }[name]
    mesh = make()
    vertices = mesh.vertices - mesh.bounds.mean(axis=0)
    vertices /= np.linalg.norm(vertices, axis=1).max()
    return trimesh.Trimesh(vertices, mesh.faces, process=False)


def place(rng: np.random.Generator, shape: str, radius: float, x: float, z: float) -> trimesh.Trimesh:
    """The shape at a random rotation, scaled to radius, at (x, z), resting on or floating up to
    a quarter radius above the floor (y = 0)."""
    rotation = trimesh.transformations.random_rotation_matrix(rand=rng.random(3))[:3, :3]
    vertices = unit_shape(shape).vertices @ rotation.T * radius
    lift = rng.uniform(0, 0.25 * radius) - vertices[:, 1].min()
    return trimesh.Trimesh(vertices + (x, lift, z), unit_shape(shape).faces, process=False)


@cache
def floor_grid(tiles: int = 40, tile_m: float = 1.0) -> trimesh.Trimesh:
    """A square floor at y = 0 of tiles x tiles quads (2 triangles each) in front of the camera."""
    edge = (np.arange(tiles + 1) - tiles / 2) * tile_m
    x, z = np.meshgrid(edge, edge - tiles * tile_m / 2 + 2)  # from 2 m behind the camera
    vertices = np.stack([x.ravel(), np.zeros(x.size), z.ravel()], axis=1)
    k = (np.arange(tiles)[:, None] * (tiles + 1) + np.arange(tiles)).ravel()  # quad corners
    faces = np.stack([k, k + tiles + 1, k + 1, k + 1, k + tiles + 1, k + tiles + 2], axis=1)
    return trimesh.Trimesh(vertices, faces.reshape(-1, 3), process=False)


def floor_albedo(rng: np.random.Generator, tiles: int = 40) -> np.ndarray:
    """Per-face albedo of floor_grid: a muted random colour in a two-tone checkerboard."""
    base = rng.uniform(0.35, 0.75) + rng.uniform(-0.08, 0.08, 3)
    row, col = np.divmod(np.arange(tiles * tiles), tiles)
    tone = np.where((row + col) % 2 == 0, 1.0, 0.8)
    return np.repeat(tone, 2)[:, None] * base


def split_id(split: str) -> int:
    """A stable number for a split name (Python's hash() changes between processes)."""
    return zlib.crc32(split.encode())


def _distractor_positions(
    rng: np.random.Generator, count: int, radii: np.ndarray, dominant: tuple[float, float, float]
) -> list[tuple[float, float]]:
    """(x, z) of distractors in the camera's view cone, clear of the dominant object and of each
    other on the floor (rejection sampling; a distractor that finds no room is dropped)."""
    half = math.tan(math.radians(FOV_DEG) / 2) * 0.8  # keep most of each object in the frame
    placed = [dominant]
    for r in radii[:count]:
        for _ in range(20):
            d = rng.uniform(3.0, 9.0)  # distance in front of the camera
            x, z = rng.uniform(-half, half) * d, -d
            if all(math.hypot(x - px, z - pz) > r + pr + 0.2 for px, pz, pr in placed):
                placed.append((x, z, r))
                break
    return [(x, z) for x, z, _ in placed[1:]]


def _draw_scene(rng: np.random.Generator, label: int, size: int) -> RenderedScene:
    """One random layout of a scene of class label."""
    radius = rng.uniform(0.9, 1.25)  # the dominant object: clearly larger than distractors
    x, z = rng.uniform(-0.6, 0.6), -rng.uniform(4.5, 6.5)
    objects = [(floor_grid(), FLOOR, floor_albedo(rng))]
    objects.append((place(rng, SCENE_CLASSES[label], radius, x, z), 2 + label, rng.uniform(0.15, 1.0, 3)))
    count = int(rng.integers(1, 4))
    shapes, radii = rng.integers(0, len(SCENE_CLASSES), 3), rng.uniform(0.25, 0.45, 3)
    for k, (dx, dz) in enumerate(_distractor_positions(rng, count, radii, (x, z, radius))):
        objects.append(
            (place(rng, SCENE_CLASSES[shapes[k]], radii[k], dx, dz), 2 + int(shapes[k]), rng.uniform(0.15, 1.0, 3))
        )
    height = rng.uniform(1.5, 3.0)  # camera height above the floor
    target = (x + rng.uniform(-0.4, 0.4), radius * rng.uniform(0.6, 1.2), z)
    camera = Camera((0.0, height, 0.0), target, fov_deg=FOV_DEG, size=size)
    azimuth, elevation = rng.uniform(0, 2 * math.pi), math.radians(rng.uniform(25, 75))
    light = (math.cos(elevation) * math.sin(azimuth), math.sin(elevation), math.cos(elevation) * math.cos(azimuth))
    return render(objects, camera, light, ambient=rng.uniform(0.15, 0.35), label=label)


def dominant_is_largest(scene: RenderedScene) -> bool:
    """Whether the scene's class covers the most pixels among object classes, and enough of them."""
    counts = np.bincount(scene.semseg.ravel(), minlength=len(SEMSEG_CLASSES))[2:]
    return int(counts.argmax()) == scene.label and counts[scene.label] >= MIN_DOMINANT_FRACTION * scene.semseg.size


def random_scene(seed: int, split: str, index: int, size: int) -> RenderedScene:
    """Scene `index` of a split: class index % 5 (balanced); deterministic in (seed, split, index).
    Layouts where a distractor hides the dominant object are redrawn (from the same generator)."""
    rng = np.random.default_rng([seed, split_id(split), index])
    label = index % len(SCENE_CLASSES)
    for _ in range(MAX_ATTEMPTS):
        scene = _draw_scene(rng, label, size)
        if dominant_is_largest(scene):
            break
    return scene


# --- the dataset on disk --------------------------------------------------------------------


def depth_to_png(depth_m: np.ndarray) -> np.ndarray:
    """Metres -> uint16 millimetres; 0 stays 0 (no surface), hits are at least 1 mm."""
    mm = np.clip(np.round(depth_m / DEPTH_UNIT_M), 1, 65535).astype(np.uint16)
    return np.where(depth_m > 0, mm, 0).astype(np.uint16)


def save_scene(scene: RenderedScene, root: Path, split: str, name: str) -> None:
    """The three PNGs of one scene under root/split/<modality>/<class>/name."""
    cls = SCENE_CLASSES[scene.label]
    Image.fromarray(scene.rgb).save(root / split / "rgb" / cls / name)
    Image.fromarray(depth_to_png(scene.depth_m)).save(root / split / "depth" / cls / name)
    Image.fromarray(scene.semseg).save(root / split / "semseg" / cls / name)


def _write_chunk(root: str, split: str, start: int, stop: int, size: int, seed: int) -> list[int]:
    """Render and save scenes start..stop-1 of a split; returns per-class counts (a worker job)."""
    counts = [0] * len(SCENE_CLASSES)
    for index in range(start, stop):
        scene = random_scene(seed, split, index, size)
        save_scene(scene, Path(root), split, f"{index:06d}.png")
        counts[scene.label] += 1
    return counts


def _check_out(out: Path, counts: dict[str, int], size: int) -> None:
    if not SIZES[0] <= size <= SIZES[1]:
        raise ValueError(f"size={size} must be between {SIZES[0]} and {SIZES[1]} pixels")
    if any(n < 0 for n in counts.values()) or not any(counts.values()):
        raise ValueError(f"scene counts {counts} must be >= 0, and not all 0")
    taken = [p for p in [out / "dataset.json", *(out / s for s in counts)] if p.exists()]
    if taken:
        raise ValueError(
            f"{out} already holds {', '.join(p.name for p in taken)}; "
            f"write to a new folder, or delete the old one first"
        )


def write_dataset(
    out: str | os.PathLike,
    *,
    train: int = 10000,
    test: int = 2000,
    size: int = 32,
    seed: int = 0,
    workers: int | None = None,
) -> dict:
    """Render and write train + test scenes and dataset.json; returns a summary.

    Every file depends only on (seed, split, index), so the bytes are the same whatever the
    number of worker processes. dataset.json is written last: its presence marks a complete set.
    Workers are spawned (not forked), so a calling script needs an ``if __name__ == "__main__"``."""
    out, counts = Path(out), {"train": train, "test": test}
    _check_out(out, counts, size)
    for split in counts:
        for modality in ("rgb", "depth", "semseg"):
            for cls in SCENE_CLASSES:
                (out / split / modality / cls).mkdir(parents=True, exist_ok=True)
    jobs = [(str(out), s, a, min(a + CHUNK, n), size, seed) for s, n in counts.items() for a in range(0, n, CHUNK)]
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    started = time.perf_counter()
    if workers == 1:
        results = [_write_chunk(*job) for job in jobs]
    else:  # spawn: no fork of a parent whose Embree / torch threads may hold locks
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_write_chunk, *zip(*jobs)))
    per_class = {s: dict.fromkeys(SCENE_CLASSES, 0) for s in counts}
    for job, result in zip(jobs, results):
        for cls, n in zip(SCENE_CLASSES, result):
            per_class[job[1]][cls] += n
    meta = {
        "semseg_classes": list(SEMSEG_CLASSES),
        "scene_classes": list(SCENE_CLASSES),
        "depth_unit_m": DEPTH_UNIT_M,
        "image_size": size,
        "generator": {
            "name": "attent.tasks.mae.scenes",
            "version": FORMAT_VERSION,
            "seed": seed,
            "fov_deg": FOV_DEG,
            "counts": counts,
            "per_class": per_class,
        },
    }
    (out / "dataset.json").write_text(json.dumps(meta, indent=2) + "\n")
    return {
        "out": str(out),
        **counts,
        "size": size,
        "seed": seed,
        "workers": workers,
        "per_class": per_class,
        "seconds": time.perf_counter() - started,
    }
