"""The repository's paths as the tests reach them: the clone (``REPO``), the tests' own folder and data
(``TESTS``: ``reference_runs.json``, ``reference_drift.json``, ``fixtures/``, ``results/``), the offline data
beside the clone (``SHARED``, ``DATASETS``) and the venv's commands (``BIN``)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SHARED = REPO.parent / "shared"
DATASETS = SHARED / "datasets"
FIXTURES = TESTS / "fixtures"
BIN = Path(sys.executable).parent
