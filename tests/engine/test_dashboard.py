"""What each real engine run records besides its metrics (its datasets and system metrics), and the dashboard's
training view of them (`attent ui`'s saved view). The MLflow UI itself, opened in a real headless Chromium:
tests/system/test_dashboard.py."""

from __future__ import annotations

import dataclasses
import json

import mlflow
import pytest
from attent import contract
from attent.engine import dashboard as views
from attent.engine import tracking

from tests.helpers import shared_runs

SWEEP = shared_runs.ABLATION_SWEEP


def ablation_trials(digits_sweeps):
    """(tracking URI, experiment id, trials by name) of a store `attent sweep` wrote from real engine
    runs: the ablation sweep (``shared_runs``), its parent run and four trials (digits, 2 epochs)."""
    uri = digits_sweeps.tracking_uri
    client = mlflow.MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(SWEEP).experiment_id
    trials = client.search_runs([experiment_id], f"tags.`{contract.TAG_ROLE}` = '{contract.ROLE_TRIAL}'")
    return uri, experiment_id, {run.info.run_name: run for run in trials}


@pytest.fixture(scope="module")
def sweep_store(digits_sweeps):
    return ablation_trials(digits_sweeps)


def test_each_real_run_records_its_datasets_and_system_metrics(sweep_store):
    uri, _, runs = sweep_store
    for run in runs.values():
        inputs = {i.dataset.name: i for i in run.inputs.dataset_inputs}
        assert set(inputs) == {"digits-train", "digits-test"}
        for name, context, samples in (
            ("digits-train", contract.DATASET_TRAIN, shared_runs.SWEEP_TRAIN_SAMPLES),
            ("digits-test", contract.DATASET_EVAL, shared_runs.SWEEP_TEST_SAMPLES),
        ):
            dataset = inputs[name].dataset
            assert {(t.key, t.value) for t in inputs[name].tags} == {(contract.DATASET_CONTEXT_TAG, context)}
            assert len(dataset.digest) == 8 and json.loads(dataset.profile) == {"num_samples": samples}
            assert json.loads(dataset.source)["uri"].endswith("digits.csv.gz")
        # one monitor on the one node; its last sample is logged when the run's workers end
        cpu = mlflow.MlflowClient(uri).get_metric_history(
            run.info.run_id, contract.system_metric(0, "cpu_utilization_percentage")
        )
        assert cpu and all(0 <= m.value <= 100 for m in cpu)
        assert run.data.metrics[contract.system_metric(0, "system_memory_usage_megabytes")] > 0
    digests = [{i.dataset.digest for i in run.inputs.dataset_inputs} for run in runs.values()]
    assert len(digests) == 4 and all(d == digests[0] for d in digests)  # the same data: the same digests


def test_training_view_lists_the_trials_flat_with_the_key_metrics_and_models(sweep_store):
    uri, experiment_id, _ = sweep_store
    view = views.saved_training_view(mlflow.MlflowClient(uri), experiment_id)
    key = ["eval_test_accuracy", "eval_test_loss", *contract.KEY_METRICS]
    assert [c for c in view["selectedColumns"] if c.startswith("metrics.")] == [f"metrics.`{m}`" for m in key]
    assert "attributes.`Models`" in view["selectedColumns"]
    assert view["orderByKey"] != "attributes.start_time"  # any other sort lists child runs flat
    # the filter MLflow applies leaves out the sweep's parent run, and only it
    client = mlflow.MlflowClient(uri)
    shown = client.search_runs([experiment_id], view["searchFilter"])
    every = client.search_runs([experiment_id])
    assert {r.data.tags[contract.TAG_ROLE] for r in every} - {r.data.tags[contract.TAG_ROLE] for r in shown} == {
        contract.ROLE_SWEEP
    } and len(shown) == len(every) - 1
    charts = {(c["metricSectionId"], c["metricKey"]) for c in view["compareRunCharts"]}
    assert {(views.KEY_SECTION, m) for m in key} <= charts
    assert (views.SYSTEM_SECTION, contract.system_metric(0, "cpu_utilization_percentage")) in charts


def test_dataset_inputs_say_where_the_data_comes_from(tmp_path):
    from attent.tasks.llm.data import training_source

    mirror = tmp_path / "gsm8k" / "train.jsonl"
    mirror.parent.mkdir()
    mirror.write_text("{}\n")
    assert training_source("gsm8k", tmp_path) == (str(mirror), contract.DATASET_SOURCE_LOCAL)
    assert training_source("gsm8k", None) == ("openai/gsm8k", contract.DATASET_SOURCE_HUB)
    described = contract.DatasetDescription(
        "gsm8k-train", "openai/gsm8k", contract.DATASET_TRAIN, 7, "abc", contract.DATASET_SOURCE_HUB
    )
    hub = tracking.dataset_input(described).dataset
    assert hub.source_type == "hugging_face" and json.loads(hub.source)["path"] == "openai/gsm8k"
    other = tracking.dataset_input(dataclasses.replace(described, fingerprint="abd")).dataset
    assert other.digest != hub.digest  # other content, other digest
