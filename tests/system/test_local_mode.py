"""Ray Train's local mode (``ray.num_workers: 0``) trains what one Ray Train worker trains: the same run at 0 and 1
workers (the rest of local mode: tests/engine/test_local_mode.py)."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pytest
from attent.engine import checkpoint

from tests.engine.test_local_mode import digits
from tests.helpers import shared_runs


def recorded(uri: str, run_id: str, scratch: Path):
    client = mlflow.MlflowClient(uri)
    run = client.get_run(run_id)
    artifacts = sorted(a.path for a in client.list_artifacts(run_id))
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    return run, artifacts, models, shared_runs.histories(uri, run_id, scratch)


def test_local_mode_trains_what_one_ray_train_worker_trains(ray_cluster, tmp_path, mlflow_uri):
    """The same config at ray.num_workers 0 and 1: the same subsets at every re-selection, every
    per-epoch number equal within the reference runs' tolerance floor, and the same MLflow keys
    (params, metrics, tags, artifacts, a logged model, datasets)."""
    from attent.engine.driver import train

    runs = {}
    for workers in (0, 1):
        result = train(digits(tmp_path, mlflow_uri, f"workers-{workers}", ray={"num_workers": workers}))
        runs[workers] = recorded(mlflow_uri, result.run_id, tmp_path / str(workers))
    (
        (local, local_artifacts, local_models, (local_epochs, local_subsets)),
        (ray_run, ray_artifacts, ray_models, (ray_epochs, ray_subsets)),
    ) = runs[0], runs[1]
    assert local.info.status == ray_run.info.status == "FINISHED"
    assert local_subsets == ray_subsets and len(local_subsets) >= 2
    assert len(local_epochs) == len(ray_epochs) == 3
    for local_row, ray_row in zip(shared_runs.untimed(local_epochs), shared_runs.untimed(ray_epochs)):
        assert local_row.keys() == ray_row.keys()
        for key, value in ray_row.items():
            assert local_row[key] == pytest.approx(value, rel=shared_runs.REL_FLOOR, abs=shared_runs.ABS_FLOOR), key
    assert local.data.metrics.keys() == ray_run.data.metrics.keys()
    assert local.data.params.keys() == ray_run.data.params.keys()
    assert local.data.params["ray.num_workers"] == "0" and ray_run.data.params["ray.num_workers"] == "1"
    assert local.data.tags.keys() == ray_run.data.tags.keys()
    assert local_artifacts == ray_artifacts
    assert len(local_models) == len(ray_models) == 1
    assert [d.dataset.name for d in local.inputs.dataset_inputs] == [
        d.dataset.name for d in ray_run.inputs.dataset_inputs
    ]
    assert any(k.startswith("system/") for k in local.data.metrics)  # the node's system metrics, sampled in-process
    # Ray Train persists no checkpoint in local mode: the engine kept the newest two, as Train would
    filesystem, folder = checkpoint.run_storage(str(tmp_path / "ray_results"), "workers-0")
    assert len([p for p in os.listdir(folder) if p.startswith("checkpoint_")]) == 2
