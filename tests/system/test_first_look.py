"""The first look's server: `attent ui` prints the training runs' link, and the server it starts answers it (the
link against the MLflow UI's routes and query, and the resume lines: tests/cli/test_first_look.py)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import urllib.request
import zlib

import mlflow
from attent import contract
from attent.engine import dashboard
from attent.server import app as server

from tests.cli.test_first_look import store_with_runs
from tests.helpers.paths import BIN
from tests.helpers.processes import free_port


def test_attent_ui_prints_the_training_runs_link_that_the_server_answers(tmp_path):
    """`attent ui` over a store with a benchmark's runs prints the experiment's training view
    link, not the bare address (MLflow's GenAI home); the server serves the UI holding the route,
    the experiment with its kind and its view (the envelope the UI parses), and the view's filter
    lists the training run without its benchmark's parent."""
    uri, experiment_id, run_id = store_with_runs(tmp_path)
    experiment = mlflow.MlflowClient(uri).get_experiment(experiment_id)
    assert experiment.tags[contract.TAG_EXPERIMENT_KIND] == contract.EXPERIMENT_KIND_TRAINING  # earlier MLflow 3 UIs

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(BIN / "attent"), "ui", "--tracking-uri", uri, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        printed = []
        for line in proc.stdout:
            printed.append(line.rstrip("\n"))
            if line.startswith("(the server's own log"):
                break
        assert printed[-1].startswith("(the server's own log"), printed
        link = dashboard.training_view_url(base, experiment_id)
        assert f"  first-look: {link}" in printed
        urls = [url for line in printed for url in re.findall(r"https?://\S+", line)]
        assert urls == [link]  # no bare address to click first

        with urllib.request.urlopen(f"{base}/", timeout=60) as answer:  # the page the link loads
            page = answer.read().decode()
        main = re.search(r'src="[^"]*/(static/js/main\.[0-9a-f]+\.js)"', page)
        assert answer.status == 200 and 'id="root"' in page and main
        with urllib.request.urlopen(f"{base}/static-files/{main.group(1)}", timeout=60) as answer:
            assert dashboard.UI_RUNS_ROUTE in answer.read().decode()  # the routes checked above

        # what the UI reads: the experiment's tags, the view's envelope, the runs its filter finds
        with urllib.request.urlopen(
            f"{base}/ajax-api/2.0/mlflow/experiments/get?experiment_id={experiment_id}", timeout=60
        ) as answer:
            tags = {t["key"]: t["value"] for t in json.load(answer)["experiment"]["tags"]}
        envelope = json.loads(tags[contract.TAG_SHARED_VIEW_PREFIX + contract.TRAINING_VIEW_KEY])
        assert envelope["name"] == dashboard.TRAINING_VIEW_NAME and isinstance(envelope["createdAt"], int)
        assert envelope["state"].startswith(dashboard.DEFLATED)
        view = json.loads(zlib.decompress(base64.b64decode(envelope["state"][len(dashboard.DEFLATED) :])))
        assert "metrics.`eval_test_accuracy`" in view["selectedColumns"]
        search = urllib.request.Request(
            f"{base}/ajax-api/2.0/mlflow/runs/search",
            method="POST",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"experiment_ids": [experiment_id], "filter": view["searchFilter"]}).encode(),
        )
        with urllib.request.urlopen(search, timeout=60) as answer:
            assert [r["info"]["run_id"] for r in json.load(answer)["runs"]] == [run_id]
    finally:
        server.stop(proc)
