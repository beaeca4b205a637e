"""Preemption (issue 75): a spot node's termination notice, SIGTERM, sent to a Ray Train worker in the
middle of an epoch becomes a checkpoint within one optimiser step; Ray Train restarts the workers from it,
and the run trains the batches the uninterrupted run trains: the same subsets and every per-epoch number
as the uninterrupted reference run, bit for bit on one machine, each epoch's row logged once."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest

from tests.helpers import shared_runs

# 0-based: the last epoch, 15 steps per rank on 935 samples, begun by a scoring pass and a re-selection
# that a resume must not repeat; rank 1 (not the rank that saves) is the one signalled
SIGNALLED = {"epoch": 3, "step": 6, "rank": 1}


def test_sigterm_mid_epoch_checkpoints_within_a_step_and_the_run_trains_as_if_uninterrupted(reference_runs, tmp_path):
    from attent.engine import faults

    uninterrupted = reference_runs("digits-soft")
    cfg = shared_runs.reference_experiment("digits-soft", tmp_path, overrides={"name": "digits-soft-preempted"})
    assert cfg.ray.num_workers == 2 and cfg.ray.max_failures == 1  # Ray Train restarts the workers once
    folder = Path(cfg.ray.storage_path) / cfg.name
    folder.mkdir(parents=True)
    (folder / faults.SIGTERM_FILE).write_text(json.dumps(SIGNALLED))

    run = shared_runs.train_run(cfg, tmp_path / "read")

    assert not (folder / faults.SIGTERM_FILE).exists()  # the signal was sent
    client = mlflow.MlflowClient(run.tracking_uri)
    # restarted once, inside epoch 4 (step 3): after step 6, where the signal came, or the step after
    assert history(client, run.run_id, "restored_at_epoch") == [(3, 3)]
    ((step, at_step),) = history(client, run.run_id, "restored_at_step")
    assert step == 3 and at_step in (6, 7)
    # each epoch's row logged once, as the uninterrupted run logged it: the interrupted epoch neither twice nor skipped
    assert [row["epoch"] for row in run.epochs] == [1, 2, 3, 4]
    reference = mlflow.MlflowClient(uninterrupted.tracking_uri)
    for metric in shared_runs.untimed(uninterrupted.epochs)[-1]:
        assert history(client, run.run_id, metric) == history(reference, uninterrupted.run_id, metric), metric
    # the uninterrupted run's subsets and per-epoch numbers, bit for bit (the same machine and kernels)
    assert run.subsets == uninterrupted.subsets
    assert shared_runs.untimed(run.epochs) == shared_runs.untimed(uninterrupted.epochs)
    final = [k for k in uninterrupted.metrics if not k.startswith(shared_runs.TIMED) and k != "epochs_ended_unix"]
    assert {k: run.metrics[k] for k in final} == {k: uninterrupted.metrics[k] for k in final}
    shared_runs.assert_reproduces("digits-soft", run.epochs, run.subsets)  # and the record, across machines


def history(client, run_id: str, metric: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, metric)]


def test_a_preempted_run_out_of_restarts_resumes_on_fewer_workers_ending_the_epoch_at_its_checkpoint(
    ray_cluster, tmp_path, mlflow_uri
):
    """With no restart left the run ends FAILED on `Preempted`, resumable: re-run on one worker
    instead of two (an elastic run's restart on fewer), it ends the interrupted epoch at the
    checkpoint's step, its samples trained there counted once, and goes on from the next epoch."""
    from attent.engine import faults
    from attent.engine.driver import train

    sections = {"train": {"batch_size": 16}, "ray": {"num_workers": 2, "max_failures": 0}}
    cfg = shared_runs.digits_run(tmp_path, mlflow_uri, "fewer-workers", experiment="preemption", **sections)
    folder = Path(cfg.ray.storage_path) / cfg.name
    folder.mkdir(parents=True)
    # epoch 3 trains 120 of the 300 samples: 60 a rank, 4 steps; the checkpoint comes after step 2
    (folder / faults.SIGTERM_FILE).write_text(json.dumps({"epoch": 2, "step": 1, "rank": 0}))
    with pytest.raises(Exception, match="Preempted: SIGTERM: the run stopped after step 2/4 of epoch 3"):
        train(cfg)
    client = mlflow.MlflowClient(mlflow_uri)
    (failed,) = client.search_runs([client.get_experiment_by_name("preemption").experiment_id])
    assert failed.info.status == "FAILED" and history(client, failed.info.run_id, "epoch") == [(0, 1.0), (1, 2.0)]

    resumed = train(
        shared_runs.digits_run(
            tmp_path, mlflow_uri, "fewer-workers", experiment="preemption", **{**sections, "ray": {"num_workers": 1}}
        )
    )
    assert resumed.resumed and resumed.run_id == failed.info.run_id
    assert client.get_run(resumed.run_id).info.status == "FINISHED"
    assert history(client, resumed.run_id, "restored_at_step") == [(2, 2.0)]
    assert [step for step, _ in history(client, resumed.run_id, "train_loss")] == [0, 1, 2]
    trained = [value for _, value in history(client, resumed.run_id, "samples_backpropagated")]
    assert trained[2] - trained[1] == 2 * 2 * 16  # two steps of 16 samples on each of the two ranks
