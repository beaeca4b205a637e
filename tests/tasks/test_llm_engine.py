"""A short real SmolLM2-135M LoRA run through the Ray Train engine and MLflow: the reference LLM
run (``shared_runs``: 12 GSM8K examples, AtteNT's LLM variant, 2 epochs)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from tests.helpers.paths import SHARED

pytestmark = [
    pytest.mark.skipif(not (SHARED / "datasets/gsm8k/train.jsonl").exists(), reason="needs ../shared/datasets")
]


def test_smollm2_lora_run_with_llm_preset(reference_runs):
    trained = reference_runs("llm")
    client = mlflow.MlflowClient(trained.tracking_uri)
    run = client.get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["attent.task"] == "llm" and run.data.tags["attent.strategy"] == "hard"
    m = run.data.metrics
    assert 0.0 <= m["eval_gsm8k_accuracy"] <= 1.0 and m["eval_gsm8k_test_response_loss"] > 0
    ratios = sorted(client.get_metric_history(trained.run_id, "selected_ratio"), key=lambda x: x.step)
    assert [r.value for r in ratios] == pytest.approx([1.0, 8 / 12])  # all data, then the 70% highest-loss
    assert m["samples_backpropagated"] == 12 + 8  # no scoring pass in the LLM variant
    assert m["samples_forwarded"] == m["samples_backpropagated"]
    assert m["grad_accumulation"] == 2  # global batch 8 = 4 per step x 2
    # checkpoints hold the LoRA adapters, not the frozen 135M base
    storage = trained.cfg.ray.storage_path
    ckpt = next(Path(storage, trained.cfg.name).glob("checkpoint_*/state.pt"))
    assert ckpt.stat().st_size < 20 * 2**20
