"""The driver opens one tracking session per run and hands it on: a run in Ray Train's local mode
builds one MLflow client on the driver (the worker, the same process, logs through it), against a
real SQLite store, and records everything a run records; a failed run re-run resumes into its
MLflow run through one client again. A Ray worker process builds its own client once."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import mlflow
import pytest
from attent import contract
from mlflow.tracking import MlflowClient

from tests.helpers import shared_runs

digits = functools.partial(shared_runs.digits_run, experiment="tracking-session")
MLFLOW_PACKAGE = str(Path(mlflow.__file__).parent)


@pytest.fixture
def clients(monkeypatch) -> list[str]:
    """Where each MlflowClient built from now on was built: the file of the code that called the
    real class. MLflow's own code builds its own (the system metrics monitor per sample, the
    model flavours), which the engine cannot hand a client to: those are counted apart."""
    built: list[str] = []
    init = MlflowClient.__init__

    def counted(self, *args, **kwargs):
        built.append(sys._getframe(1).f_code.co_filename)
        init(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "__init__", counted)
    return built


def ours(built: list[str]) -> list[str]:
    return [path for path in built if not path.startswith(MLFLOW_PACKAGE)]


def test_a_local_mode_run_builds_one_client_on_the_driver_and_records_everything(tmp_path, mlflow_uri, clients):
    from attent.engine import tracking
    from attent.engine.driver import run_pipeline
    from attent.engine.progress import PLAIN, Console

    cfg = digits(tmp_path, mlflow_uri, "one-session")
    result = run_pipeline(cfg, console=Console(PLAIN))  # `attent train`'s: the libraries' output to the run's log
    assert ours(clients) == [tracking.__file__]  # the session's, which the worker logged through too
    assert not result.training.resumed

    client = mlflow.MlflowClient(mlflow_uri)
    run = client.get_run(result.training.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "one-session"
    tags = run.data.tags
    for key in (
        contract.TAG_ROLE,
        contract.TAG_LABEL,
        contract.TAG_DRIVER,
        contract.TAG_RUN_KEY,
        contract.TAG_IDENTITY,
    ):
        assert tags.get(key), key
    assert tags[contract.TAG_RUN_KEY] == f"{tmp_path / 'ray_results'}/one-session"
    params = run.data.params
    assert params["ray.num_workers"] == "0" and params["train.epochs"] == "3" and params["task.train_limit"] == "300"
    metrics = run.data.metrics
    for key in (contract.TIME_SETUP, contract.TIME_WALLCLOCK, contract.TIME_STARTUP, contract.NUM_TRAIN_SAMPLES):
        assert key in metrics, key
    assert any(k.startswith(contract.EVAL_PREFIX) for k in metrics)
    assert any(k.startswith("system/") for k in metrics)  # MLflow's monitor, sampled in this process
    assert sorted(int(m.step) for m in client.get_metric_history(run.info.run_id, "train_loss")) == [0, 1, 2]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "plan.json", "selection_history.json", "epoch_history.json", "figures", "logs"} <= artifacts
    assert [d.dataset.name for d in run.inputs.dataset_inputs]  # the run's datasets as its inputs
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    assert len(models) == 1 and contract.TAG_MODEL_LOG_ERROR not in tags


def test_a_failed_run_re_run_resumes_into_its_mlflow_run_through_one_client(tmp_path, mlflow_uri, clients):
    from attent.engine.driver import run_pipeline
    from attent.engine.faults import InjectedFailure

    cfg = digits(tmp_path, mlflow_uri, "resumed", fault={"fail_once_after_epoch": 0}, ray={"max_failures": 0})
    with pytest.raises(InjectedFailure):
        run_pipeline(cfg)
    assert len(ours(clients)) == 1
    clients.clear()
    result = run_pipeline(cfg)  # the same name and storage path: the same MLflow run, from its checkpoint
    assert len(ours(clients)) == 1
    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("tracking-session")
    [run] = client.search_runs([experiment.experiment_id], "tags.`mlflow.runName` = 'resumed'")
    assert result.training.resumed and run.info.run_id == result.training.run_id
    assert run.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(run.info.run_id, contract.RESTORED_AT_EPOCH)] == [1]


def test_a_ray_worker_process_builds_its_client_once(mlflow_uri, clients):
    """Rank 0's handle on a Ray worker: one client of the store per process, for every run and
    restart it trains; in local mode the driver's, handed over in the payload."""
    from attent.engine import worker

    first = worker.run_logger({"tracking_uri": mlflow_uri, "run_id": "a"})
    again = worker.run_logger({"tracking_uri": mlflow_uri, "run_id": "b"})
    assert first.client is again.client and len(ours(clients)) == 1
    driver = mlflow.MlflowClient(mlflow_uri)
    local = worker.run_logger({"tracking_uri": mlflow_uri, "run_id": "c", worker.TRACKING_CLIENT: driver})
    assert local.client is driver
