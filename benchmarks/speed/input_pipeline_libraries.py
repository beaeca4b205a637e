"""The libraries made for input pipelines, measured on this CPU beside what attent uses, one
process, one thread, samples per CPU-second: reading pre-decoded samples (the decoded cache's
memory-mapped rows; webdataset's tar shards of .npy samples; MosaicML streaming's MDS shards of
ndarray columns), and decoding an ImageFolder's JPEGs (PIL, torchvision.io, DALI's CPU
decoder), each the Multi-Modal MAE's three modalities or the ViT's image at 224 px.

    python benchmarks/speed/input_pipeline_libraries.py --data WORKDIR [--out FOLDER]

``WORKDIR`` is the one ``input_pipeline.py --workdir`` filled (its decoded caches and image
folder). The libraries are not the project's dependencies: install them where you like and put
them on ``PYTHONPATH`` (webdataset, mosaicml-streaming with Brotli, python-snappy, catalogue;
nvidia-dali-cuda130 with nvidia-nvimgcodec-cu13, its libnvimgcodec.so on ``LD_LIBRARY_PATH``);
one that does not import is reported as not measured. DALI runs in a child process (its
pipeline threads stay out of this process's CPU time) and reports its own.

Writes ``README.md`` and ``results.json`` into ``--out``, by default a new folder
``benchmarks/results/input_pipeline_libraries/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402
from attent.tasks import cache as decoded  # noqa: E402

MODALITIES = ("rgb", "depth", "semseg")
DALI_CHILD = r"""
import json, sys, time
import nvidia.dali.fn as fn
from nvidia.dali import pipeline_def

@pipeline_def(batch_size=64, num_threads=1, device_id=None)
def pipe():
    jpegs, labels = fn.readers.file(file_root=sys.argv[1])
    images = fn.decoders.image(jpegs, device="cpu")
    return fn.resize(images, resize_x=224, resize_y=224, antialias=True), labels

p = pipe()
p.build()
p.run()
cpu, wall = time.process_time(), time.perf_counter()
for _ in range(int(sys.argv[2])):
    p.run()
n = 64 * int(sys.argv[2])
print(json.dumps({"cpu_rate": n / (time.process_time() - cpu), "wall_rate": n / (time.perf_counter() - wall)}))
"""


def rate(read, count: int, repeats: int) -> dict[str, float]:
    """``harness.clock`` of one pass of ``read()``, which must yield ``count`` samples."""

    def one_pass(_: int) -> int:
        done = sum(1 for _ in read())
        assert done == count, (done, count)
        return done

    return harness.clock(one_pass, 1, repeats)


def memmap_rows(folder: Path):
    arrays = decoded.arrays(folder, "train", MODALITIES)
    n = len(arrays["rgb"])

    def read():
        for i in range(n):
            yield {m: torch.from_numpy(a.row(i)) for m, a in arrays.items()}

    return read, n


def webdataset_shards(folder: Path, out: Path):
    import webdataset as wds

    arrays = decoded.arrays(folder, "train", MODALITIES)
    n = len(arrays["rgb"])
    out.mkdir(parents=True, exist_ok=True)
    shard = out / "train-000000.tar"
    if not shard.exists():
        with tarfile.open(shard, "w") as tar:
            for i in range(n):
                for m, a in arrays.items():
                    buffer = io.BytesIO()
                    np.save(buffer, a.row(i))
                    info = tarfile.TarInfo(f"{i:07d}.{m}.npy")
                    info.size = buffer.tell()
                    buffer.seek(0)
                    tar.addfile(info, buffer)

    def read():
        for sample in wds.WebDataset(str(shard), shardshuffle=False).decode():
            yield {m: torch.from_numpy(sample[f"{m}.npy"]) for m in MODALITIES}

    return read, n


def mds_shards(folder: Path, out: Path):
    from streaming import MDSWriter, StreamingDataset

    arrays = decoded.arrays(folder, "train", MODALITIES)
    n = len(arrays["rgb"])
    if not (out / "index.json").exists():
        columns = {"rgb": "ndarray:uint8", "depth": "ndarray:uint16", "semseg": "ndarray:uint8"}
        with MDSWriter(out=str(out), columns=columns, size_limit=1 << 28) as writer:
            for i in range(n):
                writer.write({m: a.row(i) for m, a in arrays.items()})
    dataset = StreamingDataset(local=str(out), shuffle=False, batch_size=1)

    def read():
        for i in range(n):
            sample = dataset.get_item(i)
            yield {m: torch.from_numpy(np.asarray(sample[m])) for m in MODALITIES}

    return read, n


def image_decoders(folder: Path):
    """Decode + resize of the ImageFolder's JPEGs to 224 px uint8: PIL, torchvision.io."""
    from attent.tasks.vision.data import resize_uint8
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_image, read_file

    paths = sorted((folder / "train").rglob("*.jpg"))

    def pil():
        for path in paths:
            with Image.open(path) as img:
                chw = torch.from_numpy(np.asarray(img.convert("RGB"))).permute(2, 0, 1)
            yield resize_uint8(chw, 224)

    def tvio():
        for path in paths:
            yield resize_uint8(decode_image(read_file(str(path)), mode=ImageReadMode.RGB), 224)

    return {"PIL decode + uint8 resize": pil, "torchvision.io decode + uint8 resize": tvio}, len(paths)


def dali_cpu(folder: Path, batches: int) -> dict[str, float] | str:
    result = subprocess.run(
        [sys.executable, "-c", DALI_CHILD, str(folder / "train"), str(batches)], capture_output=True, text=True
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else f"not measured: {(result.stderr.strip().splitlines() or ['?'])[-1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="input_pipeline.py's --workdir")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="results folder (default: a new stamped one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = harness.machine()
    results: dict[str, object] = {}
    for label in ("scenes", "photo-multimodal"):
        cache = args.data / f"{label}-cache"
        readers = {"decoded cache (numpy memmap rows)": lambda cache=cache: memmap_rows(cache)}
        readers["webdataset tar of .npy samples"] = lambda cache=cache, label=label: webdataset_shards(
            cache, args.data / f"{label}-wds"
        )
        readers["MosaicML streaming MDS ndarray columns"] = lambda cache=cache, label=label: mds_shards(
            cache, args.data / f"{label}-mds"
        )
        for name, make in readers.items():
            try:
                read, n = make()
                results[f"multimae {label}: {name}"] = rate(read, n, args.repeats)
            except ImportError as exc:
                results[f"multimae {label}: {name}"] = f"not measured: {exc}"
            print(name, label, results[f"multimae {label}: {name}"], flush=True)
    decoders, n = image_decoders(args.data / "imagefolder")
    for name, read in decoders.items():
        results[f"imagefolder: {name}"] = rate(read, n, args.repeats)
        print(name, results[f"imagefolder: {name}"], flush=True)
    results["imagefolder: DALI CPU decode + resize (its own pipeline)"] = dali_cpu(
        args.data / "imagefolder", max(1, n // 64)
    )
    print("dali", results["imagefolder: DALI CPU decode + resize (its own pipeline)"], flush=True)

    out = harness.results_folder(args.out, info)
    harness.write_json(out / "results.json", results)
    lines = ["| what | samples / CPU-s | samples / wall-s |", "|---|---:|---:|"]
    for name, value in results.items():
        if isinstance(value, dict):
            lines.append(f"| {name} | {value['cpu_rate']:,.0f} | {value['wall_rate']:,.0f} |")
        else:
            lines.append(f"| {name} | {value} | |")
    env = {k: os.environ.get(k, "") for k in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    body = "\n".join(lines) + f"\n\nLibraries from: `PYTHONPATH={env['PYTHONPATH']}`."
    harness.write_readme(out, "Input pipeline libraries: samples per process", harness.command_line(), body, info)
    print(out / "README.md")


if __name__ == "__main__":
    main()
