"""`attent server users add` and `attent server grant`: users and their permissions on a tracking
server with authentication, through MLflow's own auth client (``mlflow.server.get_app_client``), as
an admin: the server checks who asks and writes its tables itself.

The admin is whoever MLflow's client sends ($MLFLOW_TRACKING_USERNAME / _PASSWORD, or
~/.mlflow/credentials), or, with ``--admin-password-file``, user ``admin`` with the password the
server made at its first start (``<auth dir>/admin_password``). A new user's password is made here
and written, never printed, to a 0600 file in MLflow's credentials-file format: the user copies it
to ``~/.mlflow/credentials`` and every MLflow client of theirs logs in with it."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ..engine.credentials import PASSWORD_ENV, USERNAME_ENV
from .auth import ADMIN, PERMISSIONS, check_private, write_private


def tracking_server(uri: str | None) -> str:
    """The server to manage: given, else $MLFLOW_TRACKING_URI; an HTTP(S) URL."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri or urlsplit(uri).scheme not in ("http", "https"):
        raise ValueError(
            f"no tracking server to manage ({uri or 'no --tracking-uri nor $MLFLOW_TRACKING_URI'}): "
            "give --tracking-uri http(s)://host:port of the `attent server` with authentication"
        )
    return uri


def use_admin_password_file(path: str | None) -> None:
    """Send user ``admin`` and the password in ``path`` (this process only)."""
    if path is None:
        return
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--admin-password-file {path} does not exist (the server writes <auth dir>/admin_password)")
    check_private(file)
    os.environ[USERNAME_ENV] = ADMIN
    os.environ[PASSWORD_ENV] = file.read_text().strip()


def auth_client(uri: str):
    """MLflow's basic-auth client of the server at ``uri``."""
    import warnings

    with warnings.catch_warnings():  # the auth app's import: a Starlette deprecation, no news to a user
        warnings.filterwarnings("ignore", message="starlette")
        from mlflow.server import get_app_client

        return get_app_client("basic-auth", tracking_uri=uri)


def credentials_text(name: str, password: str) -> str:
    """A user's MLflow credentials file (``~/.mlflow/credentials``, as MLflow's client reads it)."""
    return f"[mlflow]\n{USERNAME_ENV.lower()} = {name}\n{PASSWORD_ENV.lower()} = {password}\n"


def add_user(uri: str, name: str, *, admin: bool, out: str | None) -> Path:
    """Create user ``name`` (an admin with ``admin``) with a new password, written to ``out``
    (default ./mlflow-credentials-NAME); returns that file."""
    target = Path(out or f"mlflow-credentials-{name}").resolve()
    if target.exists():
        raise ValueError(f"{target} exists: give --credentials-file a new path (nothing was changed)")
    password = secrets.token_urlsafe(24)
    client = auth_client(uri)
    _call(lambda: client.create_user(name, password), f"add user {name!r}")
    if admin:
        _call(lambda: client.update_user_admin(name, True), f"make {name!r} an admin")
    write_private(target, credentials_text(name, password))
    return target


def grant(uri: str, name: str, experiment: str, permission: str) -> tuple[str, bool]:
    """Give user ``name`` ``permission`` on an experiment (by name, or id), creating the experiment
    if it does not exist yet; (its id, whether it was created here)."""
    permission = permission.upper()
    if permission not in PERMISSIONS:
        raise ValueError(f"permission {permission!r}: give one of {', '.join(PERMISSIONS)}")
    from mlflow import MlflowClient

    tracking = MlflowClient(uri)
    found = _call(lambda: tracking.get_experiment_by_name(experiment), f"look up experiment {experiment!r}")
    if found is None and experiment.isdigit():
        found = _call(lambda: tracking.get_experiment(experiment), f"look up experiment {experiment}")
    created = found is None
    experiment_id = (
        _call(lambda: tracking.create_experiment(experiment), f"create experiment {experiment!r}")
        if created
        else found.experiment_id
    )
    client = auth_client(uri)
    what = f"grant {permission} on experiment {experiment!r} to {name!r}"
    from mlflow.exceptions import MlflowException

    try:
        client.grant_user_permission(name, "experiment", experiment_id, permission)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise _refusal(error, what) from None
        # the grant replaces the one the user had there (MLflow's grant refuses a second one)
        _call(lambda: client.revoke_user_permission(name, "experiment", experiment_id), what)
        _call(lambda: client.grant_user_permission(name, "experiment", experiment_id, permission), what)
    return experiment_id, created


def _call(action, what: str):
    """``action()``; MLflow's refusal said in one line (who was refused, what to do)."""
    from mlflow.exceptions import MlflowException

    try:
        return action()
    except MlflowException as error:
        raise _refusal(error, what) from None


def _refusal(error, what: str) -> ValueError:
    code = error.get_http_status_code()
    if code == 401:
        return ValueError(
            f"could not {what}: the server refused the credentials sent. Fix: pass --admin-password-file "
            f"<auth dir>/admin_password, or export {USERNAME_ENV} / {PASSWORD_ENV} of an admin"
        )
    if code == 403:
        return ValueError(f"could not {what}: the user sent is no admin of this server")
    return ValueError(f"could not {what}: {error.message}")


def print_added(name: str, admin: bool, path: Path) -> None:
    role = "admin" if admin else "user"
    print(
        f"{role} {name!r} added; the credentials are in {path} (readable by you alone): give that file to "
        f"{name}, to keep as ~/.mlflow/credentials (chmod 600)",
        file=sys.stdout,
        flush=True,
    )
