"""`attent server` and concurrent trials: every metric point, artifact and run status lands (its command line's
refusals: tests/server/test_tracking_server.py).

The load: a sweep of 4 one-epoch digits trials, all at once on the session's 2-CPU Ray (each
worker on 0.5 CPU), through `attent server` on PostgreSQL, counted through MLflow's API by
benchmarks/robustness/tracking_load.py, run from its command line. 8 trials at once, the same
load straight into SQLite, other backends and bursts of bare writers are that benchmark's
(benchmarks/results/tracking_load/tracking_load.md):
8 trials at once take ~4 min here and, beside the suite's other worker, ran this 24 GiB machine
out of memory (Ray's OOM killer stopped a trial).
"""

from __future__ import annotations

import functools
import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from attent.server import app as server
from attent.sweep.tune import SWEEP_SERVER_LOG
from mlflow import MlflowClient

from tests.helpers.paths import BIN, REPO
from tests.helpers.processes import free_port

LOAD = REPO / "benchmarks" / "robustness" / "tracking_load.py"
TRIALS = 4


@functools.cache
def no_postgres() -> str:
    """Why the benchmark cannot start a PostgreSQL here ('' when it can)."""
    return subprocess.run(
        [sys.executable, str(LOAD), "--why-no-postgres"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def run_load(backend: str, tmp_path) -> dict:
    """The benchmark's load of TRIALS concurrent trials into ``backend``, each training in its
    own process (local mode), on the session's Ray ($RAY_ADDRESS); its count, with the floors."""
    out = tmp_path / "load"
    done = subprocess.run(
        [
            sys.executable,
            str(LOAD),
            "--trials",
            str(TRIALS),
            "--burst-writers",
            "--backends",
            backend,
            "--workers",
            "0",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((out / "counts.json").read_text())
    return {
        **saved["loads"][0],
        "points_floor": TRIALS * saved["points_floor_per_trial"],
        "artifacts_floor": TRIALS * saved["artifacts_floor_per_trial"],
    }


# --- serving ------------------------------------------------------------------------------------


def test_server_prints_its_url_and_serves_localhost_and_other_machines(tmp_path):
    """The printed URL works, and so does http://localhost:PORT; artifacts go through the server
    into --artifacts-destination (experiments created through it get mlflow-artifacts:/). The Host
    headers of workers on other machines (a private IP, this machine's name, as a server on
    --host 0.0.0.0 accepts them) pass and others are refused, all sent over loopback."""
    port = free_port()
    allowed = ",".join(server.allowed_hosts_for("0.0.0.0"))
    proc = subprocess.Popen(
        [str(BIN / "attent"), "server", "--port", str(port), "--workers", "1", "--allowed-hosts", allowed],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        line = line_with(proc, "MLFLOW_TRACKING_URI=")
        assert f"MLFLOW_TRACKING_URI=http://127.0.0.1:{port}" in line
        assert f"sqlite:///{tmp_path}/mlflow.db" in line  # the default store, absolute, as `attent ui`'s
        assert health(f"http://127.0.0.1:{port}") == 200  # printed once it answers, not before
        client = MlflowClient(f"http://localhost:{port}")
        experiment = client.create_experiment("served")
        assert client.get_experiment(experiment).artifact_location.startswith("mlflow-artifacts:")
        run = client.create_run(experiment)
        client.log_text(run.info.run_id, "hello", "note.txt")
        assert client.download_artifacts(run.info.run_id, "note.txt", str(tmp_path))
        assert list((tmp_path / "mlartifacts").rglob("note.txt"))  # stored by the server, not the client
        for host, expected in [
            (f"10.1.2.3:{port}", 200),
            (f"{socket.gethostname()}:{port}", 200),
            (f"localhost:{port}", 200),
            (f"attacker.example:{port}", 403),
        ]:
            assert api_status(port, host) == expected, host
    finally:
        server.stop(proc)


def test_ui_prints_its_links_once_it_answers_runs_no_job_runner_and_stops_on_ctrl_c(tmp_path):
    """`attent ui`: the dashboard link is printed once the server answers; the server runs without
    MLflow's job runner (no huey consumer processes); Ctrl-C stops it and every process it
    started, exit 0."""
    import psutil

    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "attent"), "ui", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # Ctrl-C's SIGINT as a terminal's foreground process gets it: a suite started in the background from a
        # script (`make test-all &`) ignores SIGINT, and every process it starts inherits that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = line_with(proc, "MLflow dashboard:")
        assert f"http://127.0.0.1:{port}" in line
        assert health(f"http://127.0.0.1:{port}") == 200
        started = psutil.Process(proc.pid).children(recursive=True)
        commands = [" ".join(child.cmdline()) for child in started]
        assert any("mlflow ui" in command for command in commands)
        assert not [command for command in commands if "huey" in command or "_job_runner" in command]
        proc.send_signal(signal.SIGINT)
        # A hang guard, not a speed claim: the server gets 30 s to stop on SIGTERM before SIGKILL
        # (server.stop), and under a loaded CI machine the whole exit once took over 60 s.
        assert proc.wait(timeout=180) == 0
        gone, alive = psutil.wait_procs(started, timeout=30)
        assert not alive
    finally:
        server.stop(proc)


def line_with(proc: subprocess.Popen, text: str) -> str:
    """The first line of the process's output that holds ``text`` (it must come before it exits)."""
    for raw in proc.stdout:
        if text in (line := raw.decode()):
            return line
    raise AssertionError(f"the process exited ({proc.wait()}) without printing {text!r}")


def health(url: str) -> int:
    """``<url>/health``'s status, asked once (no waiting for the server)."""
    with urllib.request.urlopen(f"{url}/health", timeout=30) as answer:
        return answer.status


def api_status(port: int, host: str) -> int:
    """HTTP status of an API call to 127.0.0.1:port sent with the given Host header."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1", headers={"Host": host}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


# --- concurrent trials ------------------------------------------------------------------------


def assert_nothing_lost(count: dict) -> None:
    assert count["sweep_exit_code"] == 0
    assert count["parent_status"] == "FINISHED"
    assert (count["runs_found"], count["finished"], count["running"], count["failed"]) == (TRIALS, TRIALS, 0, 0)
    assert count["points_found"] == count["points_expected"], count["lost_examples"]
    assert count["artifacts_found"] == count["artifacts_expected"], count["lost_examples"]
    assert count["points_duplicated"] == 0  # a worker that died and was restarted logs its epoch again
    assert count["errors"]["MLflow API error"] == 0 and count["errors"]["database is locked"] == 0
    # the expectation is not vacuous: per run, every logged metric and step and every artifact
    assert count["points_expected"] >= count["points_floor"]
    assert count["artifacts_expected"] > count["artifacts_floor"]  # figures/*.png too


def test_concurrent_trials_through_the_server_on_postgresql(ray_cluster, tmp_path):
    if no_postgres():
        pytest.skip(f"PostgreSQL variant: {no_postgres()}")
    assert_nothing_lost(run_load("server-postgresql", tmp_path))


def test_concurrent_trials_through_the_server_on_sqlite(ray_cluster, tmp_path):
    if not no_postgres():
        pytest.skip("PostgreSQL is installed: the server runs on it (test above)")
    assert_nothing_lost(run_load("server-sqlite", tmp_path))


def test_concurrent_trials_on_sqlite_get_the_sweeps_own_server(tmp_path, monkeypatch):
    """The default: concurrent trials on a sqlite:/// store log through a server over that file,
    started for the sweep's duration (the 8-trial load through a server is measured above and in
    benchmarks/results/tracking_load/tracking_load.md; test_sweep's 2-at-a-time sweeps run through
    this one)."""
    from attent.experiment.files import load_experiment
    from attent.sweep.tune import DIRECT_SQLITE_ENV, _trial_tracking

    monkeypatch.delenv(DIRECT_SQLITE_ENV, raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    base = load_experiment(REPO / "experiments/digits_vit.yaml", [f"mlflow.tracking_uri={uri}"]).resolved()
    with _trial_tracking(base, 1) as one_at_a_time:
        assert one_at_a_time is None  # nothing to share: trials write the file as before
    with _trial_tracking(base, 8) as url:
        assert url.startswith("http://127.0.0.1:")
        client = MlflowClient(url)
        run = client.create_run(client.create_experiment("through-the-sweep-server"))
        client.log_metric(run.info.run_id, "m", 1.0)
    assert MlflowClient(uri).get_run(run.info.run_id).data.metrics == {"m": 1.0}  # into the same file
    assert (tmp_path / SWEEP_SERVER_LOG).exists()
    with pytest.raises(urllib.error.URLError):  # stopped with the sweep
        urllib.request.urlopen(f"{url}/health", timeout=5)
    monkeypatch.setenv(DIRECT_SQLITE_ENV, "1")
    with _trial_tracking(base, 8) as direct:
        assert direct is None
