"""Fixed-seed reference runs through the whole engine (Ray Train, MLflow), recorded once in
``tests/reference_runs.json``: digits with 2 workers for 4 epochs under AtteNT soft, InfoBatch
and full data, and one epoch of the LLM task. A change that claims to change no behaviour must
reproduce every recorded per-epoch number: bit for bit where the same CPU kernels run (the
recording notes torch's CPU capability), to 1e-5 elsewhere.

Re-record (only for a change that means to change the numbers, saying so in its commit):
``ATTENT_RECORD_REFERENCE=1 pytest tests/test_reference_runs.py``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import pytest
import torch

from attent.config import build_experiment, deep_merge
from conftest import SHARED

pytestmark = pytest.mark.slow

RECORD = Path(__file__).with_name("reference_runs.json")
RECORDING = os.environ.get("ATTENT_RECORD_REFERENCE") == "1"

DIGITS = {
    "seed": 5,
    "task": {"name": "vision", "dataset": "digits", "img_size": 8,
             "model": {"preset": "vit_tiny_cpu", "patch_size": 2}},
    "train": {"epochs": 4, "batch_size": 32},
    "ray": {"num_workers": 2},
}
RUNS = {
    "digits-soft": deep_merge(DIGITS, {"selection": {"preset": "vit"}}),
    "digits-infobatch": deep_merge(DIGITS, {"selection": {"method": "infobatch"}}),
    "digits-full": deep_merge(DIGITS, {"selection": {"method": "full"}}),
    "llm-one-epoch": {
        "seed": 0,
        "task": {"name": "llm", "model": "smollm2-135m-instruct", "lora_r": 4, "dataset": "gsm8k",
                 "data_dir": str(SHARED / "datasets"), "train_limit": 12, "max_length": 128,
                 "eval": {"benchmarks": ["gsm8k_loss"], "response_loss_limit": 6}},
        "train": {"epochs": 1, "batch_size": 4, "global_batch_size": 8, "lr": 2e-4},
        # no warm-up epoch: the one epoch scores every example, then trains on the hardest 70 %
        "selection": {"preset": "llm", "warmup_epochs": 0},
        "ray": {"num_workers": 1},
    },
}
# Per-epoch values that depend on wall-clock time (or on where the run was written) are not compared.
TIMED = ("time_",)


def cpu_kernels() -> str:
    return f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}"


def run_reference(name: str, tmp_path: Path, mlflow_uri: str) -> dict:
    from attent.engine.launch import train
    cfg = build_experiment({"name": name, **RUNS[name],
                            "ray": {**RUNS[name]["ray"], "storage_path": str(tmp_path / "ray_results")},
                            "mlflow": {"tracking_uri": mlflow_uri, "experiment": "reference"}})
    result = train(cfg)
    client = mlflow.MlflowClient(mlflow_uri)
    rows = json.loads(Path(client.download_artifacts(result.run_id, "epoch_history.json", str(tmp_path))).read_text())
    selections = json.loads(Path(client.download_artifacts(result.run_id, "selection_history.json",
                                                          str(tmp_path))).read_text())["selections"]
    return {"epochs": [{k: v for k, v in row.items() if not k.startswith(TIMED)} for row in rows],
            "subsets": [s["indices"] for s in selections]}


@pytest.mark.parametrize("name", list(RUNS))
def test_reference_run_reproduces_its_record(name, ray_cluster, tmp_path, mlflow_uri):
    if name.startswith("llm") and not (SHARED / "datasets/gsm8k/train.jsonl").exists():
        pytest.skip("needs ../shared/datasets")
    got = run_reference(name, tmp_path, mlflow_uri)
    if RECORDING:
        record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        record[name] = {"recorded_with": cpu_kernels(), **got}
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return
    expected = json.loads(RECORD.read_text())[name]
    assert got["subsets"] == expected["subsets"]  # the same samples chosen at every re-selection
    assert [sorted(row) for row in got["epochs"]] == [sorted(row) for row in expected["epochs"]]
    exact = expected["recorded_with"] == cpu_kernels()
    for epoch, (row, want) in enumerate(zip(got["epochs"], expected["epochs"])):
        for key, value in want.items():
            if exact:
                assert row[key] == value, (epoch, key)
            else:
                assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (epoch, key)
