"""What the check of a step's losses costs (``Selector.step_finite``: one device read a step, and
under torch.distributed one small all-reduce so that ranks agree), on the engine's own recipe.

Two gloo ranks (or one), DDP, the digits ViT on full data: epochs alternate between the recipe as
it is and the recipe with the check answered True without reading anything, ``--rounds`` times,
so that slow drifts of the machine hit both alike; per-step milliseconds of each arm, paired by
round. Evaluation is not run; each epoch is ``train_one_epoch`` alone.

    python benchmarks/overheads/step_check.py                     # 2 ranks, 8 rounds
    python benchmarks/overheads/step_check.py --ranks 1 --rounds 4 --out /tmp/step_check

Writes ``README.md`` and ``runs.json`` into --out, by default a new folder
``benchmarks/results/step_check/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402


def experiment(args):
    from attent.experiment.schema import build_experiment

    return build_experiment(
        {
            "name": "step-check",
            "seed": 0,
            "task": {
                "name": "vision",
                "dataset": "digits",
                "img_size": 8,
                "model": {"preset": "vit_tiny_cpu", "patch_size": 4},
            },
            "train": {"epochs": 2 * args.rounds, "batch_size": args.batch_size},
            "selection": {"method": "full"},
        }
    )


def rank_main(rank: int, args, port: int, out: dict) -> None:
    from attent.engine.recipe import TrainingRecipe, WorkerContext
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    if args.ranks > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    recipe = TrainingRecipe(experiment(args), WorkerContext(rank, args.ranks))
    recipe.setup(wrap_model=(lambda model: DistributedDataParallel(model)) if args.ranks > 1 else (lambda m: m))
    checked = recipe.selector.step_finite
    rows = []
    for epoch in range(2 * args.rounds):
        arm = ("checked", "unchecked")[(epoch + epoch // 2) % 2]  # ABBA: neither arm always first
        recipe.selector.step_finite = checked if arm == "checked" else (lambda: True)
        recipe.select(epoch)
        if args.ranks > 1:
            dist.barrier()
        start = time.perf_counter()
        steps = recipe.train_one_epoch(epoch)
        rows.append({"epoch": epoch, "arm": arm, "steps": steps, "seconds": time.perf_counter() - start})
    if rank == 0:
        out["rows"] = rows
    if args.ranks > 1:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with mp.Manager() as manager:
        out = manager.dict()
        port = 29500 + os.getpid() % 1000
        mp.spawn(rank_main, args=(args, port, out), nprocs=args.ranks, join=True)
        rows = list(out["rows"])
    per_step = {
        arm: [r["seconds"] / r["steps"] * 1e3 for r in rows if r["arm"] == arm] for arm in ("checked", "unchecked")
    }
    paired = [c - u for c, u in zip(per_step["checked"], per_step["unchecked"])]
    summary = {
        "ranks": args.ranks,
        "rounds": args.rounds,
        "steps_per_epoch": rows[0]["steps"],
        "median_ms_per_step": {arm: statistics.median(v) for arm, v in per_step.items()},
        "paired_difference_ms": {"median": statistics.median(paired), "min": min(paired), "max": max(paired)},
    }
    folder = harness.results_folder(args.out)
    harness.write_json(folder / "runs.json", {"summary": summary, "rows": rows})
    checked, unchecked = summary["median_ms_per_step"]["checked"], summary["median_ms_per_step"]["unchecked"]
    diff = summary["paired_difference_ms"]
    body = (
        f"| arm | ms a step (median of {args.rounds} epochs of {rows[0]['steps']} steps) |\n|---|---|\n"
        f"| with the check | {checked:.2f} |\n| without | {unchecked:.2f} |\n\n"
        f"Paired by round, with - without: median {diff['median']:+.2f} ms a step "
        f"(min {diff['min']:+.2f}, max {diff['max']:+.2f})."
    )
    harness.write_readme(folder, f"The step check's cost ({args.ranks} rank(s), digits ViT, full data)",
                         harness.command_line(), body)  # fmt: skip
    print(json.dumps(summary, indent=1))
    print(f"wrote {folder}")


if __name__ == "__main__":
    main()
