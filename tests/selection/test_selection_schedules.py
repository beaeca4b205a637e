"""Ratio and interval schedules, progress, and the validated selection config with its presets."""

from __future__ import annotations

import math

import pytest
from attent.selection.config import METHOD_NAMES, PRESETS, IntervalConfig, RatioConfig, SelectionConfig
from attent.selection.plan import build_plan, training_progress
from attent.selection.schedules import IntervalSchedule, RatioSchedule, cosine, fixed, incremental
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

ratios = st.floats(1e-6, 1.0, allow_nan=False)
progress = st.floats(0.0, 1.0, allow_nan=False)


# --- ratio schedules ---------------------------------------------------------------------------
def test_defaults_are_twenty_to_eighty_percent():
    for schedule in (incremental(), cosine()):
        assert schedule(0.0) == pytest.approx(0.2)
        assert schedule(1.0) == pytest.approx(0.8)
    assert incremental(0.2, 0.8)(0.5) == pytest.approx(0.5)
    assert incremental()(0.25) == pytest.approx(0.35)


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
def test_fixed_is_constant(p):
    assert fixed(0.7)(p) == 0.7
    assert RatioSchedule()(p) == 0.2  # the dataclass default: fixed at r0 = 0.2


def test_cosine_formula():
    r0, r1 = 0.2, 0.8
    for p in (0.0, 0.25, 0.5, 0.75, 1.0):
        assert cosine()(p) == pytest.approx(r0 + (r1 - r0) * (1 - math.cos(math.pi * p)) / 2)
    assert cosine()(0.5) == pytest.approx(0.5)
    assert cosine()(0.25) == pytest.approx(0.2 + 0.6 * (1 - math.sqrt(0.5)) / 2)
    # cosine starts slower than linear and ends faster
    assert cosine()(0.25) < incremental()(0.25)
    assert cosine()(0.75) > incremental()(0.75)


@settings(deadline=None)
@given(r0=ratios, r1=ratios, p=progress, q=progress, kind=st.sampled_from(["incremental", "cosine"]))
def test_ratio_schedules_monotone_and_bounded(r0, r1, p, q, kind):
    s = RatioSchedule(kind, r0, r1)
    lo, hi = sorted((p, q))
    a, b = s(lo), s(hi)
    if r1 >= r0:
        assert a <= b + 1e-12
    else:
        assert a >= b - 1e-12
    for v in (a, b):
        assert min(r0, r1) - 1e-12 <= v <= max(r0, r1) + 1e-12
    assert s(0.0) == pytest.approx(r0) and s(1.0) == pytest.approx(r1)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kind="linear"),
        dict(kind="fixed", start=0.0),
        dict(kind="fixed", start=-0.1),
        dict(kind="fixed", start=1.5),
        dict(kind="fixed", start=float("nan")),
        dict(kind="incremental", start=0.2, end=0.0),
        dict(kind="cosine", start=0.2, end=1.5),
        dict(kind="cosine", start=0.2, end=float("nan")),
    ],
)
def test_ratio_schedule_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        RatioSchedule(**kwargs)


@pytest.mark.parametrize("p", [-0.01, 1.01, float("nan"), float("inf")])
def test_progress_outside_unit_interval_refused(p):
    with pytest.raises(ValueError):
        incremental()(p)
    with pytest.raises(ValueError):
        IntervalSchedule("incremental", 1, 4)(p)


# --- interval schedules ------------------------------------------------------------------------
def test_interval_incremental_endpoints_and_values():
    s = IntervalSchedule("incremental", 1, 4)
    assert s(0.0) == 1 and s(1.0) == 4
    assert [s(p / 10) for p in range(11)] == [1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4]
    assert IntervalSchedule("fixed", 3, 9)(0.9) == 3
    assert IntervalSchedule()(0.5) == 1


@settings(deadline=None)
@given(i0=st.integers(1, 20), imax=st.integers(1, 20), p=progress, q=progress)
def test_interval_incremental_monotone_integer(i0, imax, p, q):
    s = IntervalSchedule("incremental", i0, imax)
    lo, hi = sorted((p, q))
    a, b = s(lo), s(hi)
    assert isinstance(a, int) and isinstance(b, int)
    assert (a <= b) if imax >= i0 else (a >= b)
    assert min(i0, imax) <= a <= max(i0, imax)
    assert s(0.0) == i0 and s(1.0) == imax


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kind="cosine"),
        dict(kind="fixed", start=0),
        dict(kind="incremental", start=1, end=0),
        dict(kind="fixed", start=1.5),
        dict(kind="fixed", start=-2),
    ],
)
def test_interval_schedule_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        IntervalSchedule(**kwargs)


# --- progress ----------------------------------------------------------------------------------
def test_training_progress():
    assert training_progress(0, 10) == 0.0
    assert training_progress(9, 10) == pytest.approx(0.9)  # the last epoch starts at 90%
    assert training_progress(9, 10, 1.0) == 1.0  # and training ends at 1
    assert training_progress(3, 6, 0.5) == pytest.approx(3.5 / 6)
    assert training_progress(0, 1) == 0.0
    assert training_progress(20, 10) == 1.0  # past the end clamps
    assert [training_progress(e, 4) for e in range(4)] == [0.0, 0.25, 0.5, 0.75]


@given(total=st.integers(1, 1000), data=st.data())
@settings(deadline=None)
def test_training_progress_monotone_in_unit_interval(total, data):
    e1 = data.draw(st.integers(0, total - 1))
    e2 = data.draw(st.integers(e1, total - 1))
    assert 0.0 <= training_progress(e1, total) <= training_progress(e2, total) <= 1.0


# --- config ------------------------------------------------------------------------------------
def test_llm_preset():
    cfg = SelectionConfig(preset="llm")
    assert (cfg.method, cfg.strategy, cfg.warmup_epochs, cfg.rescore) == ("attent", "hard", 1, False)
    assert cfg.ratio_schedule == RatioSchedule("fixed", 0.7, 0.7)
    assert cfg.interval_schedule == IntervalSchedule("fixed", 1, 1)


def test_vit_preset():
    cfg = SelectionConfig(preset="vit")
    assert (cfg.method, cfg.strategy, cfg.warmup_epochs, cfg.rescore) == ("attent", "soft", 0, True)
    assert cfg.ratio_schedule == RatioSchedule("incremental", 0.2, 0.8)
    assert cfg.interval_schedule == IntervalSchedule("incremental", 1, 4)


def test_user_fields_override_preset():
    cfg = SelectionConfig(preset="vit", strategy="hard", ratio={"kind": "cosine"}, temperature=0.5)
    assert cfg.strategy == "hard" and cfg.temperature == 0.5 and cfg.rescore is True
    assert cfg.ratio_schedule == RatioSchedule("cosine", 0.2, 0.8)
    assert "Hard" in build_plan(cfg, 10).label and "cosine" in build_plan(cfg, 10).label


def test_presets_do_not_leak_between_configs():
    SelectionConfig(preset="vit", ratio={"kind": "fixed", "start": 0.3})
    assert SelectionConfig(preset="vit").ratio_schedule == RatioSchedule("incremental", 0.2, 0.8)
    assert PRESETS["vit"]["ratio"] == dict(kind="incremental", start=0.2, end=0.8)


def test_ratio_config_defaults():
    assert RatioConfig().build() == RatioSchedule("fixed", 1.0, 1.0)  # no schedule: all data
    # a bare incremental / cosine schedule is the paper's 20% -> 80%, never 100% -> 80%
    assert RatioConfig(kind="incremental").build() == RatioSchedule("incremental", 0.2, 0.8)
    assert RatioConfig(kind="cosine").build() == RatioSchedule("cosine", 0.2, 0.8)
    assert RatioConfig(kind="incremental", start=0.1, end=0.5).build() == RatioSchedule("incremental", 0.1, 0.5)
    assert RatioConfig(kind="fixed", start=0.4, end=0.9).build() == RatioSchedule("fixed", 0.4, 0.4)


def test_interval_config_defaults():
    assert IntervalConfig().build() == IntervalSchedule("fixed", 1, 1)
    assert IntervalConfig(kind="incremental", start=2).build() == IntervalSchedule("incremental", 2, 2)
    assert IntervalConfig(kind="incremental", start=1, end=4).build() == IntervalSchedule("incremental", 1, 4)


def test_labels():
    assert build_plan(SelectionConfig(method="full"), 3).label == "Full data"
    assert build_plan(SelectionConfig(method="infobatch"), 3).label.startswith("InfoBatch")
    assert build_plan(SelectionConfig(preset="vit"), 1000).label == "Soft · incremental(0.2→0.8) · incremental(1→4)"


def test_config_round_trips_through_dict():
    cfg = SelectionConfig(preset="vit", temperature=2.0)
    again = SelectionConfig(**cfg.model_dump())
    assert again == cfg and again.ratio_schedule == cfg.ratio_schedule


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(preset="bert"),
        dict(method="greedy"),
        dict(strategy="gumbel"),
        dict(ratio={"kind": "fixed", "start": 0.0}),
        dict(ratio={"kind": "fixed", "start": -0.1}),
        dict(ratio={"kind": "fixed", "start": 1.5}),
        dict(ratio={"kind": "fixed", "start": float("nan")}),
        dict(ratio={"kind": "incremental", "start": 0.2, "end": 1.5}),
        dict(ratio={"kind": "exponential"}),
        dict(interval={"kind": "fixed", "start": 0}),
        dict(interval={"kind": "incremental", "start": 1, "end": 0}),
        dict(temperature=0.0),
        dict(temperature=-1.0),
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),  # would only fail at the first soft selection
        dict(gradnorm_alpha=float("inf")),
        dict(method="group_weight"),
        dict(method="group_weight", group_weights=[]),
        dict(method="group_weight", group_weights=[1.0, -1.0]),
        dict(method="group_weight", group_weights=[0.0, 0.0]),
        dict(warmup_epochs=-1),
        dict(infobatch_prune=1.0),
        dict(infobatch_prune=-0.1),
        dict(gradnorm_step=0.0),
        dict(unknown_field=1),
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValidationError):
        SelectionConfig(**kwargs)


def test_validation_error_is_a_value_error():
    # callers catching ValueError see config errors too
    with pytest.raises(ValueError, match="unknown selection preset|preset"):
        SelectionConfig(preset="bert")


def test_method_names_match_config():
    for method in METHOD_NAMES:
        extra = {"group_weights": [1, 2, 2]} if method == "group_weight" else {}
        extra |= {"ratio": {"start": 0.5}} if method in ("attent", "class_weight") else {}
        assert SelectionConfig(method=method, **extra).method == method
