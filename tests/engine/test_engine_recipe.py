"""The training recipe's steps on a plain torch set-up (rank 0 of 1, CPU, real digits data and a
real timm ViT): gradient accumulation, the optimiser hook, one definition of progress."""

from __future__ import annotations

import pytest
import torch
from attent import contract
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import build_experiment
from attent.selection.config import SelectionConfig
from attent.selection.plan import build_plan, training_progress
from attent.selection.selector import Selector
from attent.tasks.task import decay_groups


def digits(limit: int = 300, **train):
    return build_experiment(
        {
            "name": "recipe",
            "seed": 1,
            "task": {
                "name": "vision",
                "dataset": "digits",
                "img_size": 8,
                "train_limit": limit,
                "model": {"preset": "vit_tiny_cpu", "patch_size": 2},
            },
            "train": {"epochs": 2, "batch_size": 32, **train},
            "selection": {"method": "full"},
        }
    )


def recipe_for(cfg) -> TrainingRecipe:
    recipe = TrainingRecipe(cfg, WorkerContext())
    recipe.setup()
    return recipe


def first_step_gradients(recipe: TrainingRecipe) -> list[torch.Tensor]:
    """The gradients the first optimiser step of epoch 0 applies (read by a step pre-hook)."""
    seen = []
    recipe.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(
            [p.grad.clone() for group in optimizer.param_groups for p in group["params"]]
        )
    )
    recipe.select(0)
    recipe.train_one_epoch(0)
    return seen[0]


def test_an_accumulated_short_window_has_the_gradient_of_one_batch():
    # 44 samples under a global batch of 128: one optimiser step of micro-batches 32 + 12, the
    # epoch's last, shorter window; against the same 44 samples as one batch
    accumulated = recipe_for(digits(44, global_batch_size=128, grad_clip=None))
    one_batch = recipe_for(digits(44, batch_size=44, grad_clip=None))
    assert accumulated.accumulation == 4 and [len(b["index"]) for b in accumulated.loader] == [32, 12]
    a, b = first_step_gradients(accumulated), first_step_gradients(one_batch)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)
    # the old normalisation (batch mean / accumulation steps) gave this window a quarter-sized,
    # unevenly weighted update
    assert not torch.allclose(a[0], b[0] * 2 / accumulated.accumulation)


def test_an_epoch_of_accumulated_steps_equals_an_epoch_of_large_batches():
    accumulated, large = recipe_for(digits(global_batch_size=128)), recipe_for(digits(batch_size=128))
    assert (accumulated.accumulation, large.accumulation) == (4, 1)
    initial = [p.detach().clone() for p in large.model.parameters()]  # the same seed: the same start
    for recipe in (accumulated, large):
        recipe.select(0)
        assert recipe.train_one_epoch(0) == 3  # optimiser steps: 128 + 128 + 44
        assert recipe.record(0, 3, {})[contract.SAMPLES_FORWARDED] == 300
    # The same three updates, up to float noise, which Adam magnifies elementwise where a gradient
    # is near 0 (one weight in 12,288 moved 4e-5 apart on an AVX-512 machine): compared per tensor.
    for a, b, start in zip(accumulated.model.parameters(), large.model.parameters(), initial):
        assert (a - b).norm() <= 1e-3 * (b - start).norm()


def test_the_optimizer_uses_the_tasks_groups_and_the_configs_overrides():
    recipe = recipe_for(digits(betas=[0.8, 0.95], weight_decay=0.1))
    groups = recipe.optimizer.param_groups
    assert all(g["betas"] == (0.8, 0.95) for g in groups)
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.1]
    default = recipe_for(digits())
    assert default.optimizer.param_groups[0]["betas"] == (0.9, 0.999)  # the task's spec
    assert max(g["weight_decay"] for g in default.optimizer.param_groups) == 0.05


def test_no_weight_decay_on_norms_biases_embeddings():
    model = recipe_for(digits()).raw_model
    decayed, exempt = decay_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    exempt_names = {names[id(p)] for p in exempt["params"]}
    decayed_names = {names[id(p)] for p in decayed["params"]}
    assert {"pos_embed", "cls_token", "norm.weight", "patch_embed.proj.bias"} <= exempt_names
    assert "blocks.0.attn.qkv.weight" in decayed_names and "patch_embed.proj.weight" in decayed_names
    assert not any(".norm" in n or n.endswith(".bias") for n in decayed_names)
    embedding = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2))
    decayed, exempt = decay_groups(embedding, 0.1)
    assert [p.shape for p in exempt["params"]] == [torch.Size([10, 4]), torch.Size([2])]


# --- one definition of progress ---------------------------------------------------------------
CONFIGS = [
    {"preset": "vit"},
    {"preset": "llm"},
    {"strategy": "random", "ratio": {"kind": "cosine"}, "interval": {"kind": "incremental", "start": 1, "end": 3}},
    {"strategy": "random", "ratio": {"kind": "incremental"}, "warmup_epochs": 2},
]


@pytest.mark.parametrize("epochs", [1, 3, 6, 20])
@pytest.mark.parametrize("selection", CONFIGS)
def test_the_plan_is_what_the_selector_selects(selection, epochs):
    cfg = SelectionConfig.model_validate(selection)
    selector = Selector(range(100), selection=cfg, epochs=epochs, seed=0)
    for epoch in range(epochs):
        selector.begin_epoch(epoch, score_fn=lambda indices: iter([(torch.arange(100), torch.rand(100))]))
        selector.end_epoch()
    assert [(r.epoch, r.ratio) for r in selector.history] == build_plan(cfg, epochs).ratios()
    assert all(r.ratio == cfg.ratio_schedule(training_progress(r.epoch, epochs)) for r in selector.history)


def test_the_label_shows_the_ratio_a_short_run_reaches():
    vit = SelectionConfig(preset="vit")
    assert build_plan(vit, 6).ratios() == [
        (0, 0.2),
        (1, pytest.approx(0.3)),
        (3, pytest.approx(0.5)),
        (5, pytest.approx(0.7)),
    ]
    assert build_plan(vit, 6).label == "Soft · incremental(0.2→0.8, reached 0.7) · incremental(1→4)"
    assert build_plan(vit, 1000).label == "Soft · incremental(0.2→0.8) · incremental(1→4)"
    assert build_plan(SelectionConfig(preset="llm"), 3).label == "Hard · fixed(0.7) · fixed(1)"
    assert build_plan(SelectionConfig(preset="llm"), 3).ratio_reached() == 1.0  # warm-up epoch on all data


def test_loader_processes_start_from_a_fork_server_and_train_and_score_as_in_process():
    """A Ray worker runs threads beside the training, so its loader processes start from a fork server
    (``LOADER_START``), not by forking it; the batches they hand over train and score as the
    training process's own do."""
    from attent.engine.recipe import LOADER_START

    def epoch_losses(workers: int):
        cfg = digits(limit=64, loader_workers=workers)
        cfg = cfg.model_copy(update={"selection": SelectionConfig(preset="vit")})
        recipe = recipe_for(cfg)
        recipe.run_epoch(0)
        return recipe, recipe.selector.scores.clone()

    with_processes, scores = epoch_losses(1)
    assert with_processes.loader.multiprocessing_context.get_start_method() == LOADER_START == "forkserver"
    assert with_processes.selector.scoring.loader._loader.multiprocessing_context.get_start_method() == LOADER_START
    in_process, in_process_scores = epoch_losses(0)
    assert torch.equal(scores, in_process_scores)  # the same samples scored the same, whoever loaded them


def test_a_tasks_scores_are_what_the_selector_ranks_and_its_losses_what_training_steps_on():
    def run(score_of=None):
        cfg = digits(limit=64)
        recipe = recipe_for(cfg.model_copy(update={"selection": SelectionConfig(preset="vit")}))
        if score_of is not None:
            recipe.task.score_of = score_of
        return first_step_gradients(recipe), recipe.selector.scores.clone()

    gradients, scores = run()
    shifted_gradients, shifted_scores = run(lambda losses, batch: losses * 3.0)  # trained on, it would triple them
    assert all(torch.equal(a, b) for a, b in zip(gradients, shifted_gradients, strict=True))
    torch.testing.assert_close(shifted_scores, scores * 3.0, equal_nan=True)
    assert not scores.isnan().all()
