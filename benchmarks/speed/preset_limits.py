"""How much of each plan's physical limit the engine realizes: for each selection plan (the
presets, the cheap re-scoring, the cycles reading with and without free scores) and full data,
run side by side on the same data, the realized saving (1 − method cost / full data's), the
ideal (1 − samples back-propagated / full data's) and the limit (1 − (back-propagated +
scored / 3) / full data's, in sample-epochs: a forward costs about a third of a training step).
The goal: every plan's realized / ideal within 0.1 of its limit / ideal (a shortfall, (limit −
realized) / ideal, of at most 0.1), which reads the same where the limit is a sliver of the ideal.

    python benchmarks/speed/preset_limits.py [--images 2000] [--epochs 21] [--rounds 3] [--out FOLDER]
    python benchmarks/speed/preset_limits.py --from-runs FOLDER/runs.json   # the README again
    python benchmarks/speed/preset_limits.py --from-mlflow sqlite:///mlflow.db beyond-paper --out FOLDER
                                             # the same table for an `attent bench` experiment's arms

The Fashion-MNIST ViT through the engine's recipe in this process (no Ray, no MLflow), one torch
thread, evaluation only after the last epoch (it is not in the method cost). A round runs every
plan once on the round's seed (its own images), one at a time, in an order rotated each round so
that a drift of the machine falls on every plan alike; ratios are taken within a round. Writes
``README.md`` and ``runs.json`` into ``--out``, by default
``benchmarks/results/preset_limits/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from attent import contract
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.selection.plan import build_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

CYCLES = harness.CYCLES_SELECTION  # the released code's reading (E = 21)
PLANS = {
    "full": ["selection.preset=null", "selection.method=full"],
    "vit": ["selection.preset=vit"],
    "vit, rescore_stale + rescore_fraction 0.25": [
        "selection.preset=vit",
        "selection.rescore_stale=true",
        "selection.rescore_fraction=0.25",
    ],
    "llm": ["selection.preset=llm"],
    "cycles": CYCLES,
    "cycles, scores: training": [*CYCLES, "selection.scores=training"],
}
GOAL = 0.1  # the largest shortfall, (limit - realized) / ideal


def run_plan(plan: str, seed: int, args, workdir: Path) -> dict:
    """One run of ``plan``: its method cost and parts, samples back-propagated and forwarded."""
    cfg = harness.experiment(
        harness.REPO / "experiments" / "fashion_mnist_vit.yaml",
        f"limits-s{seed}",
        [
            *PLANS[plan],
            f"train.epochs={args.epochs}",
            f"train.eval_every={args.epochs}",
            f"task.train_limit={args.images}",
            "task.test_limit=200",
            f"seed={seed}",
        ],
        workdir,
        "preset-limits",
        workers=0,
    )
    recipe = TrainingRecipe(cfg, WorkerContext())
    recipe.setup()
    start = time.perf_counter()
    for epoch in range(cfg.train.epochs):
        recipe.run_epoch(epoch)
    final = recipe.final_metrics()
    backpropagated, forwarded = final[contract.SAMPLES_BACKPROPAGATED], final[contract.SAMPLES_FORWARDED]
    return {
        "plan": plan,
        "seed": seed,
        "label": build_plan(cfg.selection, cfg.train.epochs).label,
        "method_s": final[contract.TIME_METHOD],
        "train_s": final[contract.time_metric("train")],
        "scoring_s": final[contract.time_metric("scoring")],
        "selection_s": final[contract.time_metric("selection")],
        "wall_s": time.perf_counter() - start,
        "backpropagated": backpropagated,
        "scored": forwarded - backpropagated,  # one process: every training forward is back-propagated
        "accuracy": final.get(contract.EVAL_PREFIX + "test_accuracy", float("nan")),
    }


def savings(run: dict, full: dict) -> dict:
    """The run's ideal, limit and realized savings against full data of its round, their ratios,
    and what a scored sample cost against a sample trained on full data."""
    ideal = 1 - run["backpropagated"] / full["backpropagated"]
    limit = 1 - (run["backpropagated"] + run["scored"] / 3) / full["backpropagated"]
    realized = 1 - run["method_s"] / full["method_s"]
    per_trained = full["train_s"] / full["backpropagated"]
    return {
        "ideal": ideal,
        "limit": limit,
        "realized": realized,
        "limit_over_ideal": limit / ideal if ideal else float("nan"),
        "realized_over_ideal": realized / ideal if ideal else float("nan"),
        "realized_over_limit": realized / limit if limit > 0 else float("nan"),
        "shortfall": (limit - realized) / ideal if ideal else float("nan"),
        "score_over_train": run["scoring_s"] / run["scored"] / per_trained if run["scored"] else float("nan"),
    }


def spread(values: list[float], digits: int = 2, percent: bool = False) -> str:
    """Median [min, max] over the rounds."""
    values = [v for v in values if v == v]
    if not values:
        return "–"
    shown = (lambda v: f"{v:.1%}") if percent else (lambda v: f"{v:.{digits}f}")
    if len(values) == 1:
        return shown(values[0])
    return f"{shown(statistics.median(values))} [{shown(min(values))}, {shown(max(values))}]"


def bench_runs(tracking_uri: str, experiment: str) -> list[dict]:
    """The finished trial runs of an ``attent bench`` experiment as this study's runs, their arm as
    the plan (full data's arm is ``full``) and their seed as the round."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no experiment {experiment!r} in {tracking_uri}: name one `attent bench` wrote")
    runs = []
    for run in client.search_runs([found.experiment_id], "attributes.status = 'FINISHED'", max_results=5000):
        metrics, tags = run.data.metrics, run.data.tags
        if "attent.benchmark.method" not in tags or contract.SAMPLES_FORWARDED not in metrics:
            continue
        backpropagated = metrics[contract.SAMPLES_BACKPROPAGATED]
        runs.append(
            {
                "plan": tags["attent.benchmark.method"],
                "seed": int(run.data.params["seed"]),
                "label": tags.get("attent.label", ""),
                "method_s": metrics[contract.TIME_METHOD],
                "train_s": metrics.get(contract.time_metric("train"), metrics[contract.TIME_METHOD]),
                "scoring_s": metrics.get(contract.time_metric("scoring"), 0.0),
                "selection_s": metrics.get(contract.time_metric("selection"), 0.0),
                "backpropagated": backpropagated,
                "scored": metrics[contract.SAMPLES_FORWARDED] - backpropagated,
                "accuracy": metrics.get(contract.EVAL_PREFIX + "test_accuracy", float("nan")),
            }
        )
    return runs


def report(runs: list[dict], args) -> str:
    by = {(r["plan"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    plans = [p for p in PLANS if any(r["plan"] == p for r in runs)]
    plans += sorted({r["plan"] for r in runs} - set(plans))
    lines = [
        "| plan | selection | back-propagated | scored | ideal | limit | realized | realized / ideal "
        "| limit / ideal | shortfall | at the goal | realized / limit | scored / trained, per sample |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|",
    ]
    for plan in plans:
        paired = [s for s in seeds if (plan, s) in by and ("full", s) in by]
        rows = [savings(by[plan, s], by["full", s]) for s in paired]
        if plan == "full" or not any(r["ideal"] > 0 for r in rows):
            continue  # full data, and controls that train more than it
        mine = [by[plan, s] for s in paired]
        full_samples = statistics.mean(by["full", s]["backpropagated"] for s in paired)
        shortfalls = [r["shortfall"] for r in rows]
        met = bool(shortfalls) and statistics.median(shortfalls) <= GOAL
        lines.append(
            f"| {plan} | {mine[0]['label']} "
            f"| {statistics.mean(r['backpropagated'] for r in mine) / full_samples:.1%} "
            f"| {statistics.mean(r['scored'] for r in mine) / full_samples:.1%} "
            f"| {spread([r['ideal'] for r in rows], percent=True)} | {spread([r['limit'] for r in rows], percent=True)} "
            f"| {spread([r['realized'] for r in rows], percent=True)} "
            f"| {spread([r['realized_over_ideal'] for r in rows])} | {spread([r['limit_over_ideal'] for r in rows])} "
            f"| {spread(shortfalls)} | {'yes' if met else '**no**'} | {spread([r['realized_over_limit'] for r in rows])} "
            f"| {spread([r['score_over_train'] for r in rows])} |"
        )
    full = [by["full", s] for s in seeds]
    where = (
        f"The arms of `attent bench`'s experiment {args.from_mlflow[1]!r}, seeds {seeds} as rounds"
        if args.from_mlflow
        else f"Fashion-MNIST ViT, {args.images} images, E = {args.epochs}, {len(seeds)} rounds (seeds {seeds}), "
        "one torch thread, the engine's recipe in one process"
    )
    return (
        f"{where}. Back-propagated and scored: sample-epochs "
        "over full data's. Savings against full data of the same round; median [min, max] over rounds. "
        "Limit: 1 − (back-propagated + scored / 3) / full data's. Shortfall: (limit − realized) / ideal; "
        f"at the goal: its median at most {GOAL}. Scored / trained, per sample: a scored sample's scoring time over a sample's training "
        "time on full data (the limit takes it as 1/3).\n\n"
        + "\n".join(lines)
        + f"\n\nFull data: method cost {harness.mean_std([r['method_s'] for r in full])} s per run, "
        f"final test accuracy {harness.mean_std([r['accuracy'] for r in full])}"
        + ("." if args.from_mlflow else " (200 images).")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=21, help="the cycles plans need at least 21")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plans", nargs="+", choices=[p for p in PLANS if p != "full"], help="these beside full data")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--from-runs", type=Path, help="write the README of a finished study from its runs.json")
    parser.add_argument(
        "--from-mlflow", nargs=2, metavar=("TRACKING_URI", "EXPERIMENT"), help="an `attent bench` experiment's runs"
    )
    args = parser.parse_args()
    if args.from_mlflow:
        runs = bench_runs(*args.from_mlflow)
        out = harness.results_folder(args.out)
        harness.write_json(out / "runs.json", runs)
        body = report(runs, args)
        harness.write_readme(out, "Each arm's realized saving against its limit", harness.command_line(), body)
        print(body)
        return
    if args.from_runs:
        body = report(json.loads(args.from_runs.read_text()), args)
        readme = args.from_runs.parent / "README.md"
        head, _, _ = readme.read_text().partition("\n\nFashion-MNIST ViT")
        readme.write_text(head + "\n\n" + body + "\n")
        print(body)
        return
    torch.set_num_threads(1)
    info = harness.machine()
    out = harness.results_folder(args.out, info)
    runs = []
    order = ["full", *(args.plans or [p for p in PLANS if p != "full"])]
    with tempfile.TemporaryDirectory(prefix="attent-limits-") as workdir:
        for seed in range(args.rounds):
            for plan in order[seed % len(order) :] + order[: seed % len(order)]:
                runs.append(run_plan(plan, seed, args, Path(workdir)))
                print(f"round {seed} {plan}: method {runs[-1]['method_s']:.1f} s", flush=True)
                harness.write_json(out / "runs.json", runs)
    body = report(runs, args)
    harness.write_readme(out, "Each plan's realized saving against its limit", harness.command_line(), body, info)
    print(body)


if __name__ == "__main__":
    main()
