"""The clients of a tracking server with authentication, without a real server: where their
credentials come from, how the driver hands them to Ray workers (the job's set-up hook, not Ray's
logged env_vars), what the preflight says to a server that refuses them (a stand-in server on
loopback), and that no password reaches what a run records."""

from __future__ import annotations

import base64
import contextlib
import http.server
import os
import pickle
import threading

import pytest
from attent.engine import credentials, ray_process
from attent.engine.preflight.store import check_tracking
from attent.experiment.schema import PreflightError

PASSWORD = "pw-Kq8zR2vT6yLm"


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    for name in credentials.CLIENT_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.mlflow/credentials of the machine's


def test_credentials_come_from_the_environment_else_mlflows_file(no_credentials, tmp_path, monkeypatch):
    assert not credentials.read_credentials()
    file = tmp_path / "home" / ".mlflow" / "credentials"
    file.parent.mkdir(parents=True)
    file.write_text(f"[mlflow]\nmlflow_tracking_username = alice\nmlflow_tracking_password = {PASSWORD}\n")
    found = credentials.read_credentials()
    assert (found.username, found.password, found.source) == ("alice", PASSWORD, "~/.mlflow/credentials")
    assert PASSWORD not in repr(found)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    assert credentials.read_credentials().username == "bob"  # each value: the environment's first
    assert credentials.client_env() == {"MLFLOW_TRACKING_USERNAME": "bob", "MLFLOW_TRACKING_PASSWORD": PASSWORD}


def test_redaction_hides_the_password_and_any_written_into_a_url(no_credentials, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    text = f"run {PASSWORD} at http://alice:other-secret@head:5000/x and sqlite:///m.db"
    assert credentials.redact(text) == "run *** at http://alice:***@head:5000/x and sqlite:///m.db"
    assert credentials.redact_uri("https://alice:s3@head:5000/p") == "https://alice:***@head:5000/p"
    assert credentials.uri_has_password("http://alice:s3@head:5000") and not credentials.uri_has_password(
        "http://head:5000"
    )


def test_workers_get_the_credentials_through_the_jobs_setup_hook_not_its_env_vars():
    assert ray_process.setup_hook({}, local=False) is None
    assert ray_process.setup_hook({}, local=True) == "attent.engine.ray_process.own_cluster"
    env = {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    hook = ray_process.setup_hook(env, local=False)
    assert PASSWORD not in repr(hook) and hook.__name__ == "attent_worker_setup"
    again = ray_process.setup_hook(env, local=False)
    assert pickle.dumps(hook) != pickle.dumps(again)  # a nonce: Ray's logged key is no hash of the password
    copy = pickle.loads(pickle.dumps(hook))  # as Ray ships it to a worker
    saved = {name: os.environ.get(name) for name in env}
    try:
        copy()
        assert {name: os.environ[name] for name in env} == env
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


class Guarded(http.server.BaseHTTPRequestHandler):
    """/health for anyone, the API for alice with PASSWORD alone (as MLflow's basic-auth app)."""

    def do_GET(self):
        expected = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
        ok = self.path.startswith("/health") or self.headers.get("Authorization") == expected
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b"{}" if ok else b"You are not authenticated.")

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def guarded_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Guarded)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def test_the_preflight_refuses_a_missing_or_wrong_password_in_one_line_naming_the_fix(no_credentials, monkeypatch):
    with guarded_server() as url:
        with pytest.raises(PreflightError) as missing:
            check_tracking(url)
        assert "asks for a user and password, and none is set (HTTP 401)" in str(missing.value)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong-" + PASSWORD)
        with pytest.raises(PreflightError) as wrong:
            check_tracking(url)
        message = str(wrong.value)
        assert "refused user 'alice' and the password from $MLFLOW_TRACKING_PASSWORD (HTTP 401)" in message
        assert "export MLFLOW_TRACKING_USERNAME" in message and "\n" not in message
        assert PASSWORD not in message
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
        check_tracking(url)


def test_the_preflight_refuses_a_password_written_into_the_tracking_uri(no_credentials):
    with pytest.raises(PreflightError) as refused:
        check_tracking(f"http://alice:{PASSWORD}@127.0.0.1:9/")
    assert PASSWORD not in str(refused.value)
    assert "http://alice:***@127.0.0.1:9/ carries a password" in str(refused.value)


def test_no_password_in_the_runs_params_tags_or_logged_config(no_credentials, monkeypatch, tmp_path, mlflow_uri):
    """A config that holds the password (a run named after it, a URL with one in it) is recorded
    with *** in its place."""
    from attent.engine.tracking import client_for, start_or_resume_run
    from attent.experiment.files import load_experiment

    from tests.helpers.paths import REPO

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    cfg = load_experiment(
        REPO / "experiments/digits_vit.yaml",
        [
            f"name=run-{PASSWORD}",
            f"mlflow.tracking_uri={mlflow_uri}",
            "train.init_weights=https://bob:hunter2hunter2@hub.example/w.pt",
            f"ray.storage_path={tmp_path}/ray",
        ],
    ).resolved()
    run_id, _ = start_or_resume_run(cfg)
    client = client_for(mlflow_uri)
    run = client.get_run(run_id)
    recorded = [*run.data.params.values(), *run.data.tags.values(), run.info.run_name]
    recorded.append(client.download_artifacts(run_id, "config.yaml", str(tmp_path)))
    recorded[-1] = open(recorded[-1]).read()
    text = "\n".join(recorded)
    assert PASSWORD not in text and "hunter2hunter2" not in text
    assert "run-***" in text and "https://bob:***@hub.example/w.pt" in text
