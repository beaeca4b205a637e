"""A real `attent server` with authentication, attacked from this machine over loopback: anonymous
requests to the API, the UI and artifacts; a READ user writing, deleting and granting itself more;
the admin's old default password; a wrong password given to `attent train`; and a search for the
password in everything a run and the server leave behind. An EDIT user's two-worker run on the
session's Ray cluster (whose processes never saw the credentials) logs through it and finishes.
Then the same users and permissions on PostgreSQL, the secrets across a restart, and HTTPS with a
self-signed certificate. Each server starts in its own process group and is stopped by it. (The
authentication without a real server: tests/server/test_server_auth.py.)"""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.auth_server import (
    add_user,
    as_user,
    attent,
    auth_server,
    files_holding,
    grant,
    refused,
    self_signed,
    status,
)
from tests.helpers.paths import REPO
from tests.helpers.processes import free_port

LEGACY_ADMIN_PASSWORD = "password1234"  # what MLflow's basic_auth.ini shipped before it shipped none


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory):
    """One server with authentication over SQLite, its admin, alice (EDIT on `shared`) and bob
    (READ on `shared`), and an artifact of the admin's to steal."""
    workdir = tmp_path_factory.mktemp("auth-sqlite")
    with auth_server(workdir) as (url, output):
        admin = (workdir / "mlflow-auth" / "admin_password").read_text().strip()
        users = {"admin": admin, "alice": add_user(url, workdir, "alice"), "bob": add_user(url, workdir, "bob")}
        grant(url, workdir, "alice", "shared", "EDIT")
        grant(url, workdir, "bob", "shared", "READ")
        with as_user("admin", admin, url) as client:
            experiment = client.get_experiment_by_name("shared").experiment_id
            run = client.create_run(experiment)
            client.log_text(run.info.run_id, "the admin's notes", "notes.txt")
        yield {"url": url, "workdir": workdir, "output": output, "users": users, "experiment": experiment, "run": run}


def test_the_server_prints_where_the_admins_password_is_never_the_password(sqlite_server):
    printed = sqlite_server["output"].read_text()
    password_file = sqlite_server["workdir"] / "mlflow-auth" / "admin_password"
    assert f"the password of user 'admin' is in {password_file}" in printed
    assert sqlite_server["users"]["admin"] not in printed


def test_anonymous_requests_are_refused_on_the_api_the_ui_and_artifacts(sqlite_server):
    url, run = sqlite_server["url"], sqlite_server["run"]
    artifact = run.info.artifact_uri.removeprefix("mlflow-artifacts:/") + "/notes.txt"
    paths = [
        "/api/2.0/mlflow/experiments/search?max_results=1",  # the REST API
        f"/api/2.0/mlflow/runs/get?run_id={run.info.run_id}",
        "/ajax-api/2.0/mlflow/experiments/search?max_results=1",  # what the UI's pages call
        "/",  # the UI
        "/signup",  # a user signing themselves up
        f"/get-artifact?path=notes.txt&run_uuid={run.info.run_id}",  # the UI's artifact download
        f"/api/2.0/mlflow-artifacts/artifacts/{artifact}",  # the proxied artifact store
    ]
    for path in paths:
        assert status(url + path) == 401, path
    admin = sqlite_server["users"]["admin"]
    assert status(f"{url}/api/2.0/mlflow-artifacts/artifacts/{artifact}", "admin", admin) == 200  # it is there
    assert status(url + "/health") == 200  # the one open route: liveness, no data
    assert status(f"{url}{paths[0]}", "alice", "not-" + sqlite_server["users"]["alice"]) == 401


def test_the_admins_old_default_password_is_refused(sqlite_server):
    assert status(f"{sqlite_server['url']}/api/2.0/mlflow/experiments/search", "admin", LEGACY_ADMIN_PASSWORD) == 401


def test_a_read_user_cannot_write_delete_or_grant_itself_more(sqlite_server):
    from mlflow.server import get_app_client

    url, experiment, users = sqlite_server["url"], sqlite_server["experiment"], sqlite_server["users"]
    with as_user("bob", users["bob"], url) as bob:
        assert bob.get_experiment(experiment).name == "shared"  # READ reads
        assert refused(lambda: bob.create_run(experiment)) == 403
        assert refused(lambda: bob.delete_experiment(experiment)) == 403
        assert refused(lambda: bob.log_metric(sqlite_server["run"].info.run_id, "m", 1.0)) == 403
        auth = get_app_client("basic-auth", tracking_uri=url)
        assert refused(lambda: auth.grant_user_permission("bob", "experiment", experiment, "MANAGE")) == 403
        assert refused(lambda: auth.create_user("mallory", "mallory-password-1")) == 403
        assert refused(lambda: auth.update_user_admin("bob", True)) == 403
    with as_user("alice", users["alice"], url) as alice:
        assert refused(lambda: alice.create_run(experiment)) is None  # EDIT writes ...
        assert refused(lambda: alice.delete_experiment(experiment)) == 403  # ... and deletes nothing


def experiment_yaml(workdir: Path, name: str, url: str) -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nseed: 0\n"
        "task: {name: vision, dataset: digits, img_size: 8, model: {preset: vit_tiny_cpu, patch_size: 2}}\n"
        "train: {epochs: 1, batch_size: 128}\nselection: {preset: vit}\n"
        f"ray: {{num_workers: 2, storage_path: {workdir / 'ray_results'}}}\n"
        f"mlflow: {{tracking_uri: '{url}', experiment: shared}}\n"
    )
    return path


def test_an_edit_users_two_worker_run_logs_through_the_server_and_no_password_is_left_anywhere(
    sqlite_server, ray_cluster
):
    url, workdir, users = sqlite_server["url"], sqlite_server["workdir"], sqlite_server["users"]
    assert "MLFLOW_TRACKING_PASSWORD" not in os.environ  # the cluster's processes never had it
    alice = {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": users["alice"]}
    done = attent("train", str(experiment_yaml(workdir, "authed", url)), cwd=workdir, env=alice)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with as_user("admin", users["admin"], url) as admin:
        runs = admin.search_runs([sqlite_server["experiment"]], "tags.`mlflow.runName` = 'authed'")
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"
        assert "eval_test_accuracy" in runs[0].data.metrics  # logged by a Ray Train worker, through the server
        assert runs[0].data.params["ray.num_workers"] == "2"

    wrong = {**alice, "MLFLOW_TRACKING_PASSWORD": "wrong-" + users["alice"]}
    stopped = attent("train", str(experiment_yaml(workdir, "wrong-password", url)), cwd=workdir, env=wrong)
    assert stopped.returncode == 2 and stopped.stdout == ""
    assert len(stopped.stderr.strip().splitlines()) == 1, stopped.stderr
    assert "refused user 'alice' and the password from $MLFLOW_TRACKING_PASSWORD (HTTP 401)" in stopped.stderr
    assert "export MLFLOW_TRACKING_USERNAME" in stopped.stderr
    assert not (workdir / "ray_results" / "wrong-password").exists()  # refused before Ray, before any worker

    # the store, the users, the artifacts, the runs' folders and logs, attent's and the server's logs,
    # what the commands printed, and every file of the Ray cluster (its logs on every "node")
    captured = workdir / "captured.txt"
    captured.write_text(done.stdout + done.stderr + stopped.stdout + stopped.stderr)
    roots = [workdir, ray_cluster["temp_dir"]]
    assert files_holding(users["alice"], roots) == [str(workdir / "mlflow-credentials-alice")]  # hers, 0600
    assert files_holding(wrong["MLFLOW_TRACKING_PASSWORD"], roots) == []
    assert files_holding(users["admin"], roots) == [str(workdir / "mlflow-auth" / "admin_password")]


def test_an_edit_users_sweep_logs_its_trials_through_the_server(sqlite_server, ray_cluster):
    """Two trials at once on the session's Ray cluster, each in its own Tune trial process there,
    which gets the credentials from the sweep's driver alone."""
    from tests.helpers import shared_runs

    url, workdir, users = sqlite_server["url"], sqlite_server["workdir"], sqlite_server["users"]
    grant(url, workdir, "alice", "authed-sweep", "EDIT")  # a sweep's experiment is its name
    spec = shared_runs.write_sweep(
        workdir, url, "authed-sweep", {"grid": {"selection.temperature": [0.5, 2.0]}, "max_concurrent": 2}
    )
    alice = {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": users["alice"]}
    done = attent("sweep", str(spec), cwd=workdir, env=alice)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with as_user("admin", users["admin"], url) as admin:
        experiment = admin.get_experiment_by_name("authed-sweep").experiment_id
        runs = admin.search_runs([experiment])
        assert sorted(run.info.status for run in runs) == ["FINISHED"] * 3  # the parent and its two trials
        assert all("eval_test_accuracy" in run.data.metrics for run in runs if "sweep" not in run.info.run_name)
    assert users["alice"] not in done.stdout + done.stderr
    assert files_holding(users["alice"], [workdir / "ray_results", ray_cluster["temp_dir"]]) == []


def test_a_legacy_default_admin_is_given_the_generated_password_and_secrets_survive_a_restart(tmp_path):
    """A users database left with MLflow's old default admin (password1234): the first start
    replaces that password with the generated one; a restart keeps both secrets."""
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    legacy = SqlAlchemyStore()
    (tmp_path / "mlflow-auth").mkdir(mode=0o700)
    legacy.init_db(f"sqlite:///{tmp_path / 'mlflow-auth' / 'users.db'}")
    legacy.create_user("admin", LEGACY_ADMIN_PASSWORD, is_admin=True)
    api = "/api/2.0/mlflow/experiments/search?max_results=1"
    with auth_server(tmp_path) as (url, _):
        admin = (tmp_path / "mlflow-auth" / "admin_password").read_text().strip()
        secret = (tmp_path / "mlflow-auth" / "flask_secret").read_text()
        assert status(url + api, "admin", LEGACY_ADMIN_PASSWORD) == 401
        assert status(url + api, "admin", admin) == 200
    assert not legacy.authenticate_user("admin", LEGACY_ADMIN_PASSWORD)  # replaced, not only refused
    with auth_server(tmp_path) as (url, _):
        assert (tmp_path / "mlflow-auth" / "admin_password").read_text().strip() == admin
        assert (tmp_path / "mlflow-auth" / "flask_secret").read_text() == secret
        assert status(url + api, "admin", admin) == 200


@contextlib.contextmanager
def throwaway_postgres():
    """The tracking-load study's throwaway PostgreSQL (run as a script: tests import no benchmark
    script), its URI; stopped when its stdin closes."""
    load = [sys.executable, str(REPO / "benchmarks" / "robustness" / "tracking_load.py")]
    why = subprocess.run([*load, "--why-no-postgres"], capture_output=True, text=True, check=True, timeout=60).stdout
    if why:
        pytest.skip(why)
    process = subprocess.Popen(
        [*load, "--serve-postgres", str(free_port())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield process.stdout.readline().strip()
    finally:
        process.stdin.close()
        process.wait(timeout=120)


def test_users_and_permissions_on_postgresql(tmp_path):
    with throwaway_postgres() as database, auth_server(tmp_path, "--backend-store-uri", database) as (url, _):
        import sqlalchemy

        tables = sqlalchemy.inspect(sqlalchemy.create_engine(database)).get_table_names()
        assert {"users", "experiments", "alembic_version_auth"} <= set(tables)  # one database, both stores
        bob = add_user(url, tmp_path, "bob")
        grant(url, tmp_path, "bob", "pg-shared", "READ")
        api = "/api/2.0/mlflow/experiments/search?max_results=1"
        assert status(url + api) == 401
        assert status(url + api, "admin", LEGACY_ADMIN_PASSWORD) == 401
        with as_user("bob", bob, url) as client:
            experiment = client.get_experiment_by_name("pg-shared").experiment_id
            assert refused(lambda: client.create_run(experiment)) == 403
            assert refused(lambda: client.delete_experiment(experiment)) == 403


def test_https_with_a_self_signed_certificate_trusted_only_where_given(tmp_path, monkeypatch):
    from attent.engine.preflight.store import check_tracking
    from attent.experiment.schema import PreflightError

    cert, key = self_signed(tmp_path)
    with auth_server(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key)) as (url, output):
        assert url.startswith("https://") and f"MLFLOW_TRACKING_URI={url}" in output.read_text()
        admin = (tmp_path / "mlflow-auth" / "admin_password").read_text().strip()
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin)
        monkeypatch.delenv("MLFLOW_TRACKING_SERVER_CERT_PATH", raising=False)
        with pytest.raises(PreflightError) as untrusted:  # a client without the certificate
            check_tracking(url)
        assert "does not trust" in str(untrusted.value) and "MLFLOW_TRACKING_SERVER_CERT_PATH" in str(untrusted.value)
        with as_user("admin", admin, url) as client:
            with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                client.search_experiments()
        monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(cert))  # a client given it
        check_tracking(url)
        with as_user("admin", admin, url) as client:
            run = client.create_run(client.create_experiment("over-tls"))
            client.log_text(run.info.run_id, "hello", "hello.txt")
            assert client.get_run(run.info.run_id).info.status == "RUNNING"
        trusted = ssl.create_default_context(cafile=str(cert))
        assert status(f"{url}/api/2.0/mlflow/experiments/search", context=trusted) == 401  # anonymous, over TLS too
        plain = url.replace("https://", "http://")
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no clear-text side door
            urllib.request.urlopen(f"{plain}/health", timeout=10)
