"""The MLflow dashboard (`attent ui`) over real engine runs (the ablation sweep of ``shared_runs``), opened in a real
headless Chromium: the link opens the trials with their key metrics, and without it the view is two clicks away
(what the runs record: tests/engine/test_dashboard.py)."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request

import pytest
from attent import contract
from attent.engine import dashboard as views

from tests.engine.test_dashboard import SWEEP, ablation_trials
from tests.helpers.paths import BIN
from tests.helpers.processes import free_port

needs_chromium = pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="needs Debian's chromium and chromium-driver (.ci/run installs them)",
)


VIEWS_MENU = "mlflow.experiment_page.saved_views.trigger"  # MLflow UI's "Views" button


@pytest.fixture(scope="module")
def dashboard(digits_sweeps):
    uri, experiment_id, runs = ablation_trials(digits_sweeps)
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
