"""What the engine costs per epoch over a bare torch loop, and what a Ray Train run pays
before its first epoch and after its last.

The same work three ways, one at a time, one torch thread each (a Ray worker with one CPU gets
OMP_NUM_THREADS=1), alternated ``--rounds`` times so slow drifts of the machine hit all alike:
- bare: a single-process loop — the task's model, data and loss, AdamW, a shuffled DataLoader;
- recipe: the engine's TrainingRecipe (Selector, subset sampler, time split, per-sample losses,
  learning-rate schedule), no Ray — its epochs alternate with the bare loop's in one process;
- ray: ``attent train`` on a local Ray: a Ray Train run with its MLflow logging and checkpoints.
Per-epoch cost excludes evaluation (timed apart by the engine; the bare loop does none). The Ray
run's epochs span its wall-clock minus start-up and teardown, so its per-epoch cost includes
what each epoch adds around training: reports, MLflow writes, checkpoints.

    python benchmarks/overheads/engine_overhead.py                       # Fashion-MNIST ViT, full data
    python benchmarks/overheads/engine_overhead.py --epochs 6 --rounds 3 --out /tmp/overhead

Writes ``README.md`` (the tables, the command, the machine) and ``runs.json`` (every epoch and Ray
run) into --out, by default a new folder ``benchmarks/results/engine_overhead/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

CONFIG = harness.REPO / "experiments" / "fashion_mnist_vit.yaml"


def experiment(args, name: str):
    return harness.experiment(
        CONFIG,
        name,
        [
            "selection.preset=null",
            "selection.method=full",
            f"train.epochs={args.epochs}",
            f"task.train_limit={args.samples}",
            "task.test_limit=500",
            f"train.eval_every={args.epochs}",
        ],
        args.workdir,
        "engine-overhead",
        workers=1,
        threads=1,
        checkpoint_every=args.checkpoint_every,
    )


def bare_loop(args):
    """A plain loop on the same task, model, optimiser settings and batch size; returns a
    function that trains one epoch and returns its seconds."""
    import torch
    from attent.engine.lr import lr_factor
    from attent.tasks.registry import build_task
    from torch.utils.data import DataLoader

    cfg = experiment(args, "bare")
    torch.manual_seed(cfg.seed)
    task = build_task(cfg.task, seed=cfg.seed)
    data = task.train_dataset()
    model = task.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    loader = DataLoader(data, batch_size=cfg.train.batch_size, shuffle=True, collate_fn=task.collate)
    model.train()
    steps = len(loader) * cfg.train.epochs

    def epoch_seconds(epoch: int) -> float:
        start = time.perf_counter()
        for step, batch in enumerate(loader):
            for group in optimizer.param_groups:  # the same per-step schedule the engine runs
                group["lr"] = cfg.train.lr * lr_factor((epoch * len(loader) + step + 1) / steps, "cosine", 0.0)
            task.per_sample_loss(model, batch).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return epoch_seconds


def recipe_loop(args):
    """The engine's recipe in this process: select, train one epoch, record (no Ray, no MLflow,
    evaluation left out); returns a function that runs one epoch and returns its seconds."""
    from attent.engine.recipe import TrainingRecipe, WorkerContext

    cfg = experiment(args, "recipe")
    recipe = TrainingRecipe(cfg, WorkerContext())
    recipe.setup()

    def epoch_seconds(epoch: int) -> float:
        start = time.perf_counter()
        recipe.select(epoch)
        recipe.record(epoch, recipe.train_one_epoch(epoch), {})
        return time.perf_counter() - start

    return epoch_seconds


def paired_epochs(args) -> tuple[list[float], list[float]]:
    """Bare and recipe epochs alternated in one process (no process-level effects between them)."""
    bare, recipe = bare_loop(args), recipe_loop(args)
    pairs = [(bare(epoch), recipe(epoch)) for epoch in range(args.epochs)]
    return [b for b, _ in pairs], [r for _, r in pairs]


def ray_run(args, number: int) -> dict[str, float]:
    """A real Ray Train run; its per-epoch cost and its fixed costs, from MLflow."""
    from attent import contract
    from attent.engine.driver import train
    from mlflow import MlflowClient

    cfg = experiment(args, f"engine-overhead-{os.getpid()}-{number}")
    result = train(cfg)
    m = MlflowClient(cfg.mlflow.tracking_uri).get_run(result.run_id).data.metrics
    span = m[contract.TIME_WALLCLOCK] - m[contract.TIME_STARTUP] - m[contract.TIME_TEARDOWN]
    return {
        "epoch": (span - m[contract.time_metric("eval")]) / cfg.train.epochs,
        "train_epoch": m[contract.time_metric("train")] / cfg.train.epochs,
        "checkpoint": m[contract.time_metric("checkpoint")],
        "ray_init": m[contract.TIME_RAY_INIT],
        "worker_start": m[contract.TIME_WORKER_START],
        "setup": m[contract.TIME_SETUP],
        "teardown": m[contract.TIME_TEARDOWN],
        "wallclock": m[contract.TIME_WALLCLOCK],
        "epochs_total": m[contract.TIME_TOTAL],
    }


def in_subprocess(args) -> list[list[float]]:
    """bare and recipe in a fresh one-thread process: no state shared with the Ray driver."""
    import subprocess

    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            "--epochs",
            str(args.epochs),
            "--samples",
            str(args.samples),
            "--workdir",
            args.workdir,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--workdir", default=None)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: a new stamped folder under results/engine_overhead/"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import torch

        torch.set_num_threads(1)
        print(json.dumps(paired_epochs(args)))
        return 0
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="attent-overhead-")
    info = harness.machine()
    bare, recipe, ray = [], [], []
    for number in range(args.rounds):  # alternated: (bare, recipe) pairs, ray, ...
        bare_s, recipe_s = in_subprocess(args)
        bare += bare_s[1:]  # the first epoch warms allocators and caches
        recipe += recipe_s[1:]
        ray.append(ray_run(args, number))
        print(
            f"round {number + 1}/{args.rounds}: bare {statistics.median(bare):.2f} s/epoch, recipe "
            f"{statistics.median(recipe):.2f}, ray {ray[-1]['epoch']:.2f}",
            file=sys.stderr,
            flush=True,
        )
    report(args, bare, recipe, ray, info)
    return 0


def report(args, bare: list[float], recipe: list[float], ray: list[dict[str, float]], info: dict) -> None:
    b, r = statistics.median(bare), statistics.median(recipe)
    ray_epoch = statistics.median(x["epoch"] for x in ray)
    fixed = {
        k: statistics.median(x[k] for x in ray) for k in ("ray_init", "worker_start", "setup", "teardown", "checkpoint")
    }
    lines = [
        f"Fashion-MNIST ViT, {args.samples} samples, full data, batch 64, one torch thread; median over "
        f"{len(bare)} epochs (bare, recipe: alternated in one process) and {len(ray)} Ray runs of {args.epochs} "
        "epochs.",
        "",
        "| loop | s / epoch | over bare |",
        "|---|---:|---:|",
    ]
    for name, value in (
        ("bare torch loop", b),
        ("engine recipe, no Ray", r),
        ("engine on Ray Train (+ MLflow, checkpoints)", ray_epoch),
    ):
        lines.append(f"| {name} | {value:.3f} | {value / b - 1:+.1%} |")
    paired = harness.ratio_text([x / y for x, y in zip(recipe, bare)], "epoch")
    lines += [
        "",
        f"Recipe over bare, epoch by epoch (paired): {paired}.",
        "",
        "Fixed cost of one Ray Train run (s, median): " + ", ".join(f"{k} {v:.1f}" for k, v in fixed.items()),
    ]
    out = harness.results_folder(args.out, info)
    harness.write_json(
        out / "runs.json",
        {
            "bare": bare,
            "recipe": recipe,
            "ray": ray,
            "samples": args.samples,
            "epochs": args.epochs,
            "checkpoint_every": args.checkpoint_every,
        },
    )
    print(
        harness.write_readme(
            out,
            "What the engine costs per epoch over a bare torch loop",
            harness.command_line(),
            "\n".join(lines),
            info,
        ).read_text()
    )


if __name__ == "__main__":
    raise SystemExit(main())
