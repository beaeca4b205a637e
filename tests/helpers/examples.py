"""The scripts of examples/ run from their command line, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from attent.selection.config import SelectionConfig
from attent.selection.plan import build_plan
from attent.selection.schedules import budget

from tests.helpers.paths import REPO


def assert_example_follows_the_vit_preset(script: str, *args: str, epochs: int = 4, limit: int = 240) -> None:
    """``examples/<script>`` trains ``limit`` digits for ``epochs`` epochs, printing a JSON row per
    epoch: its loss falls, its OneCycle schedule runs out exactly, its subsets follow the ``vit``
    preset's planned ratios."""
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), "--epochs", str(epochs), "--limit", str(limit), *args],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'platform'}{os.pathsep}{REPO}"},
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == epochs
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert rows[-1]["steps"] == rows[-1]["planned_steps"]  # the OneCycle schedule ran out exactly
    plan = dict(build_plan(SelectionConfig(preset="vit"), epochs).ratios())
    sizes, size = [], limit
    for epoch in range(epochs):
        size = budget(limit, plan[epoch]) if epoch in plan else size
        sizes.append(size)
    assert [row["selected"] for row in rows] == sizes
