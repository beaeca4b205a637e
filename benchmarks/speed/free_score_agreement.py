"""How well free scores rank the samples: at each re-selection of a run with ``selection.scores:
training`` (the cycles reading), the table the Selector ranks by (the training forwards of the
latest full-data epoch) against a fresh scoring pass over every sample at that moment, by
Spearman's rank correlation; and for contrast, the same with ``scores: latest`` and no pass (each
sample's latest training loss, subset epochs included). The fresh pass is measured only: it does
not enter the table, so the run trains exactly as it would without it.

    python benchmarks/speed/free_score_agreement.py [--images 2000] [--seeds 0 1] [--out FOLDER]

The cycles verdict's workload (Fashion-MNIST ViT, E = 21, 4 cycles, Soft on raw losses at T = 1),
in this process, one torch thread. Writes ``README.md`` and ``agreement.json`` into ``--out``, by
default ``benchmarks/results/free_score_agreement/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from attent.engine.recipe import TrainingRecipe, WorkerContext
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

CYCLES = ["train.epochs=21", "train.eval_every=21", *harness.CYCLES_SELECTION]
SCORES = {"training": ["selection.scores=training"], "latest": ["selection.scores=latest", "selection.rescore=false"]}


def agreement(scores: str, images: int, seed: int, workdir: Path) -> list[dict]:
    """Per re-selection: its epoch and Spearman of the table the Selector ranks by against a fresh
    pass over every sample (measured before the Selector re-selects)."""
    cfg = harness.experiment(
        harness.REPO / "experiments/fashion_mnist_vit.yaml",
        f"agreement-{scores}-s{seed}",
        [*CYCLES, *SCORES[scores], f"task.train_limit={images}", "task.test_limit=200", f"seed={seed}"],
        workdir,
        "free-score-agreement",
        workers=0,
    )
    recipe = TrainingRecipe(cfg, WorkerContext())
    recipe.setup()
    selector, rows = recipe.selector, []
    everything = torch.arange(len(recipe.train_set))
    for epoch in range(cfg.train.epochs):
        if selector.plan[epoch].selects and not torch.isnan(selector.scores).any():
            # the pass of this epoch's round (it seeds a task's masks), the run's own loss_fn after
            own, selector.scoring.loss_fn = (
                selector.scoring.loss_fn,
                functools.partial(recipe.scoring_loss, round_=epoch),
            )
            fresh = torch.empty(len(everything))
            for index, losses in selector.scoring_pass(everything):
                fresh[index] = losses.float()
            selector.scoring.loss_fn = own
            rho = spearmanr(selector.scores.numpy(), fresh.numpy()).statistic
            rows.append({"epoch": epoch, "spearman": float(rho)})
        recipe.run_epoch(epoch)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = harness.results_folder(args.out)
    results = {}
    with tempfile.TemporaryDirectory(prefix="attent-agreement-") as workdir:
        for seed in args.seeds:
            for scores in SCORES:  # interleaved: the two readings of a seed back to back
                results[f"{scores}-s{seed}"] = agreement(scores, args.images, seed, Path(workdir))
    harness.write_json(out / "agreement.json", results)
    lines = [
        "| scores | seed | re-selections | Spearman vs a fresh pass: mean | min | max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, rows in results.items():
        scores, seed = key.rsplit("-s", 1)
        rhos = [r["spearman"] for r in rows]
        lines.append(
            f"| {scores} | {seed} | {len(rhos)} | {statistics.mean(rhos):.3f} | {min(rhos):.3f} | {max(rhos):.3f} |"
        )
    body = (
        f"Fashion-MNIST ViT, {args.images} images, E = 21, the cycles reading (Soft, raw losses, T = 1). "
        "`training`: free scores (the latest full-data epoch's training forwards); `latest`: each "
        "sample's latest training loss, subset epochs included, no pass.\n\n" + "\n".join(lines)
    )
    harness.write_readme(out, "Free scores against a fresh scoring pass", harness.command_line(), body)
    print(body)


if __name__ == "__main__":
    main()
