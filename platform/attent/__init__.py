"""AtteNT experiment platform, and its selection library under one import.

    import attent
    selector = attent.Selector(dataset, selection=attent.SelectionConfig(preset="vit"), epochs=E, seed=0)

Public names, each imported on first access (PEP 562), so that ``import attent`` and
``attent validate`` stay free of torch:

    Selector         attent.integrations.pytorch  — a plain PyTorch loop in three lines
    SelectionConfig  attent.selection.config      — the ``selection:`` settings and presets
    select           attent.selection.strategies  — k of N by hard / soft / random, a pure function
    Teacher          attent.selection.teacher     — the score table behind Selector
    SubsetSampler    attent.selection.sampler     — a rank's shard of the teacher's subset
    AtteNTTrainer    attent.integrations.huggingface      — Hugging Face's Trainer, drop-in
    AtteNTSFTTrainer attent.integrations.huggingface_trl  — TRL's SFTTrainer (extra ``hf``)
    AtteNTCallback   attent.integrations.lightning        — a Lightning callback (extra ``lightning``)

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
    "AtteNTTrainer": "attent.integrations.huggingface",
    "AtteNTSFTTrainer": "attent.integrations.huggingface_trl",
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
