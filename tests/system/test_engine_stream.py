"""The engine on a Ray Data stream on a real Ray cluster: two Ray Train workers on Ray Data's own
shards of an image folder, logged to MLflow, one worker killed after a checkpoint and the group
restarted from it (the recipe's stream epochs: tests/engine/test_engine_stream.py)."""

from __future__ import annotations

import mlflow
from attent.selection.stream import stream_pools

from tests.engine import test_engine_stream as engine_stream
from tests.engine.test_engine_stream import B, experiment

digits_folder = engine_stream.digits_folder  # the part's fixture: digits as an image folder


def test_two_workers_train_on_ray_datas_shards_log_to_mlflow_and_resume_after_a_failure(
    digits_folder, ray_cluster, tmp_path
):
    """Ray Train splits the Ray Data stream between two workers (equal shards of 120 rows); one
    worker dies after epoch 1's checkpoint, and the restarted group goes on from it."""
    cfg = experiment(
        digits_folder,
        name="stream-two",
        train={"epochs": 3, "batch_size": B, "lr": 5e-3},
        ray={"num_workers": 2, "cpus_per_worker": 0.5, "checkpoint_every": 1, "storage_path": str(tmp_path / "ray")},
        mlflow={"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "stream"},
        fault={"fail_once_after_epoch": 1},
    )
    from attent.engine.driver import train

    result = train(cfg)

    client = mlflow.MlflowClient(cfg.mlflow.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    assert metrics["num_train_samples"] == 240 and metrics["ranks"] == 2
    pools = stream_pools(cfg.selection, B, 120, 3)  # each rank's pass over its 120 rows
    assert [len(sizes) for sizes in pools] == [3, 3, 3]
    assert metrics["samples_backpropagated"] == 2 * 9 * B
    assert metrics["samples_forwarded"] == 2 * 9 * B + 2 * sum(map(sum, pools))
    assert metrics["restored_at_epoch"] == 2  # the restart went on after epoch 2's checkpoint
    ratios = client.get_metric_history(run.info.run_id, "selected_ratio")
    assert sorted(m.step for m in ratios) == [0, 1, 2] and {m.value for m in ratios} == {0.5}
    assert 0 <= metrics["eval_test_accuracy"] <= 1
    assert client.search_logged_models([run.info.experiment_id])  # the trained model, as any run logs it
