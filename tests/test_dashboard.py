"""The MLflow dashboard (`attent ui`) over real engine runs, opened in a real headless Chromium;
and what each real run records besides its metrics: its datasets and system metrics."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
import urllib.request

import mlflow
import pytest
import shared_runs
from attent import contract
from attent.engine import dashboard as views
from attent.engine import tracking
from conftest import BIN, free_port

needs_chromium = pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="needs Debian's chromium and chromium-driver (.ci/run installs them)",
)
SWEEP = shared_runs.ABLATION_SWEEP
VIEWS_MENU = "mlflow.experiment_page.saved_views.trigger"  # MLflow UI's "Views" button


@pytest.fixture(scope="module")
def sweep_store(digits_sweeps):
    """A store `attent sweep` wrote from real engine runs: the ablation sweep (``shared_runs``),
    its parent run and four trials (digits, 2 epochs)."""
    uri = digits_sweeps.tracking_uri
    client = mlflow.MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(SWEEP).experiment_id
    trials = client.search_runs([experiment_id], f"tags.`{contract.TAG_ROLE}` = '{contract.ROLE_TRIAL}'")
    return uri, experiment_id, {run.info.run_name: run for run in trials}


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


@pytest.fixture(scope="module")
def dashboard(sweep_store):
    uri, experiment_id, runs = sweep_store
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "attent"), "ui", "--tracking-uri", uri, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, "the MLflow UI did not come up"
            time.sleep(1)
    yield url, uri, experiment_id, runs
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    # wide: the runs table renders only the columns in view
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=2400,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.implicitly_wait(60)  # elements appear as the UI loads
    yield driver
    driver.quit()


def page_text(driver) -> str:
    return driver.find_element("tag name", "body").text


def wait_for_text(driver, *texts, timeout=90):
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: all(t in page_text(d) for t in texts))


@pytest.mark.system
@needs_chromium
def test_dashboard_opens_the_trials_with_their_key_metrics(dashboard, browser):
    url, uri, experiment_id, runs = dashboard
    links = dict(views.dashboard_links(uri, url))  # what `attent ui` prints
    assert links[SWEEP] == views.training_view_url(url, experiment_id)
    key = ["eval_test_accuracy", *contract.KEY_METRICS]
    browser.get(links[SWEEP])
    # the training runs, every trial listed (not folded under the sweep), no clicks
    wait_for_text(browser, *runs, *key, f"{len(runs)} matching runs")  # the trials, not the sweep's parent
    text = page_text(browser)
    assert "Token Usage" not in text and "Traces\n0" not in text  # not the GenAI overview
    for run in runs.values():
        assert str(int(run.data.metrics[contract.SAMPLES_BACKPROPAGATED])) in text
        assert run.data.tags[contract.TAG_LABEL] in text
    # a trial's page: its parent, its training set and system metrics
    run = runs[f"{SWEEP}-t00-s0"]
    train_set = next(i.dataset for i in run.inputs.dataset_inputs if i.dataset.name == "digits-train")
    browser.get(f"{url}/#/experiments/{experiment_id}/runs/{run.info.run_id}")
    wait_for_text(
        browser,
        "Parent run",
        SWEEP,
        f"digits-train ({train_set.digest})",
        contract.system_metric(0, "cpu_utilization_percentage"),
    )

    browser.get(views.training_view_url(url, experiment_id, charts=True))
    wait_for_text(browser, "Key metrics", "Per epoch", "System metrics", *key)


@pytest.mark.system
@needs_chromium
def test_without_the_link_the_view_is_two_clicks_away(dashboard, browser):
    url, _, experiment_id, runs = dashboard
    browser.get(f"{url}/#/experiments/{experiment_id}")
    # MLflow 3.17 opens on its GenAI pages until "Model training" is clicked (then remembered);
    # a JavaScript click: the GenAI overview's first-visit popover covers the page
    switch = browser.find_element("xpath", "//div[@role='button'][normalize-space()='Model training']")
    browser.execute_script("arguments[0].click()", switch)
    browser.find_element("css selector", f"button[data-component-id='{VIEWS_MENU}']").click()
    browser.find_element("xpath", f"//*[text()='{views.TRAINING_VIEW_NAME}']").click()
    wait_for_text(browser, *runs, *contract.KEY_METRICS)
