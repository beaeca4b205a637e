"""The precision plumbing on the CPU, so that CI exercises it without a GPU: `train.precision:
bf16` runs the forward passes of training, scoring and evaluation under bf16 autocast, and the
run trains as fp32 does, within bf16's rounding."""

from __future__ import annotations

import torch
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import build_experiment


def run(precision: str, scoring_precision: str | None = None) -> tuple[TrainingRecipe, list[dict], list[torch.dtype]]:
    cfg = build_experiment(
        {
            "name": f"precision-{precision}",
            "seed": 0,
            "task": {
                "name": "vision",
                "dataset": "digits",
                "img_size": 8,
                "train_limit": 400,
                "test_limit": 100,
                "model": {"preset": "vit_tiny_cpu", "patch_size": 2},
            },
            "train": {"epochs": 2, "batch_size": 64, "precision": precision, "scoring_precision": scoring_precision},
            "selection": {"preset": "vit"},
        }
    )
    recipe = TrainingRecipe(cfg, WorkerContext())
    recipe.setup()
    dtypes = []
    recipe.raw_model.head.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    return recipe, [recipe.run_epoch(epoch) for epoch in range(2)], dtypes


def test_bf16_autocast_on_the_cpu_trains_scores_and_evaluates_like_fp32():
    bf16, bf16_rows, bf16_dtypes = run("bf16")
    fp32, fp32_rows, fp32_dtypes = run("fp32")
    assert set(fp32_dtypes) == {torch.float32}
    assert set(bf16_dtypes) == {torch.bfloat16}  # training, scoring and evaluation forwards alike
    assert bf16.counters.seconds["scoring"] > 0 and torch.isfinite(bf16.selector.scores).all()
    for ours, theirs in zip(bf16_rows, fp32_rows):
        assert abs(ours["train_loss"] - theirs["train_loss"]) < 0.05 * theirs["train_loss"]
        assert abs(ours["eval_test_loss"] - theirs["eval_test_loss"]) < 0.05 * theirs["eval_test_loss"]
    # the scores differ by bf16's rounding only: the same samples rank high
    assert torch.corrcoef(torch.stack([bf16.selector.scores, fp32.selector.scores]))[0, 1] > 0.9


def test_bf16_scoring_alone_leaves_training_and_evaluation_in_fp32():
    """`train.scoring_precision: bf16` (faster on this CPU, benchmarks/results/scoring_speed/scoring_speed.md):
    the scoring forwards alone run in bf16."""
    mixed, _, dtypes = run("fp32", scoring_precision="bf16")
    scoring_forwards = -(-400 // 128)  # one pass over 400 samples at the default 2 x batch size
    assert dtypes.count(torch.bfloat16) == scoring_forwards * 2  # the vit preset re-scores in both epochs
    assert set(dtypes) == {torch.float32, torch.bfloat16}
    fp32, _, _ = run("fp32")
    assert torch.corrcoef(torch.stack([mixed.selector.scores, fp32.selector.scores]))[0, 1] > 0.9
