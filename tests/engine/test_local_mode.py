"""Ray Train's local mode (``ray.num_workers: 0``, issue 47): the run in the calling process, the
same recipe and MLflow run contract as one Ray Train worker, checkpoints written by the engine
(Ray Train persists none there), restarts and resumes as with workers. That it trains what one Ray Train
worker trains: tests/system/test_local_mode.py."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time

import mlflow
import pytest
import yaml
from attent.cli.main import main as attent_main
from attent.engine import checkpoint

from tests.helpers import shared_runs
from tests.helpers.paths import BIN

digits = functools.partial(shared_runs.digits_run, experiment="local-mode")


def test_an_injected_failure_restarts_in_process_from_the_latest_checkpoint(tmp_path, mlflow_uri, capsys):
    """ray.max_failures in local mode: the engine restarts the training function from the run's
    latest checkpoint, in the same MLflow run, and says so in one line; with none allowed the
    failure ends the run."""
    from attent.engine.driver import train
    from attent.engine.faults import InjectedFailure

    caller = os.environ.get("MLFLOW_TRACKING_URI")
    result = train(
        digits(tmp_path, mlflow_uri, "restarted", fault={"fail_once_after_epoch": 1}, ray={"max_failures": 1})
    )
    # the worker ran in this process: the run's store must not stay this process's default
    assert os.environ.get("MLFLOW_TRACKING_URI") == caller
    out = capsys.readouterr()
    assert "restarting from its latest checkpoint in this process (restart 1 of 1" in out.out + out.err
    client = mlflow.MlflowClient(mlflow_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(result.run_id, "restored_at_epoch")] == [2]
    assert [int(m.step) for m in sorted(client.get_metric_history(result.run_id, "epoch"), key=lambda m: m.step)] == [
        0,
        1,
        2,
    ]
    with pytest.raises(InjectedFailure):
        train(
            digits(tmp_path, mlflow_uri, "not-restarted", fault={"fail_once_after_epoch": 0}, ray={"max_failures": 0})
        )
    failed = client.search_runs([run.info.experiment_id], "tags.`mlflow.runName` = 'not-restarted'")
    assert [r.info.status for r in failed] == ["FAILED"]


def test_a_killed_local_mode_run_resumes_from_its_own_checkpoint_into_the_same_run(tmp_path, mlflow_uri, capsys):
    """`attent train` at ray.num_workers=0, SIGKILLed after its first checkpoint: re-run (here in
    this process, as the command's ``main``), it resumes from the checkpoint the engine wrote, into
    the same MLflow run, and finishes."""
    cfg = digits(tmp_path, mlflow_uri, "killed", train={"epochs": 4})
    path = tmp_path / "killed.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen(
        [str(BIN / "attent"), "train", str(path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    filesystem, folder = checkpoint.run_storage(cfg.ray.storage_path, cfg.name)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None:
            if os.path.isdir(folder) and any(p.startswith("checkpoint_") for p in os.listdir(folder)):
                break
            time.sleep(0.2)
        assert driver.poll() is None, "the run ended before its first checkpoint: nothing to kill"
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("local-mode")
    [killed] = client.search_runs([experiment.experiment_id], "tags.`mlflow.runName` = 'killed'")
    assert killed.info.status == "RUNNING"  # its driver died without closing it
    capsys.readouterr()
    assert attent_main(["train", str(path)]) == 0
    assert "(resumed)" in capsys.readouterr().out
    [resumed] = client.search_runs([experiment.experiment_id], "tags.`mlflow.runName` = 'killed'")
    assert resumed.info.run_id == killed.info.run_id and resumed.info.status == "FINISHED"
    restored = client.get_metric_history(resumed.info.run_id, "restored_at_epoch")
    assert len(restored) == 1 and 1 <= restored[0].value < 4
    epochs = {int(m.step) for m in client.get_metric_history(resumed.info.run_id, "epoch")}
    assert epochs == {0, 1, 2, 3}
