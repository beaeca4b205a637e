"""Preflight of the MLflow tracking store: it answers (a short HTTP probe of ``<uri>/health``,
never MLflow's client, which retries an unreachable server for minutes) and its API accepts our
Host header (one read-only API call), or, for SQLite, can be written. Nothing is created: an
existing store stays untouched."""

from __future__ import annotations

import os
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...config import PreflightError, sqlite_file

TRACKING_PROBE_TIMEOUT_S = 5.0


def check_tracking(uri: str | None, *, timeout: float = TRACKING_PROBE_TIMEOUT_S) -> None:
    """Refuse a tracking URI that cannot work: an HTTP(S) server that does not answer within
    ``timeout`` seconds, or a SQLite file whose directory is missing or read-only. Other
    schemes (databricks, postgresql, ...) are left to MLflow."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("http", "https"):
        _check_http(uri, timeout)
    elif scheme == "sqlite":
        _check_sqlite(uri)
    elif scheme in ("", "file"):
        path = Path(urlsplit(uri).path if scheme == "file" else uri)
        _check_writable_dir(_nearest_existing(path), uri, "the MLflow file store")


_FIX_URI = (
    "or set mlflow.tracking_uri (or $MLFLOW_TRACKING_URI) to a reachable server or to a "
    "local store such as sqlite:///mlflow.db"
)


def _check_http(uri: str, timeout: float) -> None:
    parts = urlsplit(uri)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    netloc = f"[{host}]" if ":" in host else host  # credentials never go into the probe or a message
    base = f"{parts.scheme}://{netloc}:{port}{parts.path.rstrip('/')}"
    problem = _probe(base + "/health", timeout)
    if problem is None:
        refused = _host_refused(base + API_PROBE, timeout)
        if refused:
            raise PreflightError(
                f"MLflow tracking server {base} answers /health but refuses its API: it does not accept the "
                f"Host header {refused!r} (MLflow's guard against DNS rebinding answered HTTP 403); nothing was "
                f"run or recorded. Fix: restart the server accepting that name, `attent server --allowed-hosts "
                f"{refused}` (or `mlflow server --allowed-hosts {refused}`), or use the address it accepts"
            )
        return
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        start = (
            f"start it (`mlflow server --host 127.0.0.1 --port {port} --backend-store-uri "
            f"sqlite:///mlflow.db`, or `attent ui --port {port}`)"
        )
    else:
        start = f"start the server on {host} (`mlflow server --host 0.0.0.0 --port {port}` there)"
    raise PreflightError(
        f"MLflow tracking server {base} is unreachable ({problem}); nothing was run "
        f"or recorded. Fix: {start}, {_FIX_URI}"
    )


def _probe(url: str, timeout: float) -> str | None:
    """None if a server answers ``url``; else what went wrong. Any HTTP answer but a gateway
    error counts: a server behind auth or a prefix may refuse /health but is there. The request
    runs in a thread so that a slow DNS lookup cannot outlast ``timeout`` either."""
    result: list[str | None] = []

    def attempt() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout):
                result.append(None)
        except urllib.error.HTTPError as exc:
            result.append(f"it answered HTTP {exc.code}" if exc.code in (502, 503, 504) else None)
        except urllib.error.URLError as exc:
            # A TLS complaint comes from a server that is there: its certificates are MLflow's
            # business ($MLFLOW_TRACKING_SERVER_CERT_PATH, $MLFLOW_TRACKING_INSECURE_TLS).
            result.append(None if isinstance(exc.reason, ssl.SSLError) else _reason(exc.reason))
        except Exception as exc:  # socket.timeout, ConnectionResetError, http.client errors...
            result.append(_reason(exc))

    thread = threading.Thread(target=attempt, name="attent-tracking-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return result[0] if result else f"no answer within {timeout:g}s"


API_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"  # the cheapest call through MLflow's API
HOST_REFUSED = "Invalid Host header"  # MLflow 3's 403 body when its --allowed-hosts lacks the name


def _host_refused(url: str, timeout: float) -> str | None:
    """The Host header a server's API refuses with MLflow's host check (HTTP 403), else None.
    Any other answer, authentication refusals included, is MLflow's client's to handle."""
    result: list[str | None] = []
    host = urlsplit(url).netloc

    def attempt() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout):
                result.append(None)
        except urllib.error.HTTPError as exc:
            body = exc.read(512).decode("utf-8", "replace") if exc.code == 403 else ""
            result.append(host if HOST_REFUSED in body else None)
        except Exception:  # unreachable now: /health answered; MLflow's client will say more
            result.append(None)

    thread = threading.Thread(target=attempt, name="attent-tracking-api-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return result[0] if result else None


def _reason(exc: Any) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError) or "timed out" in str(exc):
        return "no answer within the probe's timeout"
    return str(getattr(exc, "strerror", None) or exc) or type(exc).__name__


def _check_sqlite(uri: str) -> None:
    db = sqlite_file(uri)
    if db is None:
        return
    if db.exists():
        if db.is_dir():
            raise PreflightError(
                f"MLflow store {uri}: {db} is a directory, not a database file; "
                f"point mlflow.tracking_uri (or $MLFLOW_TRACKING_URI) at a file, "
                f"e.g. sqlite:///{db}/mlflow.db"
            )
        if not os.access(db, os.R_OK | os.W_OK):
            raise PreflightError(
                f"MLflow store {uri}: {db} is not writable by this user; fix its "
                f"permissions or set mlflow.tracking_uri (or $MLFLOW_TRACKING_URI) "
                f"to sqlite:///<a writable path>/mlflow.db"
            )
    parent = db.parent
    if not parent.is_dir():
        raise PreflightError(
            f"MLflow store {uri}: directory {parent} does not exist; create it "
            f"(`mkdir -p {parent}`) or set mlflow.tracking_uri (or "
            f"$MLFLOW_TRACKING_URI) to sqlite:///<an existing directory>/mlflow.db"
        )
    # SQLite writes its journal beside the database, so the directory must be writable too.
    _check_writable_dir(parent, uri, "the MLflow store")


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_writable_dir(directory: Path, uri: str, what: str) -> None:
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PreflightError(
            f"{what} {uri}: directory {directory} is not writable by this user; fix "
            f"its permissions or set mlflow.tracking_uri (or $MLFLOW_TRACKING_URI) to "
            f"sqlite:///<a writable path>/mlflow.db"
        )
