"""What each phase of AtteNT training costs per sample, through each integration, for a ViT and a
causal LM: a training step (forward, backward, gradient clipping, optimiser step: per sample trained),
a scoring forward (the integration's own scoring pass as the Selector clocks it: per sample scored),
data loading (the integration's training loader iterated alone) and the selection (per re-selection).
The question: does a scoring pass cost at most 0.4 x a training step per sample?

    python benchmarks/speed/phase_costs.py [--size tiny|cpu|300m] [--repeats 3] [--out FOLDER]

Integrations: the engine's ``TrainingRecipe`` (the ViT only: its llm task loads a pretrained
checkpoint), a plain loop on ``attent.Selector``, ``AtteNTTrainer``, ``AtteNTSFTTrainer`` (the LM
only, where ``trl`` is installed) and Lightning's ``AtteNTCallback`` (where ``lightning`` is).
Workloads, random-init, no hub: timm's ViT on sklearn's digits and a Llama on random tokens; ``tiny``
for the test suite, ``cpu`` for one CPU core (ViT 64 wide on 1,707 images at 16 px, Llama 256 wide x 4
layers on 64 rows of 128 tokens: about 3.5 minutes), ``300m`` for a GPU (ViT-Base shape at 32 px, a
349M-parameter Llama on 512 rows of 512 tokens; sized by its FLOPs for 8 minutes of an H100 or H200). Each fit runs two epochs; every epoch scores all samples and re-selects half of them.
Fits alternate integration by integration within each round (A B C, A B C, ...), after ``--warmup``
uncounted rounds, and the table gives medians over the rounds (the ratio: the median of each
round's ratio). CUDA when available (bf16 autocast), else the CPU in fp32 on ``--threads`` threads.

Writes ``results.json`` (every fit's sums, the medians, the rows not run and why) and ``README.md``
(the table, the command, the machine) into ``--out``, by default a new folder
``benchmarks/results/phase_costs/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from phase_costs_arms import ARMS  # beside this script
from phase_costs_workloads import SIZES, LmWorkload, VitWorkload, not_run, per_sample

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

LIMIT = 0.4  # the goal: a scoring pass at most this x a training step, per sample
WORKLOADS = {"vit": VitWorkload, "lm": LmWorkload}
MEDIANS = (
    "train_s_per_sample",
    "score_s_per_sample",
    "load_s_per_sample",
    "selection_s_per_reselection",
    "selection_s_per_sample",
    "score_load_s_per_sample",
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--repeats", type=int, default=3, help="counted rounds (medians over them)")
    parser.add_argument("--warmup", type=int, help="uncounted rounds first (default: 1, 0 at --size tiny)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--out", type=Path, help="results folder (default: a new stamped one under results/phase_costs/)"
    )
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = 0 if args.size == "tiny" else 1
    return args


def summarise(fits: list[dict]) -> list[dict]:
    """One row per integration x workload: medians over the rounds."""
    rows = []
    for key in dict.fromkeys((fit["integration"], fit["workload"]) for fit in fits):
        mine = [fit for fit in fits if (fit["integration"], fit["workload"]) == key]
        row = {"integration": key[0], "workload": key[1], "rounds": len(mine)}
        for name in (*MEDIANS, "score_over_train", "forward_over_train"):
            row[name] = statistics.median(fit[name] for fit in mine)
        for name in ("reported_scoring_batch", "train_batch", "pool"):
            row[name] = max(fit[name] for fit in mine)
        row["scoring_batches"] = mine[-1]["scoring_batches"]  # each pass's, the same in every round
        row["within_limit"] = row["score_over_train"] <= LIMIT
        rows.append(row)
    return rows


def batches(row: dict) -> str:
    """The scoring passes' batch (each pass's where they differ) and the training batch."""
    used = sorted(set(row["scoring_batches"]), key=row["scoring_batches"].index)
    return f"{', '.join(map(str, used))} ({row['train_batch']})"


def table(rows: list[dict], skipped: list[dict]) -> str:
    ms = lambda s: f"{1e3 * s:.3g}"  # noqa: E731
    lines = [
        "| integration | workload | train ms/sample | score ms/sample (its loading) | load ms/sample "
        f"| selection ms/re-selection | score/train | ≤ {LIMIT} | forward/train | scoring batch (training batch) |",
        "|---|---|---:|---:|---:|---:|---:|:---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['integration']} | {r['workload']} | {ms(r['train_s_per_sample'])} "
            f"| {ms(r['score_s_per_sample'])} ({ms(r['score_load_s_per_sample'])}) | {ms(r['load_s_per_sample'])} "
            f"| {ms(r['selection_s_per_reselection'])} | {r['score_over_train']:.3f} "
            f"| {'yes' if r['within_limit'] else '**no**'} | {r['forward_over_train']:.3f} | {batches(r)} |"
        )
    lines += ["", *(f"- {s['integration']} × {s['workload']}: not run: {s['reason']}." for s in skipped)]
    return "\n".join(lines)


def run_rounds(
    pairs: list[tuple[str, str]], workloads: dict, device: torch.device, warmup: int, repeats: int
) -> list[dict]:
    """Every (integration, workload) fit once a round, alternating, for ``warmup`` uncounted rounds
    and then ``repeats`` counted ones; the counted fits' sums and per-sample costs."""
    fits = []
    for round_ in range(warmup + repeats):
        for integration, workload in pairs:
            start = time.perf_counter()
            phases = ARMS[integration](workloads[workload], device)
            fit = {"round": round_ - warmup, "integration": integration, "workload": workload}
            fit |= dataclasses.asdict(phases) | per_sample(phases)
            print(
                f"round {fit['round']} {integration} {workload}: score/train {fit['score_over_train']:.3f} "
                f"({time.perf_counter() - start:.1f} s)",
                flush=True,
            )
            if round_ >= warmup:
                fits.append(fit)
    return fits


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    device = torch.device(
        "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    )
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation notes of the libraries
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")  # Lightning, on 0 workers
    if importlib.util.find_spec("datasets"):
        import datasets

        datasets.disable_progress_bars()  # TRL's dataset preparation, each fit
    info = harness.machine()
    workloads = {name: build(SIZES[args.size][name], device) for name, build in WORKLOADS.items()}
    pairs, skipped = [], []
    for workload in workloads:
        for integration in ARMS:
            reason = not_run(integration, workload)
            if reason:
                skipped.append({"integration": integration, "workload": workload, "reason": reason})
            else:
                pairs.append((integration, workload))
    fits = run_rounds(pairs, workloads, device, args.warmup, args.repeats)
    rows = summarise(fits)
    where = (
        f"{info['gpu']}, bf16 autocast" if device.type == "cuda" else f"the CPU, fp32, {args.threads} torch thread(s)"
    )
    body = "\n".join(
        [
            f"Size `{args.size}` on {where}; median of {args.repeats} round(s) after {args.warmup} uncounted; "
            "per sample trained (training step, its batch already loaded), scored (the whole scoring pass, loading "
            "its batches included; in brackets that loader alone), loaded (the training loader alone); selection "
            "per re-selection; forward/train: the scoring pass less its loading, over the training step. "
            "Workloads: " + "; ".join(f"{name} {SIZES[args.size][name]}" for name in workloads) + ".",
            "",
            table(rows, skipped),
        ]
    )
    out = harness.results_folder(args.out, info)
    results = {"size": args.size, "device": str(device), "limit": LIMIT, "rows": rows, "skipped": skipped, "fits": fits}
    results["sizes"] = SIZES[args.size]
    harness.write_json(out / "results.json", _finite(results))
    print(
        harness.write_readme(
            out, "Per-sample cost by phase and integration", harness.command_line(argv), body, info
        ).read_text()
    )
    return results


def _finite(data):
    """NaN as None: JSON has no NaN."""
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return None if isinstance(data, float) and math.isnan(data) else data


if __name__ == "__main__":
    main()
