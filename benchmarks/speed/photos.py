"""Photo-sized synthetic data for the input-pipeline studies: an ImageFolder of ImageNet-sized
JPEGs, a multi-modal set in MultiMAE's layout at ImageNet-S50's file sizes, and the offline
scenes (``attent data scenes``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


def photo(w: int, h: int, rng: np.random.Generator) -> Image.Image:
    """A synthetic photo-like image: a smooth colour field, blurred ellipses, sensor-like noise
    (JPEG-compresses to ImageNet-like sizes, 50-110 kB at 500 x 375, quality 90)."""
    base = Image.fromarray((rng.random((6, 8, 3)) * 255).astype(np.uint8)).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(base)
    for _ in range(12):
        x, y, r = int(rng.integers(0, w)), int(rng.integers(0, h)), int(rng.integers(10, 120))
        draw.ellipse(
            [x - r, y - r, x + r, y + int(r * rng.uniform(0.5, 1.5))], fill=tuple(map(int, rng.integers(0, 256, 3)))
        )
    pixels = np.asarray(base.filter(ImageFilter.GaussianBlur(1.5))).astype(np.int16)
    pixels = pixels + rng.normal(0, 12, pixels.shape).astype(np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def image_folder(root: Path, samples: int, seed: int = 0) -> Path:
    """root/{train,test}/<class>/*.jpg: ImageNet-sized synthetic photos, 10 classes."""
    if (root / "train").is_dir():
        return root
    rng = np.random.default_rng(seed)
    for split, count in (("train", samples), ("test", max(10, samples // 5))):
        for k in range(count):
            folder = root / split / f"c{k % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            w, h = int(rng.integers(400, 501)), int(rng.integers(300, 376))
            photo(w, h, rng).save(folder / f"{k:05d}.jpg", quality=90)
    return root


def photo_multimodal(root: Path, samples: int, seed: int = 0) -> Path:
    """MultiMAE's layout at photo size: rgb JPEG, depth uint16 PNG (mm), semseg PNG, 500 x 375."""
    if (root / "train").is_dir():
        return root
    rng = np.random.default_rng(seed)
    for split, count in (("train", samples), ("test", max(10, samples // 5))):
        for k in range(count):
            name, cls = f"{k:05d}", f"c{k % 5}"
            rgb = photo(500, 375, rng)
            field = Image.fromarray((rng.random((5, 7)) * 255).astype(np.uint8)).resize((500, 375), Image.BICUBIC)
            depth = 500 + np.asarray(field).astype(np.float32) * 30 + rng.normal(0, 20, (375, 500))
            semseg = (np.asarray(rgb.convert("L")) // 32).astype(np.uint8)  # 8 region ids
            for modality, image, suffix in (
                ("rgb", rgb, "jpg"),
                ("depth", Image.fromarray(np.clip(depth, 1, 65535).astype(np.uint16)), "png"),
                ("semseg", Image.fromarray(semseg), "png"),
            ):
                folder = root / split / modality / cls
                folder.mkdir(parents=True, exist_ok=True)
                image.save(folder / f"{name}.{suffix}", **({"quality": 90} if suffix == "jpg" else {}))
    (root / "dataset.json").write_text('{"semseg_classes": ["0","1","2","3","4","5","6","7"], "depth_unit_m": 0.001}')
    return root


def scenes(root: Path, samples: int, img_size: int) -> Path:
    if not (root / "train").is_dir():
        subprocess.run(
            [
                "attent",
                "data",
                "scenes",
                "--out",
                str(root),
                "--train",
                str(samples),
                "--test",
                "20",
                "--size",
                str(img_size),
            ],
            check=True,
        )
    return root
