"""The first look (issue 46): the link `attent ui` and `attent demo` print opens the experiment's
training runs with the saved view, checked against the MLflow UI the server serves (its routes
and the query it reads, found in its JavaScript bundle: an MLflow upgrade that changes them fails
here); and a resume, each checkpoint it skipped, are one line on the terminal under the CLI's
quiet console, once. No Ray, no browser (tests/system/test_dashboard.py opens the link in Chromium; the
link `attent ui` prints, answered by its server: tests/system/test_first_look.py)."""

from __future__ import annotations

import argparse
import io
import json
import re
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import mlflow
import pytest
from attent import contract
from attent.engine import dashboard, progress, tracking
from attent.server import app as server

JS = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"


def bundle() -> str:
    """MLflow's UI: every chunk of its JavaScript bundle, as installed."""
    return "\n".join(path.read_text(errors="replace") for path in sorted(JS.glob("*.js")))


def store_with_runs(tmp_path: Path, experiment: str = "first-look") -> tuple[str, str, str]:
    """(tracking URI, experiment id, run id): an experiment as the engine opens it, a benchmark's
    parent run and one finished training run under it (its metrics added to the training view)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client_for(uri)
    experiment_id = tracking.open_experiment(client, experiment, uri)
    parent = client.create_run(experiment_id, run_name=experiment, tags={contract.TAG_ROLE: contract.ROLE_BENCHMARK})
    run = client.create_run(
        experiment_id,
        run_name="attent-s0",
        tags={
            contract.TAG_ROLE: contract.ROLE_RUN,
            contract.TAG_LABEL: "attent",
            contract.TAG_PARENT_RUN_ID: parent.info.run_id,
        },
    )
    for epoch in range(2):
        client.log_metric(run.info.run_id, contract.TRAIN_LOSS, 1.0 - epoch / 4, step=epoch)
        client.log_metric(run.info.run_id, "eval_test_accuracy", 0.5 + epoch / 4, step=epoch)
    tracking.finish_run(uri, run.info.run_id, ok=True)
    return uri, experiment_id, run.info.run_id


# --- the link -----------------------------------------------------------------------------------
def test_the_link_matches_the_routes_and_query_of_mlflows_ui():
    """What training_view_url builds is what MLflow's bundle routes and reads."""
    js = bundle()
    url = urlsplit(dashboard.training_view_url("http://127.0.0.1:5000", "7"))
    route, _, query = url.fragment.partition("?")
    assert route == "/experiments/7/runs" and dict(parse_qsl(query)) == {
        "workflowType": "machine_learning",
        "viewStateShareKey": contract.TRAINING_VIEW_KEY,
    }
    # the Runs tab's route (a hash route: the server sees only /)
    assert re.search(r'experimentPageTabRuns\(\)\{return[^}]*"' + re.escape(dashboard.UI_RUNS_ROUTE) + '"', js)
    # the bare experiment route redirects by the switch below, keeping only these (no view): why
    # the link names the Runs tab
    assert '["startTimeLabel","startTime","endTime","workflowType","workspace"]' in js
    # the GenAI / Model training switch: from the query, else the browser's last click, else GenAI
    assert 'GENAI="genai",e.MACHINE_LEARNING="machine_learning"' in js and '.get("workflowType")' in js
    assert re.search(r'key:"mlflow\.workflowType",version:1,initialValue:', js)
    # the shared view: its query key, the experiment tag it reads, the envelope and compression
    assert re.search(r'="viewStateShareKey",[\w$]+="' + re.escape(contract.TAG_SHARED_VIEW_PREFIX) + '"', js)
    assert (
        "Invalid saved-view envelope: expected an object with a string `name`, number `createdAt`, "
        "and string `state`" in js
    )
    assert f'="{dashboard.DEFLATED}"' in js
    # ... ignored when the query carries search facets: the link carries none
    facets = re.search(r'\["searchFilter","orderByKey"[^\]]*\]', js)
    assert facets and not set(json.loads(facets.group(0))) & set(dict(parse_qsl(query)))
    # the runs page's chart mode (the charts link)
    assert '"compareRunsMode"' in js and "compareRunsMode=CHART" in dashboard.training_view_url("", "7", charts=True)


def test_attent_demo_ends_with_its_experiments_link(tmp_path):
    """The demo's last lines: the `attent ui` command over its store and the link to its training
    runs, at `attent ui`'s default address."""
    from attent.cli import demo, services

    uri, experiment_id, _ = store_with_runs(tmp_path, "attent-demo-20260101-000000")
    hint = demo.dashboard_hint(uri, "attent-demo-20260101-000000")
    assert f"attent ui --tracking-uri {uri}\n" in hint
    assert hint.endswith(f"  {dashboard.training_view_url(dashboard.UI_DEFAULT_URL, experiment_id)}")
    assert "Nothing was logged" in demo.dashboard_hint(uri, "no-such-experiment")
    parser = argparse.ArgumentParser()
    services.add_service_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["ui"])
    assert server.local_url(args.host, args.port) == dashboard.UI_DEFAULT_URL


# --- resumes and skipped checkpoints on the terminal -------------------------------------------------
@pytest.fixture
def run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client_for(uri)
    experiment_id = tracking.ensure_experiment(client, "faults", uri)
    return uri, client.create_run(experiment_id, run_name="corrupt-newest").info.run_id


def restore(uri: str, run_id: str, epoch: int, skipped: list[tuple[str, str]]) -> None:
    """What the worker logs when it restores (engine/worker.py)."""
    logger = tracking.RunLogger(uri, run_id)
    logger.log_metrics({contract.RESTORED_AT_EPOCH: epoch}, step=epoch)
    if skipped:
        logger.set_tag(contract.TAG_SKIPPED_CHECKPOINTS, "; ".join(f"{p}: {why}" for p, why in skipped))


SKIPPED = [
    (
        "/r/corrupt-newest/checkpoint_2026-01-01_00-00-02.000000",
        "state.pt differs from its recorded SHA-256 (altered or truncated)",
    ),
    (
        "/r/corrupt-newest/checkpoint_2026-01-01_00-00-01.000000",
        "state.pt does not load (UnpicklingError: invalid load key, '\\x00'; truncated: 3 bytes)",
    ),
]


def lines(terminal: io.StringIO) -> list[str]:
    return [line.strip() for line in re.split(r"[\r\n]", terminal.getvalue()) if "[attent]" in line]


@pytest.mark.parametrize("mode", [progress.PLAIN, progress.LIVE])
def test_a_resume_and_each_skipped_checkpoint_are_one_line_once(run, monkeypatch, mode):
    uri, run_id = run
    monkeypatch.setattr(progress, "POLL_SECONDS", 0.05)
    terminal = io.StringIO()
    line = progress.RunProgress(progress.Console(mode), terminal, "corrupt-newest", 3)
    line.follow(tracking.RunLogger(uri, run_id))
    restore(uri, run_id, 1, SKIPPED)
    deadline = time.time() + 30
    while len(lines(terminal)) < 3 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # more polls: nothing said twice
    line.close(tracking.RunLogger(uri, run_id), ok=True)
    # the worker logs the restore, then tags what it skipped: a poll between them says the resume first
    assert sorted(lines(terminal)) == sorted(
        [f"[attent] skipped checkpoint {path}: {why}" for path, why in SKIPPED]
        + ["[attent] resumed corrupt-newest from its epoch-1 checkpoint"]
    )


def test_a_run_ending_before_the_next_poll_still_says_it(run, monkeypatch):
    uri, run_id = run
    monkeypatch.setattr(progress, "POLL_SECONDS", 3600)
    terminal = io.StringIO()
    line = progress.RunProgress(progress.Console(progress.PLAIN), terminal, "corrupt-newest", 3)
    line.follow(tracking.RunLogger(uri, run_id))
    restore(uri, run_id, 2, SKIPPED[:1])
    line.close(tracking.RunLogger(uri, run_id), ok=False)  # failed right after: the lines still come, once
    assert lines(terminal) == [
        f"[attent] skipped checkpoint {SKIPPED[0][0]}: {SKIPPED[0][1]}",
        "[attent] resumed corrupt-newest from its epoch-2 checkpoint",
    ]


def test_an_earlier_drivers_resume_is_not_said_again_and_an_earlier_epoch_is(run, monkeypatch):
    """A re-run follows a run an earlier driver resumed: that resume is not its news; its own,
    from an older checkpoint past a newly corrupt one (a lower step, which MLflow's latest value
    of the metric does not show), is."""
    uri, run_id = run
    monkeypatch.setattr(progress, "POLL_SECONDS", 3600)
    restore(uri, run_id, 2, SKIPPED[1:])  # the earlier driver's
    terminal = io.StringIO()
    line = progress.RunProgress(progress.Console(progress.PLAIN), terminal, "corrupt-newest", 3)
    line.follow(tracking.RunLogger(uri, run_id))
    line.close(tracking.RunLogger(uri, run_id), ok=True)
    assert lines(terminal) == []
    line = progress.RunProgress(progress.Console(progress.PLAIN), terminal, "corrupt-newest", 3)
    line.follow(tracking.RunLogger(uri, run_id))
    restore(uri, run_id, 1, SKIPPED[:1])
    line.close(tracking.RunLogger(uri, run_id), ok=True)
    assert lines(terminal) == [
        f"[attent] skipped checkpoint {SKIPPED[0][0]}: {SKIPPED[0][1]}",
        "[attent] resumed corrupt-newest from its epoch-1 checkpoint",
    ]


def test_streamed_output_adds_no_lines(run, capsys):
    """`--verbose` (and the library's default) stream the worker's own lines: nothing to add."""
    uri, run_id = run
    line = progress.RunProgress(progress.Console(progress.STREAM), None, "corrupt-newest", 3)
    line.follow(tracking.RunLogger(uri, run_id))
    restore(uri, run_id, 1, SKIPPED)
    line.close(tracking.RunLogger(uri, run_id), ok=True)
    assert "[attent]" not in capsys.readouterr().out


def test_the_skipped_checkpoints_tag_splits_into_its_entries():
    tag = "; ".join(f"{p}: {why}" for p, why in SKIPPED)
    assert progress.skipped_checkpoints(tag) == SKIPPED
    assert progress.skipped_checkpoints("something else") == [("something else", "")]
