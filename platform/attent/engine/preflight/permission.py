"""Preflight of the user's permission on a run's MLflow experiment, on a tracking server with users
(`attent server` beyond loopback): a user who may only read the experiment (READ, or nothing) is
refused in one line before anything starts, not by an HTTP 403 from the driver's first write after Ray
and the workers started. Asked of the server itself, as the user MLflow's client sends: the experiment
by name, then the user's resolved permission on it (MLflow's ``users/permissions/get``). A server
without users, an experiment that does not exist yet (the user creates it, and manages what it
creates) or no answer says nothing here: MLflow's client says more."""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from urllib.parse import quote, urlsplit

from ...experiment.schema import PreflightError
from ..credentials import Credentials, read_credentials

WRITES = ("EDIT", "MANAGE")  # MLflow's permissions that log runs, metrics and artifacts (can_update)
TIMEOUT_S = 5.0


def check_can_log(uri: str | None, experiment: str, *, timeout: float = TIMEOUT_S) -> None:
    """Refuse a run into ``experiment`` that the user sent to the server at ``uri`` may not write."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    credentials = read_credentials()
    if not uri or urlsplit(uri).scheme not in ("http", "https") or not credentials:
        return
    from .store import tls_context

    parts = urlsplit(uri)
    base = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path.rstrip('/')}"
    tls = tls_context() if parts.scheme == "https" else None
    status, found = _get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name={quote(experiment)}",
                         credentials, tls, timeout)  # fmt: skip
    if status == 403:
        permission = "NO_PERMISSIONS"
    elif status != 200 or not found:
        return
    else:
        experiment_id = found.get("experiment", {}).get("experiment_id")
        query = (
            f"username={quote(credentials.username)}&resource_type=experiment&resource_id={quote(str(experiment_id))}"
        )
        status, answer = _get(f"{base}/api/3.0/mlflow/users/permissions/get?{query}", credentials, tls, timeout)
        if status != 200 or not answer or "permission" not in answer:
            return  # no users on this server, or an MLflow without that call
        permission = answer["permission"]
    if permission not in WRITES:
        raise PreflightError(
            f"MLflow tracking server {base} gives user {credentials.username!r} {permission} on experiment "
            f"{experiment!r}, and a run there needs EDIT; nothing was run or recorded. Fix: the server's admin "
            f"grants it (`attent server grant {credentials.username} {experiment} EDIT`), or log to an experiment "
            "of your own (mlflow.experiment=NAME: a user manages the experiments it creates)"
        )


def _get(url: str, credentials: Credentials, tls, timeout: float) -> tuple[int | None, dict | None]:
    """(HTTP status, JSON body) of a GET as ``credentials``; (None, None) when nothing answered."""
    token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=tls) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, None
    except (OSError, ValueError):
        return None, None
