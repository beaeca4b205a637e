"""`attent server`: one MLflow tracking server that every trial, worker and machine logs
through, over HTTP, into a SQL database (PostgreSQL for a cluster; SQLite for one machine).

The server owns the database and the artifacts: clients send metrics, params and artifact
uploads over HTTP (``--serve-artifacts``, MLflow's default, proxies them into
``--artifacts-destination``), so workers on other machines need no shared file system and no
database driver, and MLflow's client retries a refused or failed request instead of dropping it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..engine.tracking_defaults import is_loopback

if TYPE_CHECKING:
    from .auth import AuthSpec

DEFAULT_BACKEND = "sqlite:///mlflow.db"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 5000
DEFAULT_WORKERS = 4  # MLflow's own default: requests of concurrent trials in parallel
SQL_DIALECTS = ("sqlite", "postgresql", "mysql", "mssql")  # what MLflow's SQLAlchemy store takes
READY_TIMEOUT_S = 120.0  # a first start migrates a fresh database (PostgreSQL: ~10 s)
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
# MLflow 3's job runner: a runner and 7 huey consumer processes per server, for GenAI jobs (LLM
# judges, prompt optimisation, issue detection) that attent never submits. Off unless set.
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


@dataclass(frozen=True)
class ServerSpec:
    backend_store_uri: str  # SQL database URI (absolute sqlite:////… path, postgresql+psycopg2://…)
    artifacts_destination: str  # where proxied artifact uploads land (directory or s3://…)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    workers: int = DEFAULT_WORKERS
    allowed_hosts: str | None = None  # None: allowed_hosts_for(host)
    auth: AuthSpec | None = None  # MLflow's basic-auth app (attent.server.auth), or none
    tls_cert: str | None = None  # PEM certificate (chain) and its key: HTTPS, served by uvicorn itself
    tls_key: str | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def url(self) -> str:
        """The MLFLOW_TRACKING_URI clients use (a wildcard bind is reached by this machine's name)."""
        host = socket.getfqdn() if self.host in WILDCARD_HOSTS else self.host
        return f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{self.port}"


def local_url(host: str, port: int, scheme: str = "http") -> str:
    """Where this machine reaches a server bound to ``host`` (a wildcard bind: over loopback)."""
    if host in WILDCARD_HOSTS:
        host = "::1" if ":" in host else "127.0.0.1"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def is_sql_uri(uri: str | None) -> bool:
    """A SQLAlchemy database URI (``postgresql+psycopg2://`` counts as ``postgresql``)."""
    scheme = urlsplit(uri or "").scheme.lower()
    return scheme.split("+", 1)[0] in SQL_DIALECTS


def check_backend(uri: str) -> None:
    """Refuse a backend that is no SQL database: MLflow's file store (``./mlruns``, ``file:``)
    has no transactions, so concurrent writers can overwrite each other's files."""
    if not is_sql_uri(uri):
        raise ValueError(
            f"--backend-store-uri {uri} is a file store, not a SQL database: concurrent "
            f"trials would write it without transactions. Give sqlite:///mlflow.db (one "
            f"machine) or postgresql+psycopg2://user@host/db (a cluster)"
        )


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another process listens on, or an address that is not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"port {port} on {host} is taken (another `attent server`/`attent ui` "
                    f"or MLflow?); stop it or pass --port N"
                ) from None
            raise ValueError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass --host with "
                f"an address of this machine, 127.0.0.1 or 0.0.0.0"
            ) from None


def allowed_hosts_for(host: str) -> list[str]:
    """Host headers the server accepts: MLflow's defaults (localhost, private IPs, any port),
    plus, when it listens beyond loopback, this machine's names and the bound address itself,
    so workers that reach it as http://<hostname>:PORT or a public IP are not answered 403."""
    from mlflow.server.security_utils import get_default_allowed_hosts

    allowed = list(get_default_allowed_hosts())
    if is_loopback(host):
        return allowed
    names = {socket.gethostname(), socket.getfqdn()}
    if host not in WILDCARD_HOSTS:
        names.add(f"[{host}]" if ":" in host else host)
    for name in sorted(n for n in names if n):
        allowed += [name, f"{name}:*"]
    return allowed


def wants_auth(host: str, auth: bool | None) -> bool:
    """Authentication (``attent.server.auth``) on unless asked otherwise beyond loopback; off unless asked on loopback."""
    return (not is_loopback(host)) if auth is None else auth


def server_command(spec: ServerSpec) -> list[str]:
    """The `mlflow server` command line; artifacts are proxied (clients upload over HTTP); with
    ``spec.auth``, MLflow's basic-auth app; with a certificate, HTTPS from uvicorn's own TLS."""
    allowed = spec.allowed_hosts or ",".join(allowed_hosts_for(spec.host))
    auth = ["--app-name", "basic-auth"] if spec.auth is not None else []
    tls = (
        ["--uvicorn-opts", f"--ssl-certfile {shlex.quote(spec.tls_cert)} --ssl-keyfile {shlex.quote(spec.tls_key)}"]
        if spec.tls_cert and spec.tls_key
        else []
    )
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        spec.backend_store_uri,
        "--serve-artifacts",
        "--artifacts-destination",
        spec.artifacts_destination,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--workers",
        str(spec.workers),
        "--allowed-hosts",
        allowed,
        *auth,
        *tls,
    ]


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every MLflow server attent starts runs in: this process's, with MLflow's
    job runner off unless the user set ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION`` themselves, and
    ``extra`` (the auth app's settings and secrets: in the environment, never on the command line
    that `ps` shows)."""
    env = dict(os.environ)
    env.setdefault(JOB_EXECUTION_ENV, "false")
    return env | (extra or {})


def resolve_artifacts(destination: str, base: Path) -> str:
    """A local artifacts directory made absolute (so the server's cwd does not matter);
    URIs (s3://, gs://, file://) unchanged."""
    if "://" in destination or destination.startswith("mlflow-artifacts:"):
        return destination
    return str((base / destination).resolve())


def check_spec(spec: ServerSpec) -> None:
    """Everything refused before the server starts, each with its fix."""
    check_backend(spec.backend_store_uri)
    if spec.workers < 1:
        raise ValueError(f"--workers {spec.workers}: give at least 1")
    check_tls(spec.tls_cert, spec.tls_key)
    check_port_free(spec.host, spec.port)


def check_tls(cert: str | None, key: str | None) -> None:
    """A certificate needs its key, both readable, the key by its owner alone."""
    if bool(cert) != bool(key):
        raise ValueError("HTTPS needs both --tls-cert (the PEM certificate) and --tls-key (its private key)")
    for given in (cert, key):
        if given and not Path(given).is_file():
            raise ValueError(f"{given} is no file: give the PEM certificate and key the server presents")
    if key and Path(key).stat().st_mode & 0o077:
        raise ValueError(f"the TLS key {key} can be read by other users: chmod 600 {key}")


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def start(
    spec: ServerSpec, log_path: Path, *, die_with_parent: bool = False, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start the server in its own process group (output to ``log_path``); wait_ready next.
    ``die_with_parent``: the kernel stops it if this process dies, even by SIGKILL (Linux)."""
    check_spec(spec)
    with open(log_path, "ab") as log:
        return launch(server_command(spec), log, die_with_parent=die_with_parent, env=env)


def launch(
    command: list[str], output=None, *, die_with_parent: bool = False, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """An MLflow server command in its own process group (``stop`` ends it and its workers), in
    ``server_env(env)``; its output to the file ``output`` or, without one, to this process's."""
    prctl = _prctl() if die_with_parent else None
    # In the child before exec: SIGTERM when the parent dies (PR_SET_PDEATHSIG = 1 survives exec);
    # prctl is looked up here, so the child only makes the call (no import after fork).
    on_start = (lambda: prctl(1, signal.SIGTERM)) if prctl else None
    return subprocess.Popen(
        command,
        stdout=output,
        stderr=subprocess.STDOUT if output else None,
        env=server_env(env),
        start_new_session=True,
        preexec_fn=on_start,
    )


def serve_in_foreground(
    command: list[str],
    url: str,
    on_ready: Callable[[], None],
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Run an MLflow server until it exits, Ctrl-C or SIGTERM: its output goes to ``log_path``
    (its access log is no news to a person; None: this terminal), and ``on_ready`` (printing its
    links) runs once ``<url>/health`` answers, so a link printed is a link that opens. Returns
    the server's exit code (0 when stopped here)."""
    # SIGTERM and SIGHUP (a closed terminal) end this process through the ``finally`` below, as
    # Ctrl-C does, so the server's process group never outlives it.
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, _raise_interrupt)
    log = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")
    process = launch(command, log, die_with_parent=True, env=env)
    try:
        try:
            wait_ready(url, process, timeout=float("inf"))  # a big store's migration takes what it takes
        except RuntimeError as error:
            raise RuntimeError(f"{error}; its output: {log_path}" if log_path else str(error)) from None
        on_ready()
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if process.poll() is None:
            stop(process)
        if log is not None:
            log.close()


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _prctl():
    """libc's prctl, or None where there is none (not Linux: the caller's finally still stops it)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def stop(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """Stop the server and its worker processes (its whole process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def serving(spec: ServerSpec, log_path: Path) -> Iterator[str]:
    """A server for the duration of a ``with`` block (stopped with this process at the latest);
    yields its URL once it answers."""
    process = start(spec, log_path, die_with_parent=True)
    try:
        wait_ready(spec.url, process)
        yield spec.url
    finally:
        stop(process)


def wait_ready(url: str, process: subprocess.Popen | None = None, timeout: float = READY_TIMEOUT_S) -> None:
    """Return once ``<url>/health`` answers; raise if ``process`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    # Our own child on this machine: whether it answers is asked, not whom its certificate names.
    context = ssl._create_unverified_context() if url.startswith("https:") else None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the MLflow server exited with code {process.returncode} before it answered")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2, context=context):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.25)
    raise RuntimeError(f"the MLflow server at {url} did not answer within {timeout:g}s")
