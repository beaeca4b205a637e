"""The dashboard: MLflow's runs page as `attent ui` links to it. MLflow 3.17's UI opens an
experiment on its GenAI pages and folds a sweep's trials under the parent; a saved view (the
format its Share button stores, as an experiment tag) lists the training runs flat, without the
sweeps' and benchmarks' parent runs (rows of dashes among their trials), with the key metrics
and logged models as columns and charts, and the link turns on its Model training mode.
(MLflow's shared views leave out which parents are expanded, so nesting would hide every
trial's metrics behind a click.)"""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlencode

from mlflow.tracking import MlflowClient

from .. import contract

# The runs a view lists: all but the parents of sweeps and benchmarks (a run's page names its parent)
PARENT_ROLES = (contract.ROLE_SWEEP, contract.ROLE_BENCHMARK, contract.ROLE_THEORY)
RUNS_SHOWN = " and ".join(f"tags.`{contract.TAG_ROLE}` != '{role}'" for role in PARENT_ROLES)
# MLflow 3.17's UI (its JavaScript bundle, mlflow/server/js/build; tests/cli/test_first_look.py finds
# each of these there). The experiment's bare route redirects by the GenAI / Model training switch
# to its GenAI overview, keeping no view, so the link names the Runs tab itself. The switch reads
# ``workflowType`` from the query, else what the browser last clicked, else GenAI; in 3.17 it also
# sets the experiment's kind (the ``mlflow.experimentKind`` tag is no longer read). A
# ``viewStateShareKey`` loads the view stored in the experiment's tag of that key, unless the
# query carries search facets (``searchFilter``, ``orderByKey``...): the link carries none.
UI_RUNS_ROUTE = "/experiments/:experimentId/runs"
UI_DEFAULT_URL = "http://127.0.0.1:5000"  # where `attent ui` serves by default
UI_MODEL_TRAINING = {"workflowType": "machine_learning"}
UI_SHARED_VIEW, UI_CHARTS = "viewStateShareKey", {"compareRunsMode": "CHART"}
KEY_SECTION, CURVE_SECTION, SYSTEM_SECTION = "attent-key-metrics", "attent-per-epoch", "attent-system"
COLUMN_WIDTHS = {"tags": 220, "params": 60, "metrics": 150, "attributes": 150}  # px
TRAINING_VIEW_NAME = "Training runs (attent)"  # its name in the UI's "Views" menu
DEFLATED = "deflate;"  # how MLflow's UI marks a compressed view state


def training_view_url(base_url: str, experiment_id: str, *, charts: bool = False) -> str:
    """The experiment's training runs in MLflow's UI: Model training mode and the training view
    (trials listed flat, key metrics as columns), as a table or as charts."""
    query = {**UI_MODEL_TRAINING, UI_SHARED_VIEW: contract.TRAINING_VIEW_KEY, **(UI_CHARTS if charts else {})}
    route = UI_RUNS_ROUTE.replace(":experimentId", quote(str(experiment_id), safe=""))
    return f"{base_url.rstrip('/')}/#{route}?{urlencode(query)}"


def training_view_state(metric_names: Iterable[str]) -> dict[str, Any]:
    """MLflow's shared view state of the runs page (search facets and UI state, what its Share
    button stores) for runs with these metrics: every run but the parents listed flat and sorted
    by name (any sort but by creation time un-nests a sweep's trials), label, key metrics, seed
    and logged models as columns; bar charts of the key metrics, curves per epoch, system metrics over time."""
    names = set(metric_names)
    evals = sorted(n for n in names if n.startswith(contract.EVAL_PREFIX))
    key = sorted(n for n in names if contract.is_downstream_metric(n)) + list(contract.KEY_METRICS)
    system = sorted(
        (n for n in names if n.startswith(contract.SYSTEM_METRICS_PREFIX)),
        key=lambda n: (not n.endswith(contract.SYSTEM_METRICS_FIRST), n),
    )
    columns = [
        _column("tags", contract.TAG_LABEL),
        *(_column("metrics", n) for n in key),
        _column("params", contract.PARAM_SEED),
        _column("attributes", "Models"),
        _column("attributes", "Dataset"),
        _column("attributes", "Duration"),
    ]
    charts = [
        *(_chart("BAR", n, KEY_SECTION) for n in key),
        *(_line_chart(n, CURVE_SECTION) for n in [*contract.CURVE_METRICS, *evals]),
        *(_line_chart(n, SYSTEM_SECTION, xAxisKey="time", useGlobalXaxisKey=False) for n in system),
    ]
    return {
        "searchFilter": RUNS_SHOWN,
        "orderByKey": f"tags.`{contract.TAG_RUN_NAME}`",
        "orderByAsc": True,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "datasetsFilter": [],
        "modelVersionFilter": "All Runs",
        "runsHiddenMode": "SHOW_ALL",
        "selectedColumns": columns,
        "columnOrder": columns,
        "columnWidths": {c: COLUMN_WIDTHS[c.split(".")[0]] for c in columns},
        "compareRunSections": [
            _section(KEY_SECTION, "Key metrics"),
            _section(CURVE_SECTION, "Per epoch"),
            _section(SYSTEM_SECTION, "System metrics"),
        ],
        "compareRunCharts": charts,
    }


def _column(kind: str, name: str) -> str:
    return f"{kind}.`{name}`"


def _section(uuid: str, name: str) -> dict[str, Any]:
    return {"uuid": uuid, "name": name, "display": True, "isReordered": False, "deleted": False, "isGenerated": False}


def _chart(kind: str, metric: str, section: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "uuid": f"attent-{section}-{metric}",
        "metricSectionId": section,
        "metricKey": metric,
        "displayName": metric,
        "isGenerated": False,
        "deleted": False,
        "runsCountToCompare": 100,
        **fields,
    }


def _line_chart(metric: str, section: str, **fields: Any) -> dict[str, Any]:
    """A line chart with the defaults of MLflow's UI (the fields its chart class sets)."""
    return _chart(
        "LINE",
        metric,
        section,
        **{
            "selectedMetricKeys": [metric],
            "lineSmoothness": 0,
            "xAxisScaleType": "linear",
            "scaleType": "linear",
            "range": {},
            "xAxisKey": "step",
            "selectedXAxisMetricKey": "",
            "yAxisKey": "metric",
            "yAxisExpressions": [],
            "ignoreOutliers": False,
            "useGlobalXaxisKey": True,
            "useGlobalLineSmoothing": True,
            **fields,
        },
    )


def write_training_view(client: MlflowClient, experiment_id: str, metric_names: Iterable[str]) -> None:
    """Store the training view on the experiment as MLflow's UI saves a view (an envelope that
    names it around the deflated state), if the state changed: the UI lists it under "Views"
    and loads it from the link's ``viewStateShareKey``."""
    from mlflow.utils.validation import MAX_EXPERIMENT_TAG_VAL_LENGTH

    tag = contract.TAG_SHARED_VIEW_PREFIX + contract.TRAINING_VIEW_KEY
    names = list(metric_names)
    state = _deflated(training_view_state(names))
    if len(state) > MAX_EXPERIMENT_TAG_VAL_LENGTH - 200:  # the envelope must fit in the tag
        # hundreds of GPUs' system charts: the UI draws charts for the metrics a view lacks itself
        state = _deflated(training_view_state(n for n in names if not n.startswith(contract.SYSTEM_METRICS_PREFIX)))
    previous = _saved_view(client.get_experiment(experiment_id).tags.get(tag))
    if previous.get("state") == state:
        return
    now = int(time.time() * 1000)
    envelope = {
        "name": TRAINING_VIEW_NAME,
        "createdAt": previous.get("createdAt", now),
        "updatedAt": now,
        "state": state,
    }
    client.set_experiment_tag(experiment_id, tag, json.dumps(envelope))


def saved_training_view(client: MlflowClient, experiment_id: str) -> dict[str, Any]:
    """The training view state stored on the experiment; {} when there is none."""
    tag = contract.TAG_SHARED_VIEW_PREFIX + contract.TRAINING_VIEW_KEY
    state = _saved_view(client.get_experiment(experiment_id).tags.get(tag)).get("state", "")
    if not state.startswith(DEFLATED):
        return {}
    return json.loads(zlib.decompress(base64.b64decode(state[len(DEFLATED) :])))


def _deflated(state: dict[str, Any]) -> str:
    """A view state as MLflow's UI stores it: "deflate;" + base64 of its zlib-compressed JSON."""
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    return DEFLATED + base64.b64encode(zlib.compress(text.encode())).decode()


def _saved_view(value: str | None) -> dict[str, Any]:
    try:
        saved = json.loads(value) if value else {}
    except ValueError:
        return {}
    return saved if isinstance(saved, dict) else {}


def add_to_training_view(client: MlflowClient, experiment_id: str, metric_names: Iterable[str]) -> None:
    """The training view with a finished run's metrics added to those it shows, without reading
    the experiment's other runs. (Two runs ending at once may each miss the other's new names;
    ``refresh_training_view`` finds them again.)"""
    charts = saved_training_view(client, experiment_id).get("compareRunCharts", [])
    shown = {chart["metricKey"] for chart in charts}  # every metric the view uses has a chart
    write_training_view(client, experiment_id, shown | set(metric_names))


def refresh_training_view(client: MlflowClient, experiment_id: str) -> None:
    """The training view over the metrics all the experiment's runs logged so far (the downstream
    metrics' names are known only once runs logged them)."""
    from mlflow.utils import get_results_from_paginated_fn

    runs = get_results_from_paginated_fn(
        lambda count, token: client.search_runs([experiment_id], max_results=count, page_token=token), 1000
    )
    write_training_view(client, experiment_id, set().union(*(run.data.metrics for run in runs)))


def experiment_link(tracking_uri: str, experiment: str, base_url: str) -> str | None:
    """The training view URL of one experiment, by name, its view refreshed from its runs' metrics
    (None when the store has no such experiment). What `attent demo` prints."""
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    refresh_training_view(client, found.experiment_id)
    return training_view_url(base_url, found.experiment_id)


def dashboard_links(tracking_uri: str, base_url: str) -> list[tuple[str, str]]:
    """(experiment name, training view URL) of every experiment with runs, newest first, each
    view refreshed from the runs' metrics. What `attent ui` prints."""
    client = MlflowClient(tracking_uri=tracking_uri)
    links = []
    for experiment in client.search_experiments(order_by=["last_update_time DESC"]):
        if not client.search_runs([experiment.experiment_id], max_results=1):
            continue
        refresh_training_view(client, experiment.experiment_id)
        links.append((experiment.name, training_view_url(base_url, experiment.experiment_id)))
    return links
