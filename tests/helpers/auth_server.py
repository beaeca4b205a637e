"""A real `attent server --auth` for the system tier's tests, and what they do with it: users added
and granted through `attent server`, MLflow's client as one of them, HTTP statuses, a self-signed
certificate, and a search for a secret in every file a run, a server or a Ray cluster leaves behind
(tests/system/test_server_auth.py, tests/system/test_rehearsal.py)."""

from __future__ import annotations

import base64
import configparser
import contextlib
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from attent.server import app as server

from tests.helpers.paths import BIN
from tests.helpers.processes import free_port, wait_for_line


@contextlib.contextmanager
def auth_server(workdir: Path, *args: str):
    """`attent server --auth` (one worker) in ``workdir``; yields (its URL, its output file)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    output = workdir / f"server-{port}.out"
    tls = "--tls-cert" in args
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "attent"), "server", "--auth", "--port", str(port), "--workers", "1", *args],
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "ATTENT_LOG_DIR": str(workdir / "logs")},
        )
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        server.wait_ready(url, proc)
        wait_for_line(output, "MLFLOW_TRACKING_URI=")
        yield url, output
    finally:
        server.stop(proc)


def status(url: str, user: str | None = None, password: str | None = None, context=None, method="GET") -> int:
    """The HTTP status of one request, with basic auth when a user is given."""
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers, method=method), context=context):
            return 200
    except urllib.error.HTTPError as error:
        return error.code


def attent(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "attent"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ATTENT_LOG_DIR": str(cwd / "logs"), **(env or {})},
    )


def add_user(url: str, workdir: Path, name: str, *admin: str, env: dict[str, str] | None = None) -> str:
    """A user added through `attent server users add`; its password, read from the file it wrote."""
    done = attent(
        "server", "users", "add", name, *admin, "--tracking-uri", url, "--admin-password-file", "mlflow-auth/admin_password",
        cwd=workdir, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    path = workdir / f"mlflow-credentials-{name}"
    assert str(path) in done.stdout and oct(path.stat().st_mode & 0o777) == "0o600"
    parser = configparser.ConfigParser()
    parser.read(path)
    password = parser["mlflow"]["mlflow_tracking_password"]
    assert password not in done.stdout + done.stderr
    return password


def grant(
    url: str, workdir: Path, name: str, experiment: str, permission: str, env: dict[str, str] | None = None
) -> None:
    done = attent(
        "server", "grant", name, experiment, permission, "--tracking-uri", url, "--admin-password-file",
        "mlflow-auth/admin_password", cwd=workdir, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def as_user(name: str | None, password: str | None, url: str, **extra: str):
    """MLflow's client as ``name`` (no retries: a refusal is the answer)."""
    from mlflow import MlflowClient

    values = {
        "MLFLOW_TRACKING_USERNAME": name,
        "MLFLOW_TRACKING_PASSWORD": password,
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        **extra,
    }
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update({key: value for key, value in values.items() if value is not None})
    try:
        yield MlflowClient(url)
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def refused(action) -> int | None:
    """The HTTP status MLflow's client was refused with (None: it was not)."""
    from mlflow.exceptions import MlflowException

    try:
        action()
    except MlflowException as error:
        return error.get_http_status_code()
    return None


def files_holding(needle: str, roots: list[Path]) -> list[str]:
    """Every regular file under ``roots`` whose bytes hold ``needle``."""
    found = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            try:
                if path.is_file() and not path.is_symlink() and needle.encode() in path.read_bytes():
                    found.append(str(path))
            except OSError:  # a socket, a file gone meanwhile
                continue
    return found


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (0600)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "attent test server")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path
