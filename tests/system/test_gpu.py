"""The CUDA paths through Ray Train, for a GPU node (`pytest -m gpu`; skipped, saying why, where no CUDA device is
visible): two-worker NCCL DDP, both ranks training on the same subsets, and MLflow's GPU system metrics logged for a
GPU run (the other CUDA paths: tests/engine/test_gpu.py)."""

from __future__ import annotations

import pytest

from tests.engine.test_gpu import GPUS, digits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU (none visible here): run `pytest -m gpu` on a GPU node"),
]


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs for two NCCL ranks")
def test_two_workers_on_nccl_train_on_the_same_subsets(ray_cluster, tmp_path, mlflow_uri):
    import mlflow
    from attent.engine.driver import train

    cfg = digits(
        ray={"num_workers": 2, "use_gpu": True, "storage_path": str(tmp_path / "ray")},
        mlflow={"tracking_uri": mlflow_uri, "experiment": "gpu"},
    )
    result = train(cfg)  # the recipe all-gathers each epoch's subset checksum and raises on a mismatch
    run = mlflow.MlflowClient(mlflow_uri).get_run(result.run_id)
    assert run.info.status == "FINISHED" and "subset_checksum" in run.data.metrics


def test_gpu_system_metrics_reach_mlflow(ray_cluster, tmp_path, mlflow_uri):
    import mlflow
    from attent.engine.driver import train

    cfg = digits(
        train={"epochs": 3},
        ray={"num_workers": 1, "use_gpu": True, "storage_path": str(tmp_path / "ray")},
        mlflow={"tracking_uri": mlflow_uri, "experiment": "gpu"},
    )
    result = train(cfg)
    metrics = mlflow.MlflowClient(mlflow_uri).get_run(result.run_id).data.metrics
    assert any(name.startswith("system/") and "gpu" in name for name in metrics), sorted(metrics)
