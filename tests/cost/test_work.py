"""A run's planned work equals what a Teacher does on the same plan (random losses: the sizes
depend on the plan and the scoring policy alone), for every reading of the plan and every
scoring policy."""

from __future__ import annotations

import pytest
import torch
from attent.cost.work import planned_work
from attent.experiment.files import load_experiment
from attent.selection.teacher import Teacher

from tests.helpers.paths import REPO

SAMPLES = 1000


def teacher_work(cfg) -> tuple[int, int]:
    """(trained, scored) sample-epochs of a Teacher run on random losses."""
    generator = torch.Generator().manual_seed(1)
    teacher, scored, trained = Teacher(SAMPLES, cfg.selection, cfg.train.epochs, seed=cfg.seed), [], 0

    def score(indices):
        scored.append(len(indices))
        yield indices, torch.rand(len(indices), generator=generator)

    for epoch in range(cfg.train.epochs):
        subset = teacher.begin_epoch(epoch, score)
        teacher.observe(subset, torch.rand(len(subset), generator=generator))
        teacher.end_epoch()
        trained += len(subset)
    return trained, sum(scored)


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # the ViT variant: a scoring pass before every re-selection
        ["selection.rescore_stale=true", "train.epochs=12"],
        ["selection.rescore_fraction=0.3", "train.epochs=12"],
        ["selection.strategy=random"],  # reads no scores: no pass
        ["selection.preset=llm", "train.epochs=5"],  # training forwards' losses only
        ["train.epochs=30", "selection.interval={kind: cycles, cycles: 4, start: 1, end: 2}"],
        ["train.epochs=30", "selection.interval={kind: cycles, cycles: 4, start: 1}", "selection.scores=training"],
        ["selection.preset=null", "selection.method=full"],
    ],
)
def test_the_planned_work_is_the_teachers(overrides):
    cfg = load_experiment(REPO / "experiments/digits_vit.yaml", overrides)
    work = planned_work(cfg, SAMPLES)
    assert (work.trained, work.scored) == teacher_work(cfg)
    assert work.full == cfg.train.epochs * SAMPLES


def test_the_limit_is_the_back_propagated_and_a_third_of_the_scored_against_full_data():
    cfg = load_experiment(REPO / "experiments/digits_vit.yaml", ["train.eval_every=2", "train.epochs=5"])
    work = planned_work(cfg, SAMPLES, eval_samples=100, eval_forwards=1.5)
    assert work.limit == pytest.approx(1 - (work.trained + work.scored / 3) / (5 * SAMPLES))
    assert work.evaluated == 3 * 100 * 1.5  # after epochs 2, 4 and the last
    assert planned_work(load_experiment(REPO / "experiments/digits_vit.yaml", ["selection.preset=null",
        "selection.method=full"]), SAMPLES).limit == 0  # fmt: skip


def test_infobatch_sizes_come_from_a_teacher_on_random_losses():
    cfg = load_experiment(REPO / "experiments/digits_vit.yaml", ["selection.preset=null", "selection.method=infobatch"])
    work = planned_work(cfg, SAMPLES)
    assert work.estimated and work.trained < work.full
