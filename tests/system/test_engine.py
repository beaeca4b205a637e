"""The training engine's system tier: a two-rank run whose rank 0 is killed and restarted by Ray Train from its
checkpoint with identical metrics, and `ray job submit` to the session's cluster as the README shows (the rest of
the engine on a real Ray cluster: tests/engine/test_engine.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import mlflow

from tests.engine.test_engine import runs_named
from tests.helpers import shared_runs


def test_worker_failure_restarts_from_checkpoint_with_identical_metrics(restarted_reference):
    """The reference soft run again, its rank 0 killed after epoch 2 (and kernels tracked, which
    change nothing trained): restarted from the checkpoint, it logs the reference's numbers."""
    trained = restarted_reference
    assert (
        trained.cfg.ray.storage_path
        and (Path(trained.cfg.ray.storage_path) / trained.cfg.name / ".injected-failure-epoch1").exists()
    )
    shared_runs.assert_reproduces("digits-soft", trained.epochs, trained.subsets)
    client = mlflow.MlflowClient(trained.tracking_uri)
    run = client.get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id], f"tags.`mlflow.runName` = '{run.info.run_name}'")) == 1
    restored = client.get_metric_history(trained.run_id, "restored_at_epoch")
    assert (
        len(restored) == 1 and 1 <= restored[0].value <= 2
    )  # from a checkpoint (the latest it saved), not from scratch


def test_ray_job_submit_as_the_readme_shows_runs_attent_train(ray_cluster, tmp_path, mlflow_uri):
    """docs/guides/ray.md: with RAY_AUTH_MODE=token exported, `ray job submit --working-dir . --
    attent train FILE` to a Ray started from the venv (the session's) finishes its MLflow run;
    without the mode Ray's client is refused."""
    work = tmp_path / "job"
    work.mkdir()
    (work / "exp.yaml").write_text(
        "name: submitted\ntask: {name: vision, dataset: digits, train_limit: 400, test_limit: 100,"
        " model: {preset: vit_tiny_cpu}}\n"
        "train: {epochs: 1, batch_size: 128}\nselection: {preset: llm}\n"
        f"ray: {{storage_path: {tmp_path / 'ray_results'}}}\n"
        f"mlflow: {{tracking_uri: '{mlflow_uri}', experiment: engine-test}}\n"
    )
    from tests.helpers.paths import BIN

    shell = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    shell["PATH"] = f"{BIN}{os.pathsep}{shell.get('PATH', '')}"  # the user's shell, venv active
    submit = [
        "ray",
        "job",
        "submit",
        "--address",
        ray_cluster["dashboard"],
        "--working-dir",
        ".",
        "--",
        "attent",
        "train",
        "exp.yaml",
    ]

    refused = subprocess.run(submit, capture_output=True, text=True, timeout=300, cwd=work, env=shell)
    assert refused.returncode != 0 and "AuthenticationError" in refused.stdout + refused.stderr

    deadline = time.monotonic() + 180  # a head under load may not have its job agent up yet; Ray says to retry
    while True:
        proc = subprocess.run(
            submit, capture_output=True, text=True, timeout=600, cwd=work, env={**shell, "RAY_AUTH_MODE": "token"}
        )  # export RAY_AUTH_MODE=token
        if "No available agent to submit job" not in proc.stderr or time.monotonic() > deadline:
            break
        time.sleep(10)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout.lower()
    client, runs = runs_named(mlflow_uri, "submitted")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["attent.strategy"] == "hard" and "eval_test_accuracy" in runs[0].data.metrics
    # the Ray Train worker's lines, which Ray forwards to the driver, went to the run's log, not
    # to the job's output (the terminal test trains in local mode, without Ray's forwarding)
    log = (tmp_path / "ray_results" / "submitted" / "attent.log").read_text()
    assert "RayTrainWorker pid=" in log and "[attent] submitted: " in log
    assert "RayTrainWorker" not in proc.stdout + proc.stderr and "[attent] submitted: " not in proc.stdout
