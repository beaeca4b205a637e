"""AtteNT experiment platform, and its selection library under one import.

    import attent
    selector = attent.Selector(dataset, selection=attent.SelectionConfig(preset="vit"), epochs=E, seed=0)

Public names, each imported on first access (PEP 562), so that ``import attent`` and
``attent validate`` stay free of torch:

    Selector         attent.selection.selector    — AtteNT in a plain PyTorch loop
    SelectionConfig  attent.selection.config      — the ``selection:`` settings and presets
    build_plan       attent.selection.plan        — every epoch of a run, decided before it starts
    select           attent.selection.strategies  — k of N by hard / soft / random, a pure function
    SubsetSampler    attent.selection.sampler     — a rank's shard of the Selector's subset
    StreamSelector   attent.selection.stream      — AtteNT on a stream: B picked from each pool
    AtteNTTrainer    attent.integrations.huggingface      — Hugging Face's Trainer, drop-in
    AtteNTSFTTrainer attent.integrations.huggingface_trl  — TRL's SFTTrainer (extra ``hf``)
    AtteNTCallback   attent.integrations.lightning        — a Lightning callback (extra ``lightning``)
    AtteNTStreamCallback  attent.integrations.lightning_stream  — the same on a stream (extra ``lightning``)

"""

from __future__ import annotations

import importlib
import os
import sys

# public name -> the module that defines it
_EXPORTS = {
    "Selector": "attent.selection.selector",
    "build_plan": "attent.selection.plan",
    "AtteNTCallback": "attent.integrations.lightning",
    "AtteNTStreamCallback": "attent.integrations.lightning_stream",
    "SelectionConfig": "attent.selection.config",
    "select": "attent.selection.strategies",
    "SubsetSampler": "attent.selection.sampler",
    "StreamSelector": "attent.selection.stream",
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


# The report's code is analysis/ at the repository's top level, where a reader looks for how the
# paper's tables and the time-to-accuracy verdicts are built; a wheel installs it as attent/analysis
# and an editable install maps it there (pyproject.toml). Run from a checkout alone
# (PYTHONPATH=platform, as on a bare GPU node), this finder maps it the same way.
class _CheckoutAnalysis:
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "analysis")

    @classmethod
    def find_spec(cls, fullname: str, path=None, target=None):
        if fullname != "attent.analysis":
            return None
        from importlib.util import spec_from_file_location

        return spec_from_file_location(
            fullname, os.path.join(cls.folder, "__init__.py"), submodule_search_locations=[cls.folder]
        )


if not os.path.isdir(os.path.join(__path__[0], "analysis")) and os.path.isfile(
    os.path.join(_CheckoutAnalysis.folder, "__init__.py")
):
    sys.meta_path.append(_CheckoutAnalysis)
