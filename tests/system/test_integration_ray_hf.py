"""AtteNTTrainer under Ray Train (issue 28, item 4): examples/ray_hf_trainer.py submitted with `ray job submit` as
docs/integrations/huggingface.md shows, on two Ray Train workers that choose the same subsets and split them (what
Ray's ``prepare_trainer`` does to an AtteNTTrainer: tests/integrations/test_integration_ray_hf.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time

import pytest
import torch
from attent.selection.strategies import subset_checksum

from tests.helpers.hf_tiny import GSM8K
from tests.helpers.paths import BIN, REPO


@pytest.mark.timeout(900)
@pytest.mark.skipif(not GSM8K.exists(), reason=f"{GSM8K} not present")
def test_ray_job_submit_runs_the_example_on_two_agreeing_workers(ray_cluster, tmp_path, mlflow_uri):
    """docs/integrations/huggingface.md, *Under Ray Train*: the example, submitted from the repository root with
    RAY_AUTH_MODE=token exported to a Ray started from the venv, trains SmolLM2 with LoRA on two
    workers. Both choose the same subset each epoch (all 6 problems, then the 4 of highest loss)
    and train on disjoint halves of it, through Ray's prepare_trainer; rank 0's MLflow run holds the
    selection and the training loss; Ray's checkpoint holds the adapter and both ranks' selection."""
    from mlflow.tracking import MlflowClient

    out = tmp_path / "out"
    proc = submit_the_example(ray_cluster["dashboard"], out, tmp_path / "ray_results", mlflow_uri)
    assert proc.returncode == 0 and "succeeded" in proc.stdout.lower(), proc.stdout[-4000:] + proc.stderr[-3000:]
    [result] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"checkpoint"')]

    ranks = [json.loads((out / f"rank{r}" / "selection.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    assert all(r["trainer"] == "RayTransformersTrainer" for r in ranks)  # trained through prepare_trainer
    # epoch 0: all 6, 3 per rank, batches of 2 and 1; epoch 1: the 4 hardest, 2 per rank, one batch
    assert all(r["steps"] == r["planned_steps"] == 3 for r in ranks)
    subsets = []
    for e0, e1 in zip(ranks[0]["epochs"], ranks[1]["epochs"]):
        assert e0["epoch"] == e1["epoch"] and e0["subset"] == e1["subset"]  # the ranks agree
        subset, t0, t1 = e0["subset"], e0["trained"], e1["trained"]
        assert len(t0) == len(t1) == math.ceil(len(subset) / 2)  # each rank its whole shard, not half of it
        assert set(t0) | set(t1) == set(subset) and len(set(t0) & set(t1)) == 2 * len(t0) - len(subset)
        subsets.append(subset)
    assert [len(s) for s in subsets] == [6, 4]  # a re-selection

    client = MlflowClient(mlflow_uri)
    [run] = client.search_runs([client.get_experiment_by_name("ray-hf").experiment_id])
    assert run.info.run_id == ranks[0]["mlflow_run_id"] and run.info.status == "FINISHED"
    history = {
        key: [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
        for key in ("selected_ratio", "subset_checksum", "selection_hardness", "loss")
    }
    assert history["selected_ratio"] == pytest.approx([1.0, 4 / 6]) and history["selection_hardness"][1] == 1.0
    assert history["subset_checksum"] == pytest.approx([subset_checksum(torch.tensor(s)) for s in subsets])
    assert len(history["loss"]) == 3 and all(0 < loss < math.inf for loss in history["loss"])
    assert math.isfinite(run.data.metrics["train_loss"])

    # Ray Train's checkpoint: the last epoch's, every file of both workers' Trainer checkpoints
    saved = os.listdir(os.path.join(result["checkpoint"], "checkpoint"))
    assert {"adapter_model.safetensors", "attent_selection_rank0.pt", "attent_selection_rank1.pt"} <= set(saved)
    assert result["metrics"]["subset_checksum"] == pytest.approx(history["subset_checksum"][-1])


def submit_the_example(dashboard: str, out, storage, mlflow_uri: str) -> subprocess.CompletedProcess:
    """`ray job submit` of examples/ray_hf_trainer.py from the repository root, as the guide writes it: 6 GSM8K
    problems, 2 epochs, batches of 2, a logged loss at every step (the prompts, 57-95 tokens, keep some of their
    answers' tokens at 128)."""
    from attent.tasks.llm.model import resolve_checkpoint

    shell = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    shell.update(PATH=f"{BIN}{os.pathsep}{shell.get('PATH', '')}", RAY_AUTH_MODE="token")  # venv active, exported
    submit = ["ray", "job", "submit", "--address", dashboard, "--working-dir", ".", "--",
              "python", "examples/ray_hf_trainer.py", "--num-workers", "2",
              "--model", resolve_checkpoint("smollm2-135m-instruct"), "--data", str(GSM8K), "--limit", "6",
              "--epochs", "2", "--batch-size", "2", "--max-length", "128", "--logging-steps", "1",
              "--tracking-uri", mlflow_uri, "--experiment", "ray-hf", "--output-dir", str(out),
              "--storage-path", str(storage)]  # fmt: skip
    deadline = time.monotonic() + 180  # a head under load may not have its job agent up yet; Ray says to retry
    while True:
        proc = subprocess.run(submit, capture_output=True, text=True, timeout=840, cwd=REPO, env=shell)
        if "No available agent to submit job" not in proc.stderr or time.monotonic() > deadline:
            return proc
        time.sleep(10)
