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
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402
import input_pipeline_report  # noqa: E402
import photos  # noqa: E402
from attent.cost.accelerators import ACCELERATORS  # noqa: E402
from attent.tasks.mae import data as mae_data  # noqa: E402
from attent.tasks.vision import data as vision_data  # noqa: E402
from attent.tasks.vision import folder as vision_folder  # noqa: E402

H100_BF16_DENSE = ACCELERATORS["h100"].bf16
P4D_VCPUS_PER_GPU = 12  # a p4d.24xlarge: 96 vCPUs, 8 GPUs
IMG = 224
TITLE = "Input pipeline: samples per loader process"
SEMSEG_CLASSES = 133  # MultiMAE's ImageNet-S50 pseudo labels: COCO's 133 panoptic classes


# --- timing ---------------------------------------------------------------------------------


def loader(dataset, collate, batch: int):
    """What a DataLoader worker does for batch b: items of a shuffled order, collated."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()

    def read_batch(b: int) -> int:
        start = (b * batch) % max(1, len(dataset) - batch + 1)
        chosen = order[start : start + batch]
        collate([dataset[i] for i in chosen])
        return len(chosen)

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

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return {"index": i, "image": head_image(self.paths[i], self.img_size), "label": 0}


def head_image(path: Path, img_size: int) -> torch.Tensor:
    """An RGB folder image as the code before the cache made it (float resize of the full image)."""
    with Image.open(path) as img:
        pixels = np.atleast_3d(np.array(img.convert("RGB")))
    chw = torch.from_numpy(pixels).permute(2, 0, 1)
    half = torch.tensor((0.5, 0.5, 0.5)).view(-1, 1, 1)
    return vision_data.to_model_input(chw, half, half, img_size)


class TorchvisionDecodeFolder(HeadImageFolder):
    """The uncached integer path with torchvision.io.decode_jpeg (libjpeg-turbo) in place of PIL."""

    def __getitem__(self, i: int):
        from torchvision.io import ImageReadMode, decode_image, read_file

        chw = decode_image(read_file(str(self.paths[i])), mode=ImageReadMode.RGB)
        return {"index": i, "image": vision_data.resize_uint8(chw, self.img_size), "label": 0}


def vision_paths(root: Path, samples: int, batch: int, repeats: int, workdir: Path) -> list[dict]:
    splits = vision_folder.load_image_folder(root, img_size=IMG, cache_path=None)
    train = splits.train
    cached = vision_folder.load_image_folder(root, img_size=IMG, cache_path=str(workdir / "vision-cache")).train
    rows = []

    def run(name: str, dataset, collate, note: str) -> None:
        rate = harness.clock(loader(dataset, collate, batch), batches_for(dataset, batch), repeats)
        item = collate([dataset[0], dataset[1]])["image"]
        rows.append({"path": name, **rate, "bytes_per_sample": item[0].numel() * item.element_size(), "note": note})
        print(f"  {name}: {rate['cpu_rate']:.0f} samples/CPU-s ({rate['wall_rate']:.0f}/wall-s)", flush=True)

    run(
        "before: PIL decode, float resize and normalise per item",
        HeadImageFolder(train.paths, IMG),
        vision_data.collate,
        "float32 shipped",
    )
    run("uncached, integers: PIL decode, uint8 resize", train.with_integers(), vision_data.collate, "uint8 shipped")
    run(
        "uncached, integers: torchvision.io decode, uint8 resize",
        TorchvisionDecodeFolder(train.paths, IMG),
        vision_data.collate,
        "uint8 shipped",
    )
    run("after: decoded cache (memory-mapped), integers", cached.with_integers(), vision_data.collate, "uint8 shipped")
    run("decoded cache, float items (normalised in the loader)", cached, vision_data.collate, "float32 shipped")
    return rows


def build_vision_cache(root: Path, workdir: Path) -> dict:
    out = workdir / "vision-cache"
    if (out / "index.json").is_file():
        return {"seconds": float("nan"), "bytes": sum(f.stat().st_size for f in out.iterdir())}
    return vision_folder.build_cache(root, out, img_size=IMG, workers=1)


# --- the Multi-Modal MAE --------------------------------------------------------------------


def mae_paths(root: Path, batch: int, repeats: int, workdir: Path, label: str) -> tuple[list[dict], dict | None]:
    out = workdir / f"{label}-cache"
    built = None
    if not (out / "index.json").is_file():
        built = mae_data.build_cache(root, out, img_size=IMG, workers=1)
    plain = mae_data.load_multimodal(root, img_size=IMG, cache=False, cache_path=None)
    cached = mae_data.load_multimodal(root, img_size=IMG, cache_path=str(out))
    rows = []

    def run(name: str, dataset, note: str) -> None:
        rate = harness.clock(loader(dataset, mae_data.collate, batch), batches_for(dataset, batch), repeats)
        item = mae_data.collate([dataset[0]])
        size = sum(item[m][0].numel() * item[m].element_size() for m in ("rgb", "depth", "semseg"))
        rows.append({"path": name, **rate, "bytes_per_sample": size, "note": note})
        print(f"  {name}: {rate['cpu_rate']:.0f} samples/CPU-s ({rate['wall_rate']:.0f}/wall-s)", flush=True)

    torch.manual_seed(0)
    # before: the float items decoded per item, the code path of the commit before the cache (its
    # decode, crop and normalisation, which give the same floats: torch.equal, checked against 6a98bf6)
    run("before: three files decoded per item, crop, float in the loader", plain.train, "float32 + int64 shipped")
    run("uncached, integers: three files decoded per item, crop", plain.train.with_integers(), "uint8/uint16 shipped")
    run("after: decoded cache, crop and flip in uint8, integers", cached.train.with_integers(), "uint8/uint16 shipped")
    run(
        "after, scoring pass: decoded cache, no augmentation, integers",
        cached.train.with_integers().without_augmentation(),
        "uint8/uint16 shipped",
    )
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
    mae = harness.clock(lambda b: (mae_data.to_model_inputs(shipped, 0.001), batch)[1], 3, repeats)
    vision = harness.clock(
        lambda b: (vision_data.model_inputs(image, ((0.5,) * 3, (0.5,) * 3), IMG), batch)[1], 3, repeats
    )
    return {"mae": mae["cpu_rate"], "vision": vision["cpu_rate"]}


# --- the H100 step rate ---------------------------------------------------------------------


def flops_per_sample() -> dict[str, dict[str, float]]:
    """Training (forward + backward) and scoring (forward) FLOPs per sample of the paper-scale
    models, as ``attent plan`` counts them (``attent.cost.flops`` on the tasks' probes)."""
    from attent.cost.flops import count_flops
    from attent.experiment.files import load_experiment
    from attent.tasks.registry import task_class

    results = {}
    for name, file in (
        ("multimae ViT-B/16", "multimae_gpu.yaml"),
        ("imagefolder ViT-S/16", "imagefolder_vit_gpu.yaml"),
    ):
        task = load_experiment(harness.REPO / "experiments" / file).task
        flops = count_flops(task_class(task.name).probe(task))
        results[name] = {"train": flops.train, "score": flops.score}
    return results


# --- one epoch, before and after ------------------------------------------------------------


def one_epoch(task: dict, workdir: Path, *, ship_integers: bool, before: bool = False) -> dict[str, float]:
    """One epoch of the engine's recipe on this CPU (full data, one rank): its metrics row.
    ``ship_integers``: the loaders collate with ``Task.loader_collate`` (the recipe's one line
    for it), else with ``Task.collate`` (floats made in the loader). ``before``: the image
    folder's items as the code before the cache made them (``HeadImageFolder``)."""
    from unittest import mock

    from attent.engine.recipe import TrainingRecipe, WorkerContext
    from attent.experiment.schema import build_experiment
    from attent.tasks.mae.task import MaskedPretrainingTask
    from attent.tasks.vision.task import VisionTask

    cfg = build_experiment(
        {
            "name": "input-pipeline-losses",
            "seed": 0,
            "task": task,
            "selection": {"method": "full"},
            "train": {"epochs": 1, "batch_size": 32},
            "ray": {"storage_path": str(workdir / "ray")},
        }
    )
    patches = []
    if ship_integers:
        for task_class in (VisionTask, MaskedPretrainingTask):
            patches.append(mock.patch.object(task_class, "collate", lambda self, items: self.loader_collate(items)))
    if before:

        def head_item(self, i):
            return {"index": i, "image": head_image(self.paths[i], self.img_size), "label": int(self.labels[i])}

        patches.append(mock.patch.object(vision_folder.ImageFolderDataset, "__getitem__", head_item))
    for patch in patches:
        patch.start()
    try:
        recipe = TrainingRecipe(cfg, WorkerContext())
        recipe.setup()
        row = recipe.run_epoch(0)
    finally:
        for patch in patches:
            patch.stop()
    return {k: float(row[k]) for k in ("train_loss", "eval_test_loss", "eval_test_accuracy") if k in row}


def loss_check(folder: Path, scene_root: Path, workdir: Path) -> dict[str, dict[str, dict[str, float]]]:
    """Each workload's one epoch before and after: the files as before, the files after (uint8
    resize for the folder), the decoded cache with integers shipped and prepared on the device."""
    small = 32
    vit = {"name": "vision", "dataset": "image_folder", "data_path": str(folder), "img_size": small}
    vit["model"] = {"preset": "vit_tiny_cpu", "patch_size": 8}
    vision_folder.build_cache(folder, workdir / "vision-cache-32", img_size=small, workers=1, force=True)
    mae_data.build_cache(scene_root, workdir / "scenes-cache-32", img_size=small, workers=1, force=True)
    mae = {"name": "multimae", "data_path": str(scene_root), "img_size": small, "visible_tokens": 8}
    mae["model"] = {"preset": "vit_tiny_cpu", "patch_size": 8}
    torch.set_num_threads(1)
    return {
        "imagefolder ViT": {
            "before (files, float resize, floats shipped)": one_epoch(
                {**vit, "cache_path": None}, workdir, ship_integers=False, before=True
            ),
            "after, files (uint8 resize), floats shipped": one_epoch(
                {**vit, "cache_path": None}, workdir, ship_integers=False
            ),
            "after, decoded cache, integers shipped": one_epoch(
                {**vit, "cache_path": str(workdir / "vision-cache-32")}, workdir, ship_integers=True
            ),
        },
        "multimae": {
            "before (files decoded per item, floats shipped)": one_epoch(
                {**mae, "cache_path": None, "cache": False}, workdir, ship_integers=False
            ),
            "after, decoded cache, integers shipped": one_epoch(
                {**mae, "cache_path": str(workdir / "scenes-cache-32")}, workdir, ship_integers=True
            ),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300, help="training samples of each generated data set")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mfu", type=float, default=0.4, help="assumed share of the H100's bf16 peak")
    parser.add_argument("--workdir", type=Path, default=None, help="where the data and caches go (default: a temp dir)")
    parser.add_argument("--scenes", type=Path, default=None, help="offline scenes at 224 px (default: generated)")
    parser.add_argument("--out", type=Path, help="results folder (default: a new stamped one)")
    parser.add_argument("--render", type=Path, help="rewrite a results folder's README from its results.json")
    args = parser.parse_args()
    if args.render:
        info = json.loads((args.render / "machine.json").read_text())
        results = json.loads((args.render / "results.json").read_text())
        command = results.get("command", harness.command_line())
        harness.write_readme(args.render, TITLE, command, input_pipeline_report.render(results), info)
        print(args.render / "README.md")
        return
    torch.set_num_threads(1)
    info = harness.machine()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="input-pipeline-"))
    workdir.mkdir(parents=True, exist_ok=True)

    print("FLOPs per sample of the paper-scale models ...", flush=True)
    flops = flops_per_sample()
    results = {
        "command": harness.command_line(),
        "samples": args.samples,
        "mfu": args.mfu,
        "flops_per_sample": flops,
        "h100_train_rate": {name: H100_BF16_DENSE * args.mfu / f["train"] for name, f in flops.items()},
        "h100_score_rate": {name: H100_BF16_DENSE * args.mfu / f["score"] for name, f in flops.items()},
    }

    print("ImageFolder ViT ...", flush=True)
    folder = photos.image_folder(workdir / "imagefolder", args.samples)
    vision_build = build_vision_cache(folder, workdir)
    vision_rows = vision_paths(folder, args.samples, 128, args.repeats, workdir)
    results["imagefolder"] = {"rows": vision_rows, "cache_build": {k: vision_build[k] for k in ("seconds", "bytes")}}
    scene_root = photos.scenes(args.scenes or workdir / "scenes224", args.samples, IMG)
    for label, root in (
        ("scenes", scene_root),
        ("photo-multimodal", photos.photo_multimodal(workdir / "photo-multimodal", args.samples)),
    ):
        print(f"Multi-Modal MAE, {label} ...", flush=True)
        rows, built = mae_paths(root, 256, args.repeats, workdir, label)
        results[f"multimae-{label}"] = {
            "rows": rows,
            "cache_build": built and {k: built[k] for k in ("seconds", "bytes")},
        }
    results["device_side_cpu_rate"] = device_side(256, args.repeats)
    print("One epoch of each workload, before and after ...", flush=True)
    results["one_epoch"] = loss_check(folder, scene_root, workdir)

    out = harness.results_folder(args.out, info)
    harness.write_json(out / "results.json", results)
    harness.write_readme(out, TITLE, results["command"], input_pipeline_report.render(results), info)
    print(out / "README.md")


if __name__ == "__main__":
    main()
