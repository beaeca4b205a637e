"""A run's planned work is that of the run's own Selector on random losses: its trained
sample-epochs are the plan's subset sizes wherever the plan sets every ratio, its scored ones
follow the scoring policy, and above ``RUN_AT_MOST`` samples the counts are a smaller run's, scaled."""

from __future__ import annotations

import pytest
from attent.cost import work as cost_work
from attent.cost.work import planned_work
from attent.experiment.files import load_experiment
from attent.selection.plan import RESCORE

from tests.helpers.paths import REPO

SAMPLES = 1000
EXPERIMENT = REPO / "experiments/digits_vit.yaml"
STALE = ["selection.rescore_stale=true", "train.epochs=12"]
FRACTION = ["selection.rescore_fraction=0.3", "train.epochs=12"]


def rescoring_passes(cfg) -> int:
    return sum(planned.scoring == RESCORE for planned in cfg.plan)


@pytest.mark.parametrize(
    "overrides, scored",
    [
        ([], "every pass"),  # the ViT variant: a scoring pass of every sample before every re-selection
        (STALE, "stale"),  # a pass of the samples not trained on since the last re-selection
        (FRACTION, "fraction"),  # the first pass of all samples, then 30 % of them
        (["selection.strategy=random"], 0),  # reads no scores: no pass
        (["selection.preset=llm", "train.epochs=5"], 0),  # training forwards' losses only
        (["train.epochs=30", "selection.interval={kind: cycles, cycles: 4, start: 1, end: 2}"], "every pass"),
        (["train.epochs=30", "selection.interval={kind: cycles, cycles: 4, start: 1}", "selection.scores=training"], 0),
        (["selection.preset=null", "selection.method=full"], 0),
    ],
)
def test_the_planned_work_is_the_plans_subset_sizes_and_the_policys_passes(overrides, scored):
    cfg = load_experiment(EXPERIMENT, overrides)
    plan = cfg.plan
    assert all(planned.ratio is not None for planned in plan)  # every planned ratio set: sizes known
    work = planned_work(cfg, SAMPLES)
    assert work.trained == sum(plan.subset_sizes(SAMPLES))
    assert not work.estimated and work.scaled_from is None and work.samples == SAMPLES
    assert work.full == cfg.train.epochs * SAMPLES
    passes = rescoring_passes(cfg)
    if scored == "every pass":
        assert passes > 0 and work.scored == passes * SAMPLES
    elif scored == "fraction":  # nothing scored before the first pass: all of them there
        assert work.scored == SAMPLES + (passes - 1) * round(0.3 * SAMPLES)
    elif scored == "stale":  # the subset just trained on keeps its losses
        assert SAMPLES < work.scored < passes * SAMPLES
    else:
        assert work.scored == scored


def test_the_limit_is_the_back_propagated_and_a_third_of_the_scored_against_full_data():
    cfg = load_experiment(EXPERIMENT, ["train.eval_every=2", "train.epochs=5"])
    work = planned_work(cfg, SAMPLES, eval_samples=100, eval_forwards=1.5)
    assert 0 < work.limit < 1
    assert work.limit == pytest.approx(1 - (work.trained + work.scored / 3) / (5 * SAMPLES))
    assert work.evaluated == 3 * 100 * 1.5  # after epochs 2, 4 and the last
    full = planned_work(load_experiment(EXPERIMENT, ["selection.preset=null", "selection.method=full"]), SAMPLES)
    assert full.limit == 0 and full.trained == full.full == 16 * SAMPLES and full.scored == 0


def test_infobatch_sizes_come_from_a_selector_on_random_losses():
    cfg = load_experiment(EXPERIMENT, ["selection.preset=null", "selection.method=infobatch"])
    assert any(planned.ratio is None for planned in cfg.plan)  # the losses decide the sizes
    work = planned_work(cfg, SAMPLES)
    assert work.estimated and work.trained < work.full
    assert work.full == cfg.train.epochs * SAMPLES


@pytest.mark.parametrize(
    "overrides",
    [[], ["selection.preset=llm", "train.epochs=5"], FRACTION, ["selection.preset=null", "selection.method=infobatch"]],
)
def test_above_run_at_most_the_counts_are_scaled_and_near_the_exact_ones(monkeypatch, overrides):
    cfg = load_experiment(EXPERIMENT, overrides)
    samples, at_most = 2000, 500
    monkeypatch.setattr(cost_work, "RUN_AT_MOST", 10 * samples)
    exact = planned_work(cfg, samples)
    assert exact.scaled_from is None
    monkeypatch.setattr(cost_work, "RUN_AT_MOST", at_most)
    scaled = planned_work(cfg, samples)
    assert scaled.scaled_from == at_most and scaled.samples == samples
    assert scaled.full == exact.full == cfg.train.epochs * samples
    # run on 500 samples and scaled by 4: each epoch's subset within samples / RUN_AT_MOST of the exact one's
    tolerance = cfg.train.epochs * samples / at_most
    if exact.estimated:  # InfoBatch: sizes drawn from random losses, on either set
        assert scaled.estimated and abs(scaled.trained - exact.trained) < 0.05 * exact.trained
    else:
        assert abs(scaled.trained - exact.trained) <= tolerance
        assert abs(scaled.scored - exact.scored) <= tolerance
    assert scaled.trained % (samples // at_most) == 0  # the smaller run's counts times 4
