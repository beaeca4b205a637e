"""The two-rank reference runs beyond the one `make test` trains (``shared_runs``: digits with 2 workers for 4
epochs under InfoBatch and full data) reproduce their record, as tests/engine/test_reference_runs.py checks the
others. ``ATTENT_RECORD_REFERENCE=1`` records them instead."""

from __future__ import annotations

import pytest

from tests.engine.test_reference_runs import SYSTEM_TIER, reproduces_its_record


@pytest.mark.parametrize("name", SYSTEM_TIER)
def test_reference_run_reproduces_its_record(name, reference_runs):
    reproduces_its_record(name, reference_runs)
