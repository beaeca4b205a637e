"""AtteNT sample selection: pure selection functions, schedules, the teacher, and its sampler.

    teacher = Teacher(len(train_set), SelectionConfig(preset="vit"), total_epochs=E, seed=0)
    loader = DataLoader(train_set, sampler=SubsetSampler(teacher, rank, world_size), ...)
    for epoch in range(E):
        teacher.begin_epoch(epoch, score_fn)       # may score everything and re-select
        for batch in loader:
            losses = per_sample_loss(model, batch)  # FloatTensor[B]
            teacher.observe(batch["index"], losses)
            (losses * teacher.loss_weights[batch["index"]]).mean().backward()
        teacher.end_epoch()
"""
from __future__ import annotations

import importlib

# Names resolved on first use: `attent validate` reads configs (pydantic only) without paying
# for torch, which the selection functions, the teacher and the sampler need.
_EXPORTS = {
    "config": ("METHODS", "PRESETS", "IntervalConfig", "RatioConfig", "SelectionConfig"),
    "core": ("STRATEGIES", "budget", "select", "weighted_sample"),
    "sampler": ("SubsetSampler", "shard_indices"),
    "schedules": ("IntervalSchedule", "RatioSchedule", "check_ratio", "cosine", "fixed", "incremental",
                  "training_progress"),
    "teacher": ("SelectionRecord", "Teacher"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
