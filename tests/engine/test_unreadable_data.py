"""Unreadable data files, a fault of a user's data (the other faults: test_faults.py): ``attent
validate --decode`` names every one, and training stops in one line that names the file, without
restarting the run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from attent.cli.main import main as attent_main

from tests.engine.test_faults import runs_named
from tests.helpers.paths import BIN


@pytest.fixture(scope="module")
def broken_scenes(tmp_path_factory) -> tuple[Path, Path]:
    from attent.tasks.mae import scenes

    root = tmp_path_factory.mktemp("broken-scenes")
    scenes.write_dataset(root, train=30, test=10, size=16, seed=0, workers=1)
    victim = sorted((root / "train" / "depth").rglob("*.png"))[3]
    victim.write_bytes(os.urandom(300))
    return root, victim


def multimae_file(tmp_path: Path, root: Path, uri: str) -> Path:
    path = tmp_path / "mm.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "broken-data",
                "task": {
                    "name": "multimae",
                    "data_path": str(root),
                    "img_size": 16,
                    "model": {"preset": "vit_tiny_cpu", "decoder_dim": 32},
                },
                "train": {"epochs": 1, "batch_size": 16},
                "selection": {"method": "full"},
                "ray": {"num_workers": 0, "max_failures": 2, "storage_path": str(tmp_path / "ray_results")},
                "mlflow": {"tracking_uri": uri, "experiment": "faults"},
            }
        )
    )
    return path


def test_validate_decode_names_every_unreadable_file(broken_scenes, tmp_path, mlflow_uri, capsys):
    root, victim = broken_scenes
    path = multimae_file(tmp_path, root, mlflow_uri)
    assert attent_main(["validate", str(path)]) == 0  # folders alone look fine
    capsys.readouterr()
    assert attent_main(["validate", str(path), "--decode"]) == 2
    err = capsys.readouterr().err
    assert "decoded 120/120 files, 1 unreadable" in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("attent validate: error: 1 of 120 data files cannot be read") and str(victim) in line


def test_an_unreadable_file_in_training_is_named_once_not_retried(broken_scenes, tmp_path, mlflow_uri):
    """In Ray Train's local mode, ray.max_failures 2: the engine's restart loop gives up at once
    (Ray Train's restarts stopping on the worker's note: the unreadable checkpoints in test_faults)."""
    root, victim = broken_scenes
    path = multimae_file(tmp_path, root, mlflow_uri)
    proc = subprocess.run([str(BIN / "attent"), "train", str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("attent train: error: ") and str(victim) in line and "--decode" in line
    assert "Traceback" not in proc.stderr.split("attent train: error:")[-1]
    client, runs = runs_named(mlflow_uri, "broken-data")
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    # not restarted (each restart is a line on screen even when quiet), the file named once
    assert "restarting from its latest checkpoint" not in proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).count("cannot read this depth image") == 1
