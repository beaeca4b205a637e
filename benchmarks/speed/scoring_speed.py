"""How fast a scoring pass runs at each batch size and precision, on this machine: the forward
passes AtteNT spends before each re-selection, for the Fashion-MNIST ViT and the offline
Multi-Modal MAE (the small benchmark's workloads), each setting timed side by side in one
process, one torch thread (as the benchmark's workers), median of repeats.

    python benchmarks/speed/scoring_speed.py [--repeats 5] [--out FOLDER]

Writes ``README.md`` (the tables, the command, the machine) into ``--out``, by default a new folder
``benchmarks/results/scoring_speed/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import build_experiment
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

REPO = harness.REPO
WORKLOADS = {
    "fmnist-vit (600 images)": {
        "task": {
            "name": "vision",
            "dataset": "fashion_mnist",
            "train_limit": 600,
            "test_limit": 100,
            "model": {"preset": "vit_tiny_cpu"},
        },
        "train": {"batch_size": 64},
    },
    "multimae (400 scenes)": {
        "task": {
            "name": "multimae",
            "data_path": str(REPO / "data/scenes"),
            "img_size": 32,
            "visible_tokens": 48,
            "train_limit": 400,
            "test_limit": 100,
            "model": {"preset": "vit_tiny_cpu", "decoder_dim": 64, "decoder_depth": 1},
        },
        "train": {"batch_size": 128},
    },
}
BATCHES = (64, 128, 256, 512)
PRECISIONS = ("fp32", "bf16")


def time_pass(recipe: TrainingRecipe, repeats: int) -> tuple[float, torch.Tensor]:
    """Median seconds of a scoring pass over the whole training set, and its per-sample scores
    (of a fixed round, so that every setting scores the same masks)."""
    everything = torch.arange(len(recipe.train_set))
    times, scores = [], torch.empty(len(everything))
    for _ in range(repeats + 1):  # the first warms caches and the allocator: not counted
        start = time.perf_counter()
        recipe.selector.scoring.loss_fn = functools.partial(recipe.scoring_loss, round_=0)  # the masks' round
        for index, losses in recipe.selector.scoring_pass(everything):
            scores[index] = losses.float().reshape(len(index), -1).sum(1)  # MAE: summed over modalities
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]), scores


def time_settings(name: str, sections: dict, repeats: int) -> tuple[dict, dict]:
    """Every precision x batch size of one workload, a fresh recipe each: the median seconds of a
    scoring pass and its per-sample scores, both keyed by (precision, batch)."""
    results, scores = {}, {}
    for precision in PRECISIONS:
        for batch in BATCHES:
            cfg = build_experiment(
                {
                    "name": "scoring",
                    "seed": 0,
                    **sections,
                    "selection": {"preset": "vit"},
                    "train": {
                        **sections["train"],
                        "epochs": 8,
                        "scoring_precision": precision,
                        "scoring_batch_size": batch,
                    },
                }
            )
            recipe = TrainingRecipe(cfg, WorkerContext())
            recipe.setup()
            results[precision, batch], scores[precision, batch] = time_pass(recipe, repeats)
            print(f"{name} {precision} batch {batch}: {results[precision, batch]:.3f} s", flush=True)
    return results, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, help="results folder (default: a new stamped one under results/scoring_speed/)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = harness.machine()
    lines = [
        "The model at initialisation (the same seed in every setting); Spearman: the rank "
        "correlation of bf16's per-sample scores with fp32's at the same batch size, the "
        "order AtteNT selects by.",
        "",
        f"One torch thread, median of {args.repeats} passes over the whole training set; torch "
        f"{torch.__version__}, {torch.backends.cpu.get_cpu_capability()}.",
        "",
        "| workload | precision | " + " | ".join(f"batch {b} (s)" for b in BATCHES) + " | fastest |",
        "|---|---|" + "---:|" * (len(BATCHES) + 1),
    ]
    agreement = []
    for name, sections in WORKLOADS.items():
        results, scores = time_settings(name, sections, args.repeats)
        best = min(results, key=results.get)
        rho = [spearmanr(scores["fp32", b], scores["bf16", b]).statistic for b in BATCHES]
        agreement.append(f"| {name} | " + " | ".join(f"{r:.4f}" for r in rho) + " |")
        for precision in PRECISIONS:
            cells = " | ".join(f"{results[precision, b]:.3f}" for b in BATCHES)
            lines.append(
                f"| {name} | {precision} | {cells} | "
                f"{'**' + best[0] + ', batch ' + str(best[1]) + '**' if best[0] == precision else ''} |"
            )
    lines += [
        "",
        "| workload | " + " | ".join(f"Spearman fp32/bf16, batch {b}" for b in BATCHES) + " |",
        "|---|" + "---:|" * len(BATCHES),
        *agreement,
    ]
    out = harness.results_folder(args.out, info)
    print(
        harness.write_readme(
            out, "Scoring pass speed by batch size and precision", harness.command_line(), "\n".join(lines), info
        ).read_text()
    )


if __name__ == "__main__":
    main()
