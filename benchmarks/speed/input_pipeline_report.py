"""The input-pipeline study's README tables, from its results.json (``input_pipeline.py``)."""

from __future__ import annotations

import math

SEMSEG_CLASSES = 133  # MultiMAE's ImageNet-S50 pseudo labels: COCO's 133 panoptic classes, as the probe assumes


def table(rows: list[dict], train_rate: float, score_rate: float) -> str:
    """A workload's paths: rates, bytes shipped, and the loader processes an H100 needs at its
    training rate (a scoring pass's reads: at its scoring rate)."""
    lines = [
        "| path | samples / CPU-s | samples / wall-s | bytes / sample shipped | loader processes per H100 |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        scoring = "scoring pass" in row["path"]
        need = math.ceil((score_rate if scoring else train_rate) / row["cpu_rate"])
        lines.append(
            f"| {row['path']} ({row['note']}) | {row['cpu_rate']:,.0f} | {row['wall_rate']:,.0f} | "
            f"{row['bytes_per_sample']:,} | {need}{' (at the scoring rate)' if scoring else ''} |"
        )
    return "\n".join(lines)


def one_epoch_tables(one_epoch: dict) -> list[str]:
    """Each workload's epoch through every arm: its losses, and its training loss against the first arm's."""
    lines = []
    for workload, arms in one_epoch.items():
        first = next(iter(arms.values()))
        lines += [
            f"| {workload} at 32 px | train loss | test loss | test accuracy (ViT) | train loss − before's |",
            "|---|---:|---:|---:|---:|",
        ]
        for arm, row in arms.items():
            lines.append(
                f"| {arm} | {row['train_loss']:.6f} | {row['eval_test_loss']:.6f} | "
                f"{row.get('eval_test_accuracy', float('nan')):.4f} | {row['train_loss'] - first['train_loss']:+.2e} |"
            )
        lines.append("")
    return lines


def render(results: dict) -> str:
    """The README's tables from results.json."""
    flops, rate, score_rate = results["flops_per_sample"], results["h100_train_rate"], results["h100_score_rate"]
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
        "FLOPs counted by `torch.utils.flop_counter` (matmuls and convolutions) on the paper-scale models "
        f"(`experiments/multimae_gpu.yaml`: 98 visible tokens of 3 x 196, {SEMSEG_CLASSES} semseg classes; "
        f"`experiments/imagefolder_vit_gpu.yaml`, 1,000 classes); the rates at {results['mfu']:.0%} of 989 dense "
        "bf16 TFLOP/s.",
        "",
        f"## ImageFolder ViT at 224 px (batch 128; {results['samples']} ImageNet-sized synthetic JPEGs)",
        "",
        table(results["imagefolder"]["rows"], rate[vit_name], score_rate[vit_name]),
        "",
        f"Processes per H100 at its training rate, {rate[vit_name]:,.0f} samples/s.",
    ]
    for label in ("scenes", "photo-multimodal"):
        body += [
            "",
            f"## Multi-Modal MAE at 224 px, {label} (batch 256)",
            "",
            table(results[f"multimae-{label}"]["rows"], rate[mae_name], score_rate[mae_name]),
            "",
            f"Processes per H100 at its training rate, {rate[mae_name]:,.0f} samples/s (the scoring pass: "
            f"{score_rate[mae_name]:,.0f} samples/s, unaugmented reads).",
        ]
    builds = {k: results[k]["cache_build"] for k in ("imagefolder", "multimae-scenes", "multimae-photo-multimodal")}
    body += [
        "",
        "Cache builds, one process: "
        + "; ".join(f"{name} {b['bytes'] / 2**20:.0f} MiB in {b['seconds']:.1f} s" for name, b in builds.items() if b)
        + ".",
    ]
    body += ["", "## One epoch before and after (the engine's recipe, full data, this CPU)", ""]
    body += one_epoch_tables(results["one_epoch"])
    device = results["device_side_cpu_rate"]
    body += [
        "## The device-side step on this CPU",
        "",
        f"`prepare` of a shipped batch (normalise, widen) on this CPU: MAE {device['mae']:,.0f}, "
        f"ViT {device['vision']:,.0f} samples per CPU-second (on the GPU, part of the step).",
    ]
    return "\n".join(body)
