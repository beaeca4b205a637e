"""How fast one loader process delivers samples, before and after the decoded cache and integer
shipping, for the two vision workloads at 224 px (the ImageFolder ViT and the Multi-Modal MAE),
and how many loader processes per H100 that rate implies at each model's step rate.

    python benchmarks/speed/input_pipeline.py [--samples 300] [--repeats 5] [--out FOLDER]

Data, generated into ``--workdir`` unless given: the offline scenes at 224 px (``attent data
scenes``: small flat-shaded PNGs), a photo-sized multi-modal set (ImageNet-sized 500 x 375 JPEG
rgb, 16-bit depth and 8-bit semseg PNGs at full size, as ImageNet-S50's pseudo-labelled files
are) and an ImageFolder of ImageNet-sized synthetic photos (JPEG, quality 90). Every path runs
in this one process, one torch thread, item by item and collated into batches as a DataLoader
worker does; its rate is samples per CPU-second of the process (``time.process_time``: the rate
of a loader process that has a core to itself, robust to other load on the machine), the wall
rate beside it. The H100 step rate comes from the paper-scale models' FLOPs per training sample
(counted by ``torch.utils.flop_counter`` on this CPU) at an assumed 40 % of the H100 SXM's
989 dense bf16 TFLOP/s (``--mfu``); a scoring pass runs forwards only, 3x the training rate.

Writes ``README.md`` (tables, command, machine) and ``results.json`` into ``--out``, by default a
new folder ``benchmarks/results/input_pipeline/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402
from attent.tasks.mae import data as mae_data  # noqa: E402
from attent.tasks.vision import data as vision_data  # noqa: E402

H100_BF16_DENSE = 989e12  # FLOP/s, H100 SXM5 dense bf16 (NVIDIA's datasheet)
P4D_VCPUS_PER_GPU = 12  # a p4d.24xlarge: 96 vCPUs, 8 GPUs
IMG = 224


# --- data -----------------------------------------------------------------------------------


def photo(w: int, h: int, rng: np.random.Generator) -> Image.Image:
    """A synthetic photo-like image: a smooth colour field, blurred ellipses, sensor-like noise
    (JPEG-compresses to ImageNet-like sizes, 50-110 kB at 500 x 375, quality 90)."""
    base = Image.fromarray((rng.random((6, 8, 3)) * 255).astype(np.uint8)).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(base)
    for _ in range(12):
        x, y, r = int(rng.integers(0, w)), int(rng.integers(0, h)), int(rng.integers(10, 120))
        draw.ellipse([x - r, y - r, x + r, y + int(r * rng.uniform(0.5, 1.5))], fill=tuple(map(int, rng.integers(0, 256, 3))))
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


def scenes(root: Path, samples: int) -> Path:
    if not (root / "train").is_dir():
        subprocess.run(
            ["attent", "data", "scenes", "--out", str(root), "--train", str(samples), "--test", "20", "--size", str(IMG)],
            check=True,
        )
    return root


# --- timing ---------------------------------------------------------------------------------


def clock(read_batch, batches: int, repeats: int) -> dict[str, float]:
    """Median over repeats of (samples per CPU-second, samples per wall-second) of
    ``read_batch(b) -> samples`` over ``batches`` batches; one uncounted pass first."""
    cpu_rates, wall_rates = [], []
    for repeat in range(repeats + 1):
        cpu, wall, done = time.process_time(), time.perf_counter(), 0
        for b in range(batches):
            done += read_batch(b)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if repeat:
            cpu_rates.append(done / cpu)
            wall_rates.append(done / wall)
    return {"cpu_rate": statistics.median(cpu_rates), "wall_rate": statistics.median(wall_rates)}


def loader(dataset, collate, batch: int):
    """What a DataLoader worker does for batch b: items of a shuffled order, collated."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()

    def read_batch(b: int) -> int:
        start = (b * batch) % max(1, len(dataset) - batch + 1)
        collate([dataset[i] for i in order[start : start + batch]])
        return batch

    return read_batch


def batches_for(dataset, batch: int) -> int:
    return max(1, len(dataset) // batch)


# --- the ImageFolder ViT --------------------------------------------------------------------


class HeadImageFolder(torch.utils.data.Dataset):
    """The ImageFolder item of the code before the cache (commit 6a98bf6's
    ``ImageFolderDataset.__getitem__``): PIL decode, the full-size image to float, antialiased
    F.interpolate to img_size, normalised, float32 shipped."""

    def __init__(self, paths, img_size: int):
        self.paths, self.img_size = paths, img_size
        self.mean = torch.tensor((0.5, 0.5, 0.5)).view(-1, 1, 1)
        self.std = self.mean.clone()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        with Image.open(self.paths[i]) as img:
            pixels = np.atleast_3d(np.array(img.convert("RGB")))
        chw = torch.from_numpy(pixels).permute(2, 0, 1)
        return {"index": i, "image": vision_data.to_model_input(chw, self.mean, self.std, self.img_size), "label": 0}


class TorchvisionDecodeFolder(HeadImageFolder):
    """The uncached integer path with torchvision.io.decode_jpeg (libjpeg-turbo) in place of PIL."""

    def __getitem__(self, i: int):
        from torchvision.io import ImageReadMode, decode_image, read_file

        chw = decode_image(read_file(str(self.paths[i])), mode=ImageReadMode.RGB)
        return {"index": i, "image": vision_data.resize_uint8(chw, self.img_size), "label": 0}


def vision_paths(root: Path, samples: int, batch: int, repeats: int, workdir: Path) -> list[dict]:
    splits = vision_data.load_image_folder(root, img_size=IMG, cache_path=None)
    train = splits.train
    cached = vision_data.load_image_folder(root, img_size=IMG, cache_path=str(workdir / "vision-cache")).train
    rows = []

    def run(name: str, dataset, collate, note: str) -> None:
        rate = clock(loader(dataset, collate, batch), batches_for(dataset, batch), repeats)
        item = collate([dataset[0], dataset[1]])["image"]
        rows.append({"path": name, **rate, "bytes_per_sample": item[0].numel() * item.element_size(), "note": note})
        print(f"  {name}: {rate['cpu_rate']:.0f} samples/CPU-s ({rate['wall_rate']:.0f}/wall-s)", flush=True)

    run("before: PIL decode, float resize and normalise per item", HeadImageFolder(train.paths, IMG), vision_data.collate, "float32 shipped")
    run("uncached, integers: PIL decode, uint8 resize", train.with_integers(), vision_data.collate, "uint8 shipped")
    run("uncached, integers: torchvision.io decode, uint8 resize", TorchvisionDecodeFolder(train.paths, IMG), vision_data.collate, "uint8 shipped")
    run("after: decoded cache (memory-mapped), integers", cached.with_integers(), vision_data.collate, "uint8 shipped")
    run("decoded cache, float items (normalised in the loader)", cached, vision_data.collate, "float32 shipped")
    return rows


def build_vision_cache(root: Path, workdir: Path) -> dict:
    out = workdir / "vision-cache"
    if (out / "index.json").is_file():
        return {"seconds": float("nan"), "bytes": sum(f.stat().st_size for f in out.iterdir())}
    return vision_data.build_cache(root, out, img_size=IMG, workers=1)


# --- the Multi-Modal MAE --------------------------------------------------------------------


def mae_paths(root: Path, batch: int, repeats: int, workdir: Path, label: str) -> list[dict]:
    out = workdir / f"{label}-cache"
    built = None
    if not (out / "index.json").is_file():
        built = mae_data.build_cache(root, out, img_size=IMG, workers=1)
    plain = mae_data.load_multimodal(root, img_size=IMG, cache=False, cache_path=None)
    cached = mae_data.load_multimodal(root, img_size=IMG, cache_path=str(out))
    rows = []

    def run(name: str, dataset, note: str) -> None:
        rate = clock(loader(dataset, mae_data.collate, batch), batches_for(dataset, batch), repeats)
        item = mae_data.collate([dataset[0]])
        size = sum(item[m][0].numel() * item[m].element_size() for m in ("rgb", "depth", "semseg"))
        rows.append({"path": name, **rate, "bytes_per_sample": size, "note": note})
        print(f"  {name}: {rate['cpu_rate']:.0f} samples/CPU-s ({rate['wall_rate']:.0f}/wall-s)", flush=True)

    torch.manual_seed(0)
    run("before: three files decoded per item, crop, float in the loader", plain.train, "float32 + int64 shipped")
    run("uncached, integers: three files decoded per item, crop", plain.train.with_integers(), "uint8/uint16 shipped")
    run("after: decoded cache, crop and flip in uint8, integers", cached.train.with_integers(), "uint8/uint16 shipped")
    run("after, scoring pass: decoded cache, no augmentation, integers", cached.train.with_integers().without_augmentation(), "uint8/uint16 shipped")
    run("decoded cache, float items (normalised in the loader)", cached.train, "float32 + int64 shipped")
    return rows, built


def device_side(batch: int, repeats: int) -> dict[str, float]:
    """CPU seconds per sample of the device-side step (what ``prepare`` does on the GPU), here
    on the CPU: an upper bound of its cost, not a loader cost."""
    rgb = torch.randint(0, 256, (batch, 3, IMG, IMG), dtype=torch.uint8)
    depth = torch.randint(0, 20000, (batch, 1, IMG, IMG), dtype=torch.int32).to(torch.uint16)
    semseg = torch.randint(0, 40, (batch, IMG, IMG), dtype=torch.uint8)
    shipped = {"rgb": rgb, "depth": depth, "semseg": semseg}
    image = {"image": rgb}
    mae = clock(lambda b: (mae_data.to_model_inputs(shipped, 0.001), batch)[1], 3, repeats)
    vision = clock(lambda b: (vision_data.model_inputs(image, ((0.5,) * 3, (0.5,) * 3), IMG), batch)[1], 3, repeats)
    return {"mae": mae["cpu_rate"], "vision": vision["cpu_rate"]}


# --- the H100 step rate ---------------------------------------------------------------------


def flops_per_sample() -> dict[str, dict[str, float]]:
    """Training (forward + backward) and scoring (forward) FLOPs per sample of the paper-scale
    models, counted by torch's FlopCounterMode on two samples."""
    from torch.utils.flop_counter import FlopCounterMode

    from attent.experiment.files import load_experiment
    from attent.tasks.mae import masking
    from attent.tasks.mae.model import MaskedAutoencoder
    from attent.tasks.vit import build_vit

    results = {}
    mae_cfg = load_experiment(harness.REPO / "experiments" / "multimae_gpu.yaml").task
    spec = mae_cfg.model.spec(mae_cfg.modality_names(), IMG, 41)
    model = MaskedAutoencoder(spec)
    batch = 2
    inputs = {
        "rgb": torch.randn(batch, 3, IMG, IMG),
        "depth": torch.randn(batch, 1, IMG, IMG),
        "semseg": torch.randint(0, 41, (batch, IMG, IMG)),
    }
    masks = masking.random_masks(batch, 3, spec.patches, mae_cfg.visible_budget(spec.patches), alpha=mae_cfg.alpha)
    results["multimae ViT-B/16"] = _count(lambda: model(inputs, masks.visible, masks.hidden), batch, FlopCounterMode)
    vit_cfg = load_experiment(harness.REPO / "experiments" / "imagefolder_vit_gpu.yaml").task
    vit = build_vit(vit_cfg.vit_config(1000))
    results["imagefolder ViT-S/16"] = _count(lambda: vit(torch.randn(batch, 3, IMG, IMG)), batch, FlopCounterMode)
    return results


def _count(forward, batch: int, counter) -> dict[str, float]:
    with counter(display=False) as fwd:
        with torch.no_grad():
            forward()
    with counter(display=False) as train:
        out = forward()
        loss = sum(v.float().sum() for v in out.values()) if isinstance(out, dict) else out.float().sum()
        loss.backward()
    return {"train": train.get_total_flops() / batch, "score": fwd.get_total_flops() / batch}


# --- report ---------------------------------------------------------------------------------


def table(rows: list[dict], train_rate: float, score_rate: float | None = None) -> str:
    lines = [
        "| path | samples / CPU-s | samples / wall-s | bytes / sample shipped | loader processes per H100 (training) |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        need = math.ceil(train_rate / row["cpu_rate"])
        lines.append(
            f"| {row['path']} ({row['note']}) | {row['cpu_rate']:,.0f} | {row['wall_rate']:,.0f} | "
            f"{row['bytes_per_sample']:,} | {need} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300, help="training samples of each generated data set")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mfu", type=float, default=0.4, help="assumed share of the H100's bf16 peak")
    parser.add_argument("--workdir", type=Path, default=None, help="where the data and caches go (default: a temp dir)")
    parser.add_argument("--scenes", type=Path, default=None, help="offline scenes at 224 px (default: generated)")
    parser.add_argument("--out", type=Path, help="results folder (default: a new stamped one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = harness.machine()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="input-pipeline-"))
    workdir.mkdir(parents=True, exist_ok=True)

    print("FLOPs per sample of the paper-scale models ...", flush=True)
    flops = flops_per_sample()
    rate = {name: H100_BF16_DENSE * args.mfu / f["train"] for name, f in flops.items()}
    score_rate = {name: H100_BF16_DENSE * args.mfu / f["score"] for name, f in flops.items()}

    print("ImageFolder ViT ...", flush=True)
    folder = image_folder(workdir / "imagefolder", args.samples)
    vision_build = build_vision_cache(folder, workdir)
    vision_rows = vision_paths(folder, args.samples, 128, args.repeats, workdir)

    results = {"flops_per_sample": flops, "h100_train_rate": rate, "h100_score_rate": score_rate}
    mae_tables = {}
    for label, root in (
        ("scenes", scenes(args.scenes or workdir / "scenes224", args.samples)),
        ("photo-multimodal", photo_multimodal(workdir / "photo-multimodal", args.samples)),
    ):
        print(f"Multi-Modal MAE, {label} ...", flush=True)
        rows, built = mae_paths(root, 256, args.repeats, workdir, label)
        mae_tables[label] = rows
        results[f"multimae-{label}"] = {"rows": rows, "cache_build": built and {k: built[k] for k in ("seconds", "bytes")}}
    device = device_side(256, args.repeats)
    results.update({"imagefolder": {"rows": vision_rows, "cache_build": {k: vision_build[k] for k in ("seconds", "bytes")}}, "device_side_cpu_rate": device})

    out = harness.results_folder(args.out, info)
    harness.write_json(out / "results.json", results)
    mae_name, vit_name = "multimae ViT-B/16", "imagefolder ViT-S/16"
    body = [
        "## The H100 step rates assumed",
        "",
        "| model | training GFLOPs / sample | scoring GFLOPs / sample | H100 training samples/s | H100 scoring samples/s |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {f['train'] / 1e9:.1f} | {f['score'] / 1e9:.1f} | {rate[name]:,.0f} | {score_rate[name]:,.0f} |"
            for name, f in flops.items()
        ),
        "",
        f"FLOPs counted by `torch.utils.flop_counter` (matmuls and convolutions) on the paper-scale models "
        f"(`experiments/multimae_gpu.yaml`: 98 visible tokens of 3 x 196; `experiments/imagefolder_vit_gpu.yaml`); "
        f"the rates at {args.mfu:.0%} of 989 dense bf16 TFLOP/s.",
        "",
        f"## ImageFolder ViT at 224 px (batch 128; {args.samples} ImageNet-sized synthetic JPEGs)",
        "",
        table(vision_rows, rate[vit_name]),
        "",
        f"Processes per H100 at its training rate, {rate[vit_name]:,.0f} samples/s.",
    ]
    for label, rows in mae_tables.items():
        body += [
            "",
            f"## Multi-Modal MAE at 224 px, {label} (batch 256)",
            "",
            table(rows, rate[mae_name]),
            "",
            f"Processes per H100 at its training rate, {rate[mae_name]:,.0f} samples/s (the scoring pass: "
            f"{score_rate[mae_name]:,.0f} samples/s, unaugmented reads).",
        ]
    body += [
        "",
        "## The device-side step on this CPU",
        "",
        f"`prepare` of a shipped batch (normalise, widen) on this CPU: MAE {device['mae']:,.0f}, "
        f"ViT {device['vision']:,.0f} samples per CPU-second (on the GPU, part of the step).",
    ]
    harness.write_readme(out, "Input pipeline: samples per loader process", harness.command_line(), "\n".join(body), info)
    print(out / "README.md")


if __name__ == "__main__":
    main()
