"""Preflight of the MLflow tracking store: it answers (a short HTTP probe of ``<uri>/health``,
never MLflow's client, which retries an unreachable server for minutes), its TLS certificate is
trusted, and its API accepts our Host header and credentials (one read-only API call), or, for
SQLite, can be written. Nothing is created: an existing store stays untouched."""

from __future__ import annotations

import base64
import os
import ssl
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...experiment.schema import PreflightError
from ...experiment.uris import sqlite_file
from ..credentials import (
    FIX,
    INSECURE_TLS_ENV,
    SERVER_CERT_ENV,
    Credentials,
    read_credentials,
    redact_uri,
    uri_has_password,
)
from ..tracking_defaults import is_loopback

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
    if uri_has_password(uri):
        raise PreflightError(
            f"mlflow.tracking_uri {redact_uri(uri)} carries a password in its address, which would be recorded "
            f"with the run's params and config; nothing was run or recorded. Fix: drop it from the URI and {FIX}"
        )
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    netloc = f"[{host}]" if ":" in host else host  # credentials never go into the probe or a message
    base = f"{parts.scheme}://{netloc}:{port}{parts.path.rstrip('/')}"
    tls = tls_context() if parts.scheme == "https" else None
    problem = _probe(base + "/health", timeout, tls)
    if problem is None:
        _check_api(base, timeout, tls)
        return
    if problem.startswith(UNTRUSTED):
        raise PreflightError(
            f"MLflow tracking server {base} presents a TLS certificate this machine does not trust "
            f"({problem.removeprefix(UNTRUSTED)}); nothing was run or recorded. Fix: export "
            f"{SERVER_CERT_ENV}=<the server's certificate, or its CA's, as a PEM file>"
        )
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


def _check_api(base: str, timeout: float, tls: ssl.SSLContext | None) -> None:
    """One read-only API call, with the credentials MLflow's client would send: refused for the
    Host header (MLflow's DNS-rebinding guard) or for the user and password, each named."""
    credentials = read_credentials()
    status, body = _api_answer(base + API_PROBE, timeout, tls, credentials)
    netloc = urlsplit(base).netloc
    if status == 403 and HOST_REFUSED in body:
        raise PreflightError(
            f"MLflow tracking server {base} answers /health but refuses its API: it does not accept the "
            f"Host header {netloc!r} (MLflow's guard against DNS rebinding answered HTTP 403); nothing was "
            f"run or recorded. Fix: restart the server accepting that name, `attent server --allowed-hosts "
            f"{netloc}` (or `mlflow server --allowed-hosts {netloc}`), or use the address it accepts"
        )
    if status == 401:
        who = (
            f"refused user {credentials.username!r} and the password from {credentials.source}"
            if credentials
            else "asks for a user and password, and none is set"
        )
        raise PreflightError(f"MLflow tracking server {base} {who} (HTTP 401); nothing was run or recorded. Fix: {FIX}")
    if credentials and urlsplit(base).scheme == "http" and not is_loopback(urlsplit(base).hostname or ""):
        print(
            f"[attent] warning: the MLflow password goes to {base} over plain HTTP, readable on the network "
            "on its way: serve the tracking server over TLS (`attent server --tls-cert ... --tls-key ...`)",
            file=sys.stderr,
        )


def tls_context() -> ssl.SSLContext:
    """Whom an HTTPS probe trusts, as MLflow's client does: $MLFLOW_TRACKING_SERVER_CERT_PATH (or
    requests' $REQUESTS_CA_BUNDLE), else this machine's CAs; nobody checked with
    $MLFLOW_TRACKING_INSECURE_TLS=true."""
    if os.environ.get(INSECURE_TLS_ENV, "").strip().lower() in ("true", "1"):
        return ssl._create_unverified_context()
    cafile = os.environ.get(SERVER_CERT_ENV) or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    return ssl.create_default_context(cafile=cafile or None)


UNTRUSTED = "untrusted certificate: "


def _probe(url: str, timeout: float, tls: ssl.SSLContext | None = None) -> str | None:
    """None if a server answers ``url``; else what went wrong. Any HTTP answer but a gateway
    error counts: a server behind auth or a prefix may refuse /health but is there. A certificate
    this machine does not trust is named (``UNTRUSTED``). The request runs in a thread so that a
    slow DNS lookup cannot outlast ``timeout`` either."""
    result: list[str | None] = []

    def attempt() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout, context=tls):
                result.append(None)
        except urllib.error.HTTPError as exc:
            result.append(f"it answered HTTP {exc.code}" if exc.code in (502, 503, 504) else None)
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                result.append(UNTRUSTED + (exc.reason.verify_message or str(exc.reason)))
            else:  # another TLS complaint comes from a server that is there: MLflow's client says more
                result.append(None if isinstance(exc.reason, ssl.SSLError) else _reason(exc.reason))
        except Exception as exc:  # socket.timeout, ConnectionResetError, http.client errors...
            result.append(_reason(exc))

    thread = threading.Thread(target=attempt, name="attent-tracking-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return result[0] if result else f"no answer within {timeout:g}s"


API_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"  # the cheapest call through MLflow's API
HOST_REFUSED = "Invalid Host header"  # MLflow 3's 403 body when its --allowed-hosts lacks the name


def _api_answer(
    url: str, timeout: float, tls: ssl.SSLContext | None, credentials: Credentials
) -> tuple[int | None, str]:
    """The HTTP status and the start of the body of a GET of ``url`` with the credentials (basic
    auth, as MLflow's client sends them); (None, '') when no answer came: /health answered, so
    MLflow's client will say more."""
    result: list[tuple[int | None, str]] = []
    headers = {}
    if credentials:
        token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"

    def attempt() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout, context=tls):
                result.append((200, ""))
        except urllib.error.HTTPError as exc:
            result.append((exc.code, exc.read(512).decode("utf-8", "replace")))
        except Exception:
            result.append((None, ""))

    thread = threading.Thread(target=attempt, name="attent-tracking-api-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return result[0] if result else (None, "")


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
