"""End to end: Multi-Modal MAE pretraining with AtteNT and full data as a real sweep (Ray Tune +
Train on the session's Ray cluster, MLflow in SQLite), each trial followed by two downstream
jobs (classification, a pooled head; depth, a dense one) as Ray Train runs of their own (every
job kind, semseg included, trains through the recipe in test_mae_task); then the report reads
one row per pretraining configuration with the downstream columns."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from attent import contract
from attent.analysis.paper_tables.report import build_report
from attent.analysis.paper_tables.table_files import to_markdown
from attent.sweep.tune import run_sweep
from mlflow import MlflowClient

from tests.helpers.paths import REPO

SWEEP = "e2e-multimae"
JOBS = {"classification": "top1_accuracy", "depth": "delta1"}


def render_scenes(root: Path) -> Path:
    from attent.tasks.mae import scenes

    scenes.write_dataset(root, train=48, test=16, size=32, seed=0, workers=1)
    return root


@pytest.fixture(scope="module")
def store(ray_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("multimae")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    downstream = [
        {"name": job, "task": {"target": job, "eval_batch_size": 64}, "train": {"epochs": 1, "batch_size": 16}}
        for job in JOBS
    ]
    spec = {
        "name": SWEEP,
        "base": str(REPO / "experiments" / "multimae_scenes.yaml"),
        "overrides": {
            "task.data_path": str(render_scenes(root / "scenes")),
            "task.train_limit": None,
            "task.test_limit": None,
            "task.visible_tokens": 32,
            "train.epochs": 2,
            "train.batch_size": 16,
            "train.eval_every": 1,
            "ray.cpus_per_worker": 1,
            "ray.num_workers": 0,
            "ray.storage_path": str(root / "ray_results"),
            "mlflow.tracking_uri": uri,
            "downstream": downstream,
        },
        "trials": [{}, {"selection.preset": None, "selection.method": "full"}],
        "seeds": [0],
        "max_concurrent": 1,
    }  # one trial process (the digits ablation sweep runs two)
    path = root / "sweep.yaml"
    path.write_text(yaml.safe_dump({"sweep": spec}, sort_keys=False))
    results = run_sweep(path)
    assert all(result.error is None for result in results), [r.error for r in results]
    return uri, build_report(SWEEP, tracking_uri=uri, out_dir=root / "reports")


def runs_of(uri: str, role: str):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(SWEEP)
    return client.search_runs([experiment.experiment_id], f"tags.`{contract.TAG_ROLE}` = '{role}'")


def test_each_trial_runs_its_downstream_jobs_linked_to_it(store):
    uri, _ = store
    trials, jobs = runs_of(uri, contract.ROLE_TRIAL), runs_of(uri, contract.ROLE_DOWNSTREAM)
    assert len(trials) == 2 and len(jobs) == 4
    for trial in trials:
        mine = [j for j in jobs if j.data.tags[contract.TAG_PRETRAINING_RUN] == trial.info.run_id]
        assert sorted(j.data.tags[contract.TAG_DOWNSTREAM_JOB] for j in mine) == sorted(JOBS)
        assert all(j.data.tags[contract.TAG_PARENT_RUN_ID] == trial.info.run_id for j in mine)
        assert all(j.info.status == "FINISHED" for j in mine)
        for job in mine:  # the pretraining run received each job's final metric
            name = job.data.tags[contract.TAG_DOWNSTREAM_JOB]
            assert trial.data.metrics[contract.downstream_metric(name, JOBS[name])] == pytest.approx(
                job.data.metrics[contract.EVAL_PREFIX + JOBS[name]]
            )
        assert {"train_loss_rgb", "train_loss_depth", "train_loss_semseg"} <= set(trial.data.metrics)
        artifacts = [a.path for a in MlflowClient(uri).list_artifacts(trial.info.run_id, contract.PRETRAINED_ARTIFACT)]
        assert artifacts == [f"{contract.PRETRAINED_ARTIFACT}/{contract.PRETRAINED_FILE}"]
        for run, task in [(trial, "multimae"), *((job, "mae_downstream") for job in mine)]:
            [output] = MlflowClient(uri).get_run(run.info.run_id).outputs.model_outputs  # its logged model
            assert MlflowClient(uri).get_logged_model(output.model_id).tags[contract.TAG_TASK] == task


def test_the_report_reads_one_row_per_pretraining_with_downstream_columns(store):
    _, report = store
    assert report.runs == 2 and report.tables  # the trials only: downstream runs are not rows
    for table in report.tables:
        text = to_markdown(table)
        for header in ("classification top1_accuracy", "depth delta1", "depth abs_rel"):
            assert header in text, text
        assert text.count("\n|") - 1 == 2  # header rule + two rows: AtteNT and full data
