"""A NaN training loss in the engine's recipe (``selection.nonfinite``, checked by ``Selector.step_finite`` after the
backward, before ``optimizer.step()``): under ``raise`` (the default) the epoch stops at that step, the weights those
of the step before; under ``skip`` that step is skipped and the epoch goes on. On the digits ViT of the recipe tests
(rank 0 of 1, CPU), 300 samples in 10 steps of 32; the loss of one sample of step 3's batch is multiplied by NaN,
so its gradient is NaN too: a step taken on it would leave NaN weights."""

from __future__ import annotations

import math

import pytest
import torch
from attent.engine.recipe import TrainingRecipe
from attent.selection.config import SelectionConfig

from tests.engine.test_engine_recipe import digits, recipe_for

POISONED_STEP = 3


def poisoned_recipe(nonfinite: str) -> tuple[TrainingRecipe, list[int], dict[int, list[torch.Tensor]]]:
    """The recipe, the sample whose training loss turns NaN (filled in at its step), and the weights before training
    (step 0) and after each step's ``train_step``, skipped or not (``after_step``)."""
    selection = SelectionConfig(preset="llm", nonfinite=nonfinite)  # epoch 0 on all data, scores from training
    recipe = recipe_for(digits().model_copy(update={"selection": selection}))
    original, calls, poisoned = recipe.task.per_sample_loss, [0], []

    def per_sample_loss(model, batch):
        losses = original(model, batch)
        if not torch.is_grad_enabled():  # a scoring pass or evaluation: untouched
            return losses
        calls[0] += 1
        if calls[0] != POISONED_STEP:
            return losses
        poisoned.append(int(batch["index"][1]))
        factor = torch.ones_like(losses)
        factor[1] = math.nan
        return losses * factor

    recipe.task.per_sample_loss = per_sample_loss

    def weights() -> list[torch.Tensor]:
        return [p.detach().clone() for p in recipe.raw_model.parameters()]

    snapshots = {0: weights()}
    recipe.after_step = lambda epoch, step, steps: snapshots.__setitem__(step, weights())
    return recipe, poisoned, snapshots


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_nan_loss_stops_the_epoch_at_its_step_before_the_optimiser_uses_it():
    recipe, poisoned, snapshots = poisoned_recipe("raise")
    taken = []
    recipe.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: taken.append(1))
    recipe.select(0)
    with pytest.raises(ValueError, match=r"non-finite loss at optimiser step 3 of epoch 1 for samples \[(\d+)\]") as e:
        recipe.train_one_epoch(0)
    assert e.value.args[0].count(f"[{poisoned[0]}]") == 1  # the sample whose loss was NaN
    assert len(taken) == POISONED_STEP - 1 and sorted(snapshots) == [0, 1, 2]
    now = [p.detach() for p in recipe.raw_model.parameters()]
    assert same(now, snapshots[2])  # the weights of the step before: no step used the NaN
    assert not same(snapshots[2], snapshots[0])  # not vacuous: the steps before moved them


def test_under_skip_the_step_is_skipped_and_the_epoch_goes_on():
    recipe, poisoned, snapshots = poisoned_recipe("skip")
    taken = []
    recipe.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: taken.append(1))
    recipe.select(0)
    assert recipe.train_one_epoch(0) == 10
    assert len(taken) == 9 and sorted(snapshots) == list(range(11))
    assert same(snapshots[POISONED_STEP], snapshots[POISONED_STEP - 1])  # skipped: unchanged
    for step in (1, 2, 4, 10):
        assert not same(snapshots[step], snapshots[step - 1]), step  # the other steps are taken
    assert all(torch.isfinite(p).all() for p in recipe.raw_model.parameters())
    metrics = recipe.selector.metrics()
    assert metrics["samples_nonfinite"] == 1
    scores = recipe.selector.scores
    assert math.isnan(scores[poisoned[0]])  # no score: never scored
    assert int(torch.isfinite(scores).sum()) == 300 - 1  # every other sample scored by its training forward
    # and the run goes on: the next epoch trains on the pick, its steps taken
    recipe.select(1)
    assert recipe.train_one_epoch(1) > 0 and len(taken) > 9
    assert all(torch.isfinite(p).all() for p in recipe.raw_model.parameters())
