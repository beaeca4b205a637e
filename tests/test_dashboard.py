"""The MLflow dashboard (`attent ui`) on 127.0.0.1, opened in a real headless Chromium."""
from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request

import mlflow
import pytest

from attent.engine.tracking import ensure_experiment
from conftest import BIN, free_port

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("chromium") and shutil.which("chromedriver")),
                                 reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")]


@pytest.fixture
def sweep_store(tmp_path):
    """A store laid out as `attent sweep` writes it: a parent run and two child trials."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment_id = ensure_experiment(client, "dash-sweep", uri)
    parent = client.create_run(experiment_id, run_name="dash-sweep-parent",
                               tags={"attent.role": "sweep", "attent.sweep": "dash-sweep"})
    children = []
    for i, strategy in enumerate(["hard", "soft"]):
        child = client.create_run(experiment_id, run_name=f"dash-trial-{strategy}",
                                  tags={"mlflow.parentRunId": parent.info.run_id, "attent.role": "trial"})
        for epoch in range(3):
            client.log_metric(child.info.run_id, "eval_test_accuracy", 0.61 + 0.1 * epoch + 0.01 * i, step=epoch)
        client.set_terminated(child.info.run_id)
        children.append(child.info.run_id)
    client.set_terminated(parent.info.run_id)
    return uri, experiment_id, children


@pytest.fixture
def dashboard(sweep_store):
    uri, experiment_id, children = sweep_store
    port = free_port()
    proc = subprocess.Popen([str(BIN / "attent"), "ui", "--tracking-uri", uri, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, "the MLflow UI did not come up"
            time.sleep(1)
    yield url, experiment_id, children
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()


def wait_for_text(driver, *texts, timeout=90):
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, timeout).until(lambda d: all(t in d.find_element("tag name", "body").text for t in texts))


def test_dashboard_shows_sweep_parent_and_children_with_metrics(dashboard, browser):
    url, experiment_id, children = dashboard
    assert url.startswith("http://127.0.0.1:")
    browser.get(f"{url}/#/experiments/{experiment_id}/runs")
    wait_for_text(browser, "dash-sweep", "dash-sweep-parent", "3 matching runs")
    # Child runs are folded under their parent: unfold it with the [+] in the parent's name cell.
    toggles = [b for b in browser.find_elements("css selector", "[role=row] button[data-component-id*='runnamecell']")
               if b.is_displayed()]
    assert len(toggles) == 1
    toggles[0].click()
    wait_for_text(browser, "dash-trial-hard", "dash-trial-soft")

    browser.get(f"{url}/#/experiments/{experiment_id}/runs/{children[1]}")
    wait_for_text(browser, "dash-trial-soft", "eval_test_accuracy", "0.82", "Parent run", "dash-sweep-parent")
