"""The one import: ``import attent`` stays free of torch until a name that needs it is first reached,
and its public names are the objects of the modules that define them."""

from __future__ import annotations

import os
import subprocess
import sys

import attent
import pytest

from tests.helpers.paths import REPO


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'platform'}{os.pathsep}{REPO}"},
    )


def test_import_attent_is_torch_free_and_selector_imports_torch_on_first_access():
    probe = (
        "import sys, attent; before = 'torch' in sys.modules; "
        "config = attent.SelectionConfig(preset='vit'); mid = 'torch' in sys.modules; "
        "attent.Selector; print(before, mid, 'torch' in sys.modules)"
    )
    result = _python(probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "True"]


def test_public_names():
    from attent.selection.selector import Selector as selector_class
    from attent.selection.strategies import select

    assert attent.Selector is selector_class and attent.select is select
    assert {"Selector", "SelectionConfig", "select"} <= set(dir(attent))
    assert {"AtteNTTrainer", "AtteNTSFTTrainer", "AtteNTCallback"} <= set(dir(attent))
    with pytest.raises(AttributeError):
        _ = attent.AtteNTKerasCallback  # no such name
