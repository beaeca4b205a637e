"""The plan (attent.selection.plan): every epoch of a run decided once, in each reading of
"interval", and the only place the schedules are walked; what the Selector does is what it says."""

from __future__ import annotations

import ast
import math
from fractions import Fraction

import pytest
import torch
from attent.selection.config import SelectionConfig
from attent.selection.plan import NO_PASS, RESCORE, UNSCORED, build_plan
from attent.selection.selector import Selector

from tests.helpers.paths import REPO

INC = {"kind": "incremental", "start": 0.2, "end": 0.8}
CYCLES = {"kind": "cycles", "cycles": 3, "start": 1, "end": 2}
CONFIGS = {
    "vit": dict(preset="vit"),
    "llm": dict(preset="llm"),
    "cycles-soft": dict(strategy="soft", ratio=INC, rescore=True, interval=CYCLES),
    "cycles-free": dict(strategy="soft", ratio=INC, rescore=True, scores="training", interval=CYCLES),
    "random": dict(strategy="random", ratio=INC, interval={"kind": "fixed", "start": 2}),
    "anneal": dict(strategy="hard", ratio=INC, rescore=True, anneal=0.25),
    "infobatch": dict(method="infobatch", infobatch_final=0.25),
    "gradnorm": dict(method="gradnorm", ratio=INC),
    "full": dict(method="full"),
}


def test_the_progress_reading():
    plan = build_plan(SelectionConfig(preset="vit"), 8)
    # a pick at epoch e kept I(e/8) = round(1 + 3 e / 8) epochs (1, 1, 2, 2, 3), at ratio 0.2 + 0.6 e / 8
    assert [p.epoch for p in plan if p.selects] == [0, 1, 2, 4, 6]
    assert [p.ratio for p in plan] == pytest.approx([0.2, 0.275, 0.35, 0.35, 0.5, 0.5, 0.65, 0.65])
    assert [p.scoring for p in plan] == [RESCORE, RESCORE, RESCORE, NO_PASS, RESCORE, NO_PASS, RESCORE, NO_PASS]
    llm = build_plan(SelectionConfig(preset="llm"), 4)
    # a warm-up epoch on all data, then a pick every epoch from the training forwards' losses
    assert [(p.ratio, p.selects, p.scoring) for p in llm] == [(1.0, False, NO_PASS)] + [(0.7, True, UNSCORED)] * 3
    assert llm[0].all_data and not llm[1].all_data


def test_the_cycles_reading_and_infobatch():
    plan = build_plan(SelectionConfig(**CONFIGS["cycles-soft"]), 10)
    # 1 warm-up, 3 cycles of 3 epochs with 1, 1, 2 subset epochs (Soft re-draws at each)
    assert [(p.epoch, p.selects, p.cycle) for p in plan if p.selects] == [
        (1, True, 0),
        (4, True, 1),
        (7, True, 2),
        (8, True, 2),
    ]
    assert [p.ratio for p in plan if p.selects] == pytest.approx([0.2, 0.5, 0.8, 0.8])
    assert sum(p.all_data for p in plan) == 6
    infobatch = build_plan(SelectionConfig(**CONFIGS["infobatch"]), 8)
    assert [(p.ratio, p.selects) for p in infobatch] == [(None, True)] * 6 + [(1.0, False)] * 2
    with pytest.raises(ValueError, match="InfoBatch's subset sizes depend on the losses"):
        infobatch.mean_ratio()
    assert infobatch.ratio_reached() == 1.0


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("epochs", [7, 10])
def test_the_selector_does_what_the_plan_says(name, epochs):
    """Each epoch: a pick exactly where the plan has one (at its ratio), all data where it trains on
    all, a scoring pass only where it plans one."""
    cfg = SelectionConfig(**CONFIGS[name])
    plan = build_plan(cfg, epochs)
    selector = Selector(range(50), selection=cfg, epochs=epochs, seed=1, groups=torch.arange(50) % 3)
    for planned in plan:
        passes = []

        def score_fn(indices, passes=passes, epoch=planned.epoch):
            passes.append(indices.numel())
            yield indices, torch.rand(indices.numel(), generator=torch.Generator().manual_seed(epoch))

        picks, unscored = len(selector.history), bool(torch.isnan(selector.scores).any())
        subset = selector.begin_epoch(planned.epoch, score_fn)
        assert bool(passes) == (planned.scoring == RESCORE or (planned.scoring == UNSCORED and unscored))
        if planned.selects:
            assert len(selector.history) == picks + 1 and selector.history[-1].epoch == planned.epoch
            if planned.ratio is not None:
                assert subset.numel() == max(1, round(planned.ratio * 50))
        elif planned.all_data:
            assert subset.numel() == 50
        selector.update(torch.rand(subset.numel(), generator=torch.Generator().manual_seed(99 + planned.epoch)), subset)
        selector.end_epoch()


def test_sizes_batches_steps_and_the_budget():
    cfg = SelectionConfig(preset="vit")
    plan = build_plan(cfg, 6)
    sizes = plan.subset_sizes(103)
    assert sizes == [21, 31, 31, 52, 52, 72]
    assert plan.batches(103, 8) == [math.ceil(s / 8) for s in sizes]
    assert plan.batches(103, 8, 2, drop_last=True) == [math.ceil(s / 2) // 8 for s in sizes]
    assert plan.steps(plan.batches(103, 8), 3) == [math.ceil(math.ceil(s / 8) / 3) for s in sizes]
    assert plan.mean_ratio() == pytest.approx(sum(p.ratio for p in plan) / 6)
    summary = plan.summary()
    assert summary["label"] == plan.label and summary["reselections"] == 4 and len(summary["plan"]) == 6


def test_step_progress_is_the_identity_on_equal_epochs_and_the_epoch_clock_otherwise():
    full = build_plan(SelectionConfig(method="full"), 4)
    at = full.step_progress([5, 5, 5, 5])
    assert [at(s) for s in range(21)] == list(range(21)) and all(at(s).denominator == 1 for s in range(21))
    plan = build_plan(SelectionConfig(preset="vit"), 4)
    steps = [2, 4, 4, 6]  # a run of 16 steps: epoch e ends at the schedule's step 16 (e + 1) / 4
    at = plan.step_progress(steps)
    assert [at(s) for s in (0, 2, 6, 10, 16)] == [0, 4, 8, 12, 16]
    assert at(1) == 2 and at(3) == 5 and at(13) == Fraction(14)
    # cut at step 13 (max_steps): the cut end is the schedule's end
    cut = plan.step_progress(steps, total=13)
    assert cut(13) == 13 and cut(10) == Fraction(13 * 3) / Fraction(7, 2)  # 3 of 3.5 epochs


def test_a_run_within_its_warm_up_trains_on_all_data():
    plan = build_plan(SelectionConfig(preset="llm"), 1)  # its warm-up epoch is the whole run
    assert [p.all_data for p in plan] == [True] and plan.summary()["reselections"] == 0


# The walks of the schedules: reading a ratio or an interval at a progress, laying out cycles
SCHEDULE_WALKS = {"ratio_schedule", "interval_schedule", "subset_epochs", "bounds", "cycle_plan", "progress_plan"}


def test_the_schedules_are_walked_in_the_plan_alone():
    """grep's check, by the syntax tree: a call of a schedule (``selection.ratio_schedule(p)``,
    ``interval_of(p)``, a cycle's subset epochs or bounds, the plan's own walks) appears in
    attent/selection/plan.py only; everything else reads the plan."""
    found = []
    for root in (REPO / "platform" / "attent", REPO / "analysis"):
        for path in root.rglob("*.py"):
            if path == REPO / "platform/attent/selection/plan.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in SCHEDULE_WALKS:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {name}")
    assert found == []
