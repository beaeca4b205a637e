"""`attent server`'s authentication without a real server: where the users and secrets go and
with which modes, when authentication is on, what the server's command line and environment
hold, and the refusal of a server open to the network that cannot require users. The real
server, users and permissions: tests/system/test_server_auth.py; the clients' side:
test_server_auth_clients.py."""

from __future__ import annotations

import stat
import threading

import pytest
from attent.cli.main import main as attent_main
from attent.server import app as server
from attent.server import auth as server_auth


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- the server's side --------------------------------------------------------------------------


def test_users_and_secrets_lie_beside_the_store(tmp_path):
    sqlite = server_auth.auth_spec(f"sqlite:///{tmp_path}/mlflow.db", None, "READ", tmp_path / "cwd")
    assert sqlite.directory == tmp_path / "mlflow-auth"
    assert sqlite.database_uri == f"sqlite:///{tmp_path}/mlflow-auth/users.db"
    postgres = "postgresql+psycopg2://mlflow@db/mlflow"
    spec = server_auth.auth_spec(postgres, None, "READ", tmp_path)
    assert spec.database_uri == postgres  # MLflow's auth tables beside the tracking store's
    assert spec.directory == tmp_path / "mlflow-auth"
    assert server_auth.auth_spec(postgres, "/shared/auth", "READ", tmp_path).directory.as_posix() == "/shared/auth"


@pytest.mark.parametrize(
    "host,asked,on",
    [("127.0.0.1", None, False), ("127.0.0.1", True, True), ("0.0.0.0", None, True), ("10.0.1.23", None, True)]
    + [("0.0.0.0", False, False), ("::1", None, False), ("localhost", None, False)],
)
def test_authentication_is_on_beyond_loopback_unless_turned_off(host, asked, on):
    assert server.wants_auth(host, asked) is on


def test_secrets_are_made_once_private_and_kept(tmp_path):
    spec = server_auth.auth_spec(f"sqlite:///{tmp_path}/mlflow.db", None, "NO_PERMISSIONS", tmp_path)
    first = server_auth.prepare(spec)
    folder = tmp_path / "mlflow-auth"
    assert mode(folder) == 0o700
    for name in ("basic_auth.ini", "flask_secret", "admin_password", "users.db"):
        assert mode(folder / name) == 0o600, name
    password = (folder / "admin_password").read_text().strip()
    assert len(password) >= 24 and password != "password1234"
    assert first["MLFLOW_AUTH_ADMIN_PASSWORD"] == password
    assert first["MLFLOW_FLASK_SERVER_SECRET_KEY"] == (folder / "flask_secret").read_text().strip()
    config = (folder / "basic_auth.ini").read_text()
    assert "default_permission = NO_PERMISSIONS" in config and "users.db" in config
    assert password not in config and first["MLFLOW_FLASK_SERVER_SECRET_KEY"] not in config
    assert server_auth.prepare(spec) == first  # a restart, or a second server on the folder: the same secrets


def test_mlflow_reads_the_credential_cache_it_is_given(tmp_path, monkeypatch):
    """A verified password is trusted for AUTH_CACHE_SECONDS (a scrypt check at every request cost the
    server 232 ms of CPU a logged metric, 9.9 ms with it: docs/guides/server.md), as MLflow's
    own reader of the file takes it."""
    from mlflow.server.auth.config import read_auth_config

    spec = server_auth.auth_spec(f"sqlite:///{tmp_path}/mlflow.db", None, "NO_PERMISSIONS", tmp_path)
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", server_auth.prepare(spec)["MLFLOW_AUTH_CONFIG_PATH"])
    config = read_auth_config()
    assert config.auth_cache_ttl_seconds == server_auth.AUTH_CACHE_SECONDS > 0
    assert config.authorization_function == server_auth.AUTH_FUNCTION


def test_the_users_database_is_readable_by_its_owner_alone(tmp_path):
    """users.db was 0644 (the umask's) inside its 0700 folder: made 0600 before MLflow opens it, a
    database an earlier start left wider narrowed, its content kept; PostgreSQL's users make no file."""
    import sqlite3

    spec = server_auth.auth_spec(f"sqlite:///{tmp_path}/mlflow.db", None, "READ", tmp_path)
    server_auth.prepare(spec)
    users = tmp_path / "mlflow-auth" / "users.db"
    assert mode(users) == 0o600 and users.stat().st_size == 0  # SQLite takes an empty file for a new database
    with sqlite3.connect(users) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    users.chmod(0o644)
    server_auth.prepare(spec)
    assert mode(users) == 0o600
    with sqlite3.connect(users) as db:
        assert db.execute("SELECT count(*) FROM users").fetchone() == (0,)
    postgres = server_auth.auth_spec("postgresql+psycopg2://db/mlflow", "pg-auth", "READ", tmp_path)
    server_auth.prepare(postgres)
    assert sorted(p.name for p in (tmp_path / "pg-auth").iterdir()) == [
        "admin_password",
        "basic_auth.ini",
        "flask_secret",
    ]


def test_a_secret_others_can_read_is_refused_with_the_chmod(tmp_path):
    spec = server_auth.auth_spec(f"sqlite:///{tmp_path}/mlflow.db", None, "READ", tmp_path)
    server_auth.prepare(spec)
    (tmp_path / "mlflow-auth" / "flask_secret").chmod(0o644)
    with pytest.raises(ValueError, match=r"flask_secret can be read by other users \(mode 0644\).*chmod 600"):
        server_auth.prepare(spec)


def test_two_servers_making_the_secret_at_once_agree(tmp_path):
    made = []

    def make():
        made.append(1)
        return f"secret-{len(made)}"

    target = tmp_path / "flask_secret"
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(server_auth.private_file(target, make))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and mode(target) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_the_command_line_holds_no_secret_and_tls_goes_to_uvicorn(tmp_path):
    auth = server_auth.auth_spec(f"sqlite:///{tmp_path}/mlflow.db", None, "READ", tmp_path)
    secrets_env = server_auth.prepare(auth)
    spec = server.ServerSpec(
        f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "a"), auth=auth, tls_cert="/c/cert.pem", tls_key="/c/k.pem"
    )
    command = server.server_command(spec)
    assert command[command.index("--app-name") + 1] == "basic-auth"
    assert command[command.index("--uvicorn-opts") + 1] == "--ssl-certfile /c/cert.pem --ssl-keyfile /c/k.pem"
    assert spec.url.startswith("https://")
    for value in secrets_env.values():  # `ps` shows a command line to every user of the machine
        assert value in server.server_env(secrets_env).values()
        if "/" not in value:
            assert not [word for word in command if value in word]


def test_tls_needs_a_private_key_beside_its_certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("x")
    key.write_text("x")
    with pytest.raises(ValueError, match="both --tls-cert"):
        server.check_tls(str(cert), None)
    key.chmod(0o644)
    with pytest.raises(ValueError, match=f"chmod 600 {key}"):
        server.check_tls(str(cert), str(key))
    key.chmod(0o600)
    server.check_tls(str(cert), str(key))


def test_a_server_open_to_the_network_without_the_auth_app_is_refused_naming_the_fix(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "flask_wtf", None)  # as where the `server` extra is not installed
    monkeypatch.chdir(tmp_path)
    port = server.free_port("0.0.0.0")
    assert attent_main(["server", "--host", "0.0.0.0", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "pip install 'attent[server]'" in err[0] and "--no-auth" in err[0]
    assert not (tmp_path / "mlflow-auth").exists()


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-local.yaml"])
def test_the_clusters_server_requires_users_and_every_node_gets_them_as_the_ray_token(name):
    """The head's server listens on its private address with users (never --no-auth), its secrets
    kept on the head across `ray up`s; the MLflow credentials file is mounted on every node as
    Ray's token is."""
    import yaml

    from tests.helpers.paths import REPO

    cfg = yaml.safe_load((REPO / name).read_text())
    head = " ".join(cfg["head_start_ray_commands"])
    assert "attent server" in head and "--auth --auth-dir ~/mlflow-auth" in head and "--no-auth" not in head
    mounts = cfg["file_mounts"]
    assert mounts["~/.mlflow/credentials"] == "~/.mlflow/credentials"
    assert mounts["~/.ray/auth_token"] == "~/.ray/auth_token"


def serve(monkeypatch, tmp_path, *argv: str) -> dict:
    """`attent server ARGV` up to the server's start, which is recorded instead of run."""
    started = {}

    def record(command, url, on_ready, log_path=None, env=None):
        started.update(command=command, url=url, env=env)
        on_ready()
        return 0

    monkeypatch.setattr(server, "serve_in_foreground", record)
    monkeypatch.chdir(tmp_path)
    assert attent_main(["server", "--port", str(server.free_port("0.0.0.0")), *argv]) == 0
    return started


def test_loopback_serves_without_users_unless_asked(monkeypatch, tmp_path, capsys):
    assert "--app-name" not in serve(monkeypatch, tmp_path)["command"]
    assert not (tmp_path / "mlflow-auth").exists()
    started = serve(monkeypatch, tmp_path, "--auth")
    assert "basic-auth" in started["command"] and started["env"]["MLFLOW_AUTH_ADMIN_PASSWORD"]


def test_beyond_loopback_users_are_required_and_the_password_file_named_never_shown(monkeypatch, tmp_path, capsys):
    started = serve(monkeypatch, tmp_path, "--host", "0.0.0.0")
    assert started["command"][started["command"].index("--app-name") + 1] == "basic-auth"
    password = (tmp_path / "mlflow-auth" / "admin_password").read_text().strip()
    assert started["env"]["MLFLOW_AUTH_ADMIN_PASSWORD"] == password
    assert not [word for word in started["command"] if password in word]
    out = capsys.readouterr().out
    assert f"the password of user 'admin' is in {tmp_path / 'mlflow-auth' / 'admin_password'}" in out
    assert password not in out


def test_no_auth_beyond_loopback_is_said_on_screen(monkeypatch, tmp_path, capsys):
    started = serve(monkeypatch, tmp_path, "--host", "0.0.0.0", "--no-auth")
    assert "--app-name" not in started["command"] and not started["env"]
    err = capsys.readouterr().err
    assert "WARNING: authentication is off (--no-auth) on 0.0.0.0" in err and "delete every experiment" in err


def test_a_stale_admin_password_file_is_said(tmp_path):
    import http.server

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)
            self.end_headers()

        def log_message(self, *args):
            pass

    spec = server_auth.auth_spec(f"sqlite:///{tmp_path}/mlflow.db", None, "READ", tmp_path)
    server_auth.prepare(spec)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        assert not server_auth.admin_password_works(f"http://127.0.0.1:{httpd.server_address[1]}", spec)
    finally:
        httpd.shutdown()
