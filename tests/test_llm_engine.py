"""A short real SmolLM2-135M LoRA run through the Ray Train engine and MLflow."""
from __future__ import annotations

import mlflow
import pytest

from attent.config import build_experiment
from attent.engine.launch import train
from conftest import SHARED

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (SHARED / "datasets/gsm8k/train.jsonl").exists(), reason="needs ../shared/datasets")]


def test_smollm2_lora_run_with_llm_preset(ray_cluster, tmp_path, mlflow_uri):
    cfg = build_experiment({
        "name": "smollm2-tiny", "seed": 0,
        "task": {"name": "llm", "model": "smollm2-135m-instruct", "lora_r": 4, "dataset": "gsm8k",
                 "data_dir": str(SHARED / "datasets"), "train_limit": 20, "max_length": 160,
                 "eval": {"benchmarks": ["gsm8k"], "eval_limit": 2, "max_new_tokens": 24, "eval_batch_size": 2}},
        "train": {"epochs": 2, "batch_size": 4, "global_batch_size": 8, "lr": 2e-4, "eval_every": 2},
        "selection": {"preset": "llm"},
        "ray": {"num_workers": 1, "storage_path": str(tmp_path / "ray_results")},
        "mlflow": {"tracking_uri": mlflow_uri, "experiment": "llm-engine-test"},
    })
    result = train(cfg)

    client = mlflow.MlflowClient(mlflow_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["attent.task"] == "llm" and run.data.tags["attent.strategy"] == "hard"
    m = run.data.metrics
    assert 0.0 <= m["eval_gsm8k_accuracy"] <= 1.0
    ratios = sorted(client.get_metric_history(result.run_id, "selected_ratio"), key=lambda x: x.step)
    assert [r.value for r in ratios] == [1.0, 0.7]           # all data, then the 70% highest-loss
    assert m["samples_backpropagated"] == 20 + 14            # no scoring pass in the LLM variant
    assert m["samples_forwarded"] == m["samples_backpropagated"]
    assert m["grad_accumulation"] == 2                       # global batch 8 = 4 per step x 2
    # checkpoints hold the LoRA adapters, not the frozen 135M base
    ckpt = next((tmp_path / "ray_results" / "smollm2-tiny").glob("checkpoint_*/state.pt"))
    assert ckpt.stat().st_size < 20 * 2**20
