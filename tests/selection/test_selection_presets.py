"""Presets merge deeply with the user's nested fields: setting one field of a section the
preset fills keeps the preset's other fields of that section."""

from __future__ import annotations

import pytest
from attent.experiment.files import load_experiment
from attent.selection.config import PRESETS, SelectionConfig
from attent.selection.plan import build_plan

# (preset, section, field, a value different from the preset's)
NESTED_OVERRIDES = [
    (
        preset,
        section,
        field,
        {"kind": "cosine" if PRESETS[preset][section].get("kind") != "cosine" else "incremental", "start": 2, "end": 7}[
            field
        ]
        if section == "interval"
        else {"kind": "cosine", "start": 0.3, "end": 0.9}[field],
    )
    for preset in PRESETS
    for section, values in PRESETS[preset].items()
    if isinstance(values, dict)
    for field in ("start", "end")
    if not (section == "interval" and field == "kind")
]


@pytest.mark.parametrize("preset,section,field,value", NESTED_OVERRIDES)
def test_partial_nested_override_keeps_the_rest_of_the_preset(preset, section, field, value):
    cfg = SelectionConfig.model_validate({"preset": preset, section: {field: value}})
    got = getattr(cfg, section).model_dump()
    expected = {**PRESETS[preset][section], field: value}
    if expected["kind"] == "fixed":  # a fixed schedule has one value: end follows start
        expected["end"] = expected["start"]
    for key, want in expected.items():
        assert got[key] == pytest.approx(want), (preset, section, field, got)
    # the scalar fields of the preset survive too
    for key, want in PRESETS[preset].items():
        if not isinstance(want, dict):
            assert getattr(cfg, key) == want


def test_every_preset_section_is_covered():
    covered = {(p, s) for p, s, _, _ in NESTED_OVERRIDES}
    assert covered == {(p, s) for p in PRESETS for s, v in PRESETS[p].items() if isinstance(v, dict)}


@pytest.mark.parametrize(
    "override,label",
    [
        ("selection.ratio.end=0.9", "Soft · incremental(0.2→0.9) · incremental(1→4)"),
        ("selection.interval.end=10", "Soft · incremental(0.2→0.8) · incremental(1→10)"),
        ("selection.ratio.kind=cosine", "Soft · cosine(0.2→0.8) · incremental(1→4)"),
    ],
)
def test_cli_overrides_on_a_preset_file(override, label):
    # experiments/digits_vit.yaml sets `selection: {preset: vit}`
    cfg = load_experiment("experiments/digits_vit.yaml", [override])
    assert build_plan(cfg.selection, 1000).label == label


def test_a_fixed_ratio_over_a_preset_drops_the_presets_end():
    cfg = SelectionConfig.model_validate({"preset": "vit", "ratio": {"kind": "fixed", "start": 0.5}})
    assert cfg.ratio.end == 0.5 and build_plan(cfg, 10).label.startswith("Soft · fixed(0.5)")


@pytest.mark.parametrize(
    "settings", [{}, {"strategy": "soft"}, {"strategy": "hard", "rescore": True}, {"method": "class_weight"}]
)
def test_a_selection_without_a_ratio_is_refused_naming_the_fix(settings):
    """Without a ratio (1.0 by default) such a selection would select every sample, paying for a
    scoring pass where it reads scores (on 9171ffd: SelectionConfig() was Hard at 100 %, silently)."""
    with pytest.raises(ValueError, match=r"without a ratio would select every sample.*set a ratio.*preset") as err:
        SelectionConfig(**settings)
    assert "\n" not in str(err.value).split("\n  Value error, ")[-1].split(" [type=")[0]


def test_an_explicit_ratio_of_one_is_the_papers_100_percent_row():
    cfg = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 1.0}, rescore=True)
    assert build_plan(cfg, 3).mean_ratio() == 1.0 and all(p.scoring == "rescore" for p in build_plan(cfg, 3))
    assert SelectionConfig(method="full").method == "full"  # full data needs no ratio
