"""AtteNT experiment platform, and its selection library under one import.

    import attent
    selector = attent.Selector(dataset, attent.SelectionConfig(preset="vit"), epochs=E, seed=0)

Public names, each imported on first access (PEP 562), so that ``import attent`` and
``attent validate`` stay free of torch:

    Selector         attent.integrations.pytorch  — a plain PyTorch loop in three lines
    AtteNTCallback   attent.integrations.lightning — a Lightning Trainer callback (extra `lightning`)
    SelectionConfig  attent.selection.config      — the ``selection:`` settings and presets
    select           attent.selection.strategies  — k of N by hard / soft / random, a pure function
    Teacher          attent.selection.teacher     — the score table behind Selector
    SubsetSampler    attent.selection.sampler     — a rank's shard of the teacher's subset

Planned (issue 28), not exported until it exists: ``AtteNTTrainer`` (Hugging Face Trainer and
TRL).
"""
from __future__ import annotations

import importlib

# public name -> the module that defines it
_EXPORTS = {
    "Selector": "attent.integrations.pytorch",
    "AtteNTCallback": "attent.integrations.lightning",
    "SelectionConfig": "attent.selection.config",
    "select": "attent.selection.strategies",
    "Teacher": "attent.selection.teacher",
    "SubsetSampler": "attent.selection.sampler",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attent' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
