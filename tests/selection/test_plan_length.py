"""A run's length (attent.selection.run_length, Plan.batches and Plan.steps, plan.fewest_epochs): each
count checked against what torch's DistributedSampler and DataLoader hand out, counted batch by
batch, and against step-by-step walks of the epochs, never against the formulas themselves."""

from __future__ import annotations

import math

import pytest
from attent.selection.config import SelectionConfig
from attent.selection.plan import build_plan, fewest_epochs
from attent.selection.run_length import optimiser_steps, rank_batches, run_steps, shard_size, step_position
from torch.utils.data import DataLoader, DistributedSampler

# (samples, world size, batch, accumulation, the DataLoader's drop_last, the sampler's drop_last)
CASES = [
    (1, 1, 1, 1, False, False),
    (10, 1, 3, 1, False, False),
    (10, 1, 3, 1, True, False),
    (10, 1, 3, 2, False, False),
    (10, 1, 3, 4, True, False),
    (7, 2, 2, 1, False, False),  # a rank's shard padded to 4
    (7, 2, 2, 3, True, False),
    (7, 2, 2, 1, False, True),  # trimmed to 3
    (7, 2, 4, 1, True, True),  # no whole batch left
    (23, 3, 4, 2, False, False),
    (23, 3, 4, 2, True, True),
    (23, 4, 5, 3, False, False),
    (24, 4, 6, 1, True, False),  # everything divides
    (5, 8, 1, 2, False, False),  # more ranks than samples: every shard padded
    (100, 8, 7, 4, True, False),
]


def drawn_batches(samples: int, world_size: int, rank: int, batch: int, drop_last: bool, trim: bool, skip=0):
    """The batches a DataLoader draws on ``rank`` from a DistributedSampler over ``samples`` items,
    counted by drawing them (``skip``: the shard's first samples left out)."""
    sampler = DistributedSampler(range(samples), num_replicas=world_size, rank=rank, shuffle=False, drop_last=trim)
    shard = list(sampler)[skip:]
    return sum(1 for _ in DataLoader(shard, batch_size=batch, drop_last=drop_last))


def stepped(batches: int, accumulation: int) -> int:
    """Optimiser steps of a loop that steps after every ``accumulation``-th batch and after the last."""
    steps = 0
    for b in range(1, batches + 1):
        if b % accumulation == 0 or b == batches:
            steps += 1
    return steps


@pytest.mark.parametrize("samples,world,batch,accumulation,drop_last,trim", CASES)
def test_a_ranks_batches_and_steps_are_what_the_loader_draws(samples, world, batch, accumulation, drop_last, trim):
    counted = {drawn_batches(samples, world, rank, batch, drop_last, trim) for rank in range(world)}
    assert len(counted) == 1  # every rank draws as many
    (batches,) = counted
    assert rank_batches(samples, batch, world, drop_last=drop_last, even=not trim) == batches
    assert optimiser_steps(batches, accumulation) == stepped(batches, accumulation)


@pytest.mark.parametrize("samples,world,batch,accumulation,drop_last,trim", CASES)
def test_an_epoch_resumed_inside_batches_the_rest_of_the_shard(samples, world, batch, accumulation, drop_last, trim):
    shard = list(DistributedSampler(range(samples), num_replicas=world, rank=0, shuffle=False, drop_last=trim))
    assert shard_size(samples, world, even=not trim) == len(shard)
    for drawn in range(len(shard) + 1):
        counted = drawn_batches(samples, world, 0, batch, drop_last, trim, skip=drawn)
        assert rank_batches(samples, batch, world, drop_last=drop_last, even=not trim, drawn=drawn) == counted


@pytest.mark.parametrize("samples,world,batch,accumulation,drop_last,trim", CASES)
@pytest.mark.parametrize("preset", ["vit", "llm"])
def test_the_plans_epochs_are_what_the_loader_draws(preset, samples, world, batch, accumulation, drop_last, trim):
    plan = build_plan(SelectionConfig(preset=preset), 6)
    sizes = plan.subset_sizes(samples)
    batches = plan.batches(samples, batch, world, drop_last=drop_last, even=not trim)
    assert batches == [drawn_batches(size, world, world - 1, batch, drop_last, trim) for size in sizes]
    steps = plan.steps(batches, accumulation)
    assert steps == [stepped(b, accumulation) for b in batches]
    if preset == "vit" and samples >= 10:
        assert len(set(sizes)) > 1  # the subsets grow: the epochs counted are of different sizes


@pytest.mark.parametrize("steps", [[3], [3, 3, 3], [1, 4, 2], [5, 0, 2], [2, 2, 0]])
def test_the_epoch_a_step_falls_in(steps):
    walk = [(epoch, taken) for epoch, count in enumerate(steps) for taken in range(count)]  # one entry a step
    for step, position in enumerate(walk):
        assert step_position(steps, step) == position
    for beyond in range(3):  # at and past the run's end
        assert step_position(steps, len(walk) + beyond) == (len(steps), beyond)


@pytest.mark.parametrize("per_epoch", [1, 7, 10, 33])
@pytest.mark.parametrize("epochs", [1, 2.0, 0.5, 1.3, 2.05, 3.999])
def test_a_run_of_equal_epochs_takes_trainers_steps(per_epoch, epochs):
    # Trainer's own count for num_train_epochs = x: ceil(x * steps per epoch)
    assert run_steps([per_epoch] * math.ceil(epochs), epochs) == math.ceil(epochs * per_epoch)


def test_a_fractional_run_cuts_its_last_epoch_by_its_own_length():
    assert run_steps([4, 6, 10], 3) == 20
    assert run_steps([4, 6, 10], 2.5) == 4 + 6 + 5  # half of the last epoch's 10 steps
    assert run_steps([4, 6, 10], 2.01) == 4 + 6 + 1  # a started step counts


@pytest.mark.parametrize("max_steps", [1, 5, 17, 40, 111])
@pytest.mark.parametrize("world,batch,accumulation,drop_last", [(1, 4, 1, False), (2, 3, 2, True), (3, 5, 1, False)])
def test_the_fewest_epochs_that_hold_max_steps(max_steps, world, batch, accumulation, drop_last):
    selection, samples = SelectionConfig(preset="vit"), 60

    def held(epochs: int) -> int:
        plan = build_plan(selection, epochs)
        return sum(plan.steps(plan.batches(samples, batch, world, drop_last=drop_last), accumulation))

    fewest = next(epochs for epochs in range(1, max_steps + 1) if held(epochs) >= max_steps)  # one by one
    found = fewest_epochs(selection, max_steps, samples, batch, world, accumulation=accumulation, drop_last=drop_last)
    assert found == fewest


def test_no_plan_holding_max_steps_is_refused():
    # 8 samples on 2 ranks in batches of 8 with drop_last: no epoch holds a step
    with pytest.raises(ValueError, match="no plan of up to 3 epochs holds max_steps=3 steps"):
        fewest_epochs(SelectionConfig(preset="vit"), 3, 8, 8, 2, drop_last=True)
