"""Preflight of the MLflow tracking store: a server that answers its health check passes; a
gateway error, a closed port or a silent server is refused in seconds with the fix in the message;
a SQLite store is checked without being created; a user who may only read the run's experiment is
refused naming the grant. Real HTTP servers and sockets."""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time

import pytest
from attent.engine.preflight import store
from attent.experiment.schema import PreflightError

from tests.helpers.processes import free_port


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802
        code = self.status if self.path.endswith("/health") else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"OK" if code == 200 else b"no")

    def log_message(self, *args):
        pass


def serve(status: int):
    handler = type("H", (_Health,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_server_that_answers_health_passes():
    server = serve(200)
    try:
        store.check_tracking(f"http://127.0.0.1:{server.server_port}")
        store.check_tracking(f"http://127.0.0.1:{server.server_port}/")
    finally:
        server.shutdown()


def test_a_gateway_error_is_refused():
    server = serve(503)
    try:
        with pytest.raises(PreflightError, match="HTTP 503"):
            store.check_tracking(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()


def test_a_closed_port_is_refused_at_once_naming_the_fix():
    port = free_port()  # bound then released: nothing listens there
    start = time.monotonic()
    with pytest.raises(PreflightError) as err:
        store.check_tracking(f"http://127.0.0.1:{port}")  # one with a password in it: test_server_auth
    elapsed = time.monotonic() - start
    msg = str(err.value)
    assert isinstance(err.value, ValueError)  # the CLI's one-line error, exit 2
    assert "unreachable (connection refused)" in msg
    assert f"mlflow server --host 127.0.0.1 --port {port}" in msg and f"attent ui --port {port}" in msg
    assert "mlflow.tracking_uri" in msg and "$MLFLOW_TRACKING_URI" in msg and "sqlite:///" in msg
    assert elapsed < 30, elapsed  # no retry loop (MLflow's client retries for minutes)


def test_a_server_that_never_answers_is_refused_after_the_timeout():
    with socket.socket() as listener:  # accepts connections, says nothing
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        start = time.monotonic()
        with pytest.raises(PreflightError, match="no answer"):
            store.check_tracking(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=1.0)
        assert time.monotonic() - start < 30


def test_sqlite_store_checks_touch_nothing(tmp_path):
    db = tmp_path / "mlflow.db"
    store.check_tracking(f"sqlite:///{db}")
    assert not db.exists()  # checked, not created
    with pytest.raises(PreflightError, match=r"does not exist; create it \(`mkdir -p"):
        store.check_tracking(f"sqlite:///{tmp_path / 'missing' / 'mlflow.db'}")
    with pytest.raises(PreflightError, match="is a directory"):
        store.check_tracking(f"sqlite:///{tmp_path}")
    store.check_tracking("postgresql://user@db.example/mlflow")  # left to MLflow
    store.check_tracking("databricks")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_sqlite_store_in_a_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(PreflightError, match="not writable"):
            store.check_tracking(f"sqlite:///{ro / 'mlflow.db'}")
    finally:
        ro.chmod(0o755)


class _Permissions(http.server.BaseHTTPRequestHandler):
    """A tracking server with users, as far as the permission check asks it: experiment `shared`
    exists (id 7), `hidden` is forbidden, others do not exist; the user's permission on 7 is set."""

    permission = "READ"

    def do_GET(self):  # noqa: N802
        import json

        if "get-by-name" in self.path:
            code, body = (
                (200, {"experiment": {"experiment_id": "7"}})
                if "=shared" in self.path
                else (403, {})
                if "=hidden" in self.path
                else (404, {"error_code": "RESOURCE_DOES_NOT_EXIST"})
            )
        elif "/users/permissions/get" in self.path and "resource_id=7" in self.path and "username=bob" in self.path:
            code, body = 200, {"allowed": False, "permission": self.permission}
        else:
            code, body = 404, {}
        self.send_response(code)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "experiment,permission,refused",
    [("shared", "READ", "READ"), ("shared", "NO_PERMISSIONS", "NO_PERMISSIONS"), ("hidden", "READ", "NO_PERMISSIONS"),
     ("shared", "EDIT", None), ("shared", "MANAGE", None), ("new-one", "READ", None)],
)  # fmt: skip
def test_a_user_who_may_only_read_the_experiment_is_refused_before_anything_runs(
    experiment, permission, refused, monkeypatch, tmp_path
):
    from attent.engine.preflight.permission import check_can_log

    handler = type("H", (_Permissions,), {"permission": permission})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials but these
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "bobs-password")
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        if refused is None:
            check_can_log(uri, experiment)
            return
        with pytest.raises(PreflightError) as error:
            check_can_log(uri, experiment)
        message = str(error.value)
        assert f"gives user 'bob' {refused} on experiment {experiment!r}" in message
        assert f"attent server grant bob {experiment} EDIT" in message and "bobs-password" not in message
        monkeypatch.delenv(
            "MLFLOW_TRACKING_PASSWORD"
        )  # no user: nothing to ask (the server's 401 is the store check's)
        check_can_log(uri, experiment)
    finally:
        server.shutdown()
