"""The system tier is this folder: every test under it is marked ``system`` here (``make test`` runs
``-m "not system"``, ``make test-all`` everything), so no test in it carries the mark itself."""

from __future__ import annotations

from pathlib import Path

import pytest

SYSTEM = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks (the hook sees the whole session's items)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SYSTEM in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.system)
