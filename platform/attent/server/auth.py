"""Authentication of `attent server`: MLflow's ``basic-auth`` app (users, admins, per-experiment and
per-model READ / EDIT / MANAGE permissions in a SQL database), set up so that nothing secret is
guessable, printed or shared by accident.

What a server with authentication keeps, in one folder (``--auth-dir``; by default ``mlflow-auth/``
beside a SQLite store, else in the folder the server starts in), 0700, every file 0600:

* ``basic_auth.ini``: MLflow's auth configuration (``$MLFLOW_AUTH_CONFIG_PATH``): the users database,
  the permission of a user on an experiment nobody granted them, the admin's name;
* ``flask_secret``: the key of MLflow's CSRF protection, made once, so that the server's worker
  processes, later restarts and other servers given the same folder agree on it;
* ``admin_password``: the admin's password, made once; MLflow ships no usable default (it refuses
  the ``password1234`` of its older releases and, on a users database that still has it, replaces it
  with this one at start). Its path is printed, never its content;
* ``users.db`` (SQLite stores): the users and their password hashes, made 0600 before MLflow opens it.

The users database lies beside the tracking store: ``users.db`` in that folder for SQLite, the
same database for PostgreSQL (MLflow's auth tables have their own names and migration table).
Nothing here imports MLflow: the server's processes do, with these settings in their environment.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from ..experiment.uris import sqlite_file

AUTH_DIR = "mlflow-auth"
CONFIG_FILE, SECRET_FILE, PASSWORD_FILE, USERS_DB = "basic_auth.ini", "flask_secret", "admin_password", "users.db"
ADMIN = "admin"
PERMISSIONS = ("READ", "EDIT", "MANAGE")
DEFAULT_PERMISSION = "READ"  # MLflow's: every user reads every experiment unless told otherwise
NO_PERMISSION = "NO_PERMISSIONS"  # a user sees only what they were granted or created
AUTH_FUNCTION = "mlflow.server.auth:authenticate_request_basic_auth"
# A verified (user, password) is trusted this long: a password's scrypt check is ~0.1 s of the server's CPU at
# every request otherwise (each metric a run logs). A password changed or a user deleted through MLflow's API
# takes effect at once on the server worker that made the change, on its others within this time.
AUTH_CACHE_SECONDS = 60
NEEDS_EXTRA = (
    "authentication needs MLflow's basic-auth app, and its Flask-WTF is not installed here: "
    "pip install 'mlflow[auth]', or in a clone of attent pip install -e '.[server]' (once attent is released on "
    "PyPI, pip install 'attent[server]')"
)


@dataclass(frozen=True)
class AuthSpec:
    directory: Path  # basic_auth.ini, flask_secret, admin_password (and users.db for SQLite)
    database_uri: str  # MLflow's users and permissions
    default_permission: str = DEFAULT_PERMISSION

    @property
    def password_file(self) -> Path:
        return self.directory / PASSWORD_FILE


def auth_spec(backend_uri: str, directory: str | None, default_permission: str, cwd: Path) -> AuthSpec:
    """Where a server over ``backend_uri`` keeps its users and secrets."""
    database = sqlite_file(backend_uri)
    if directory is not None:
        folder = (cwd / directory).resolve()
    elif database is not None:
        folder = database.parent / AUTH_DIR
    else:
        folder = (cwd / AUTH_DIR).resolve()
    users = f"sqlite:///{folder / USERS_DB}" if database is not None else backend_uri
    return AuthSpec(folder, users, default_permission)


def check_available() -> None:
    """Refuse, naming the install, where MLflow's basic-auth app cannot start."""
    try:
        import flask_wtf  # noqa: F401  (the auth app's CSRF protection)
    except ImportError:
        missing = True
    else:
        missing = False
    if missing:  # raised outside the handler: the CLI's one line is this one, with --no-auth in it
        raise ValueError(f"{NEEDS_EXTRA}; or pass --no-auth, letting anyone who reaches the port in")


def prepare(spec: AuthSpec) -> dict[str, str]:
    """The folder, its secrets (made the first time, kept after) and MLflow's auth configuration;
    returns the environment the server runs with."""
    folder = spec.directory
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_private(folder, directory=True)
    secret = private_file(folder / SECRET_FILE, lambda: secrets.token_hex(32))
    password = private_file(folder / PASSWORD_FILE, lambda: secrets.token_urlsafe(24))
    config = (
        "[mlflow]\n"
        f"default_permission = {spec.default_permission}\n"
        f"database_uri = {spec.database_uri}\n"
        f"admin_username = {ADMIN}\n"
        f"authorization_function = {AUTH_FUNCTION}\n"
        f"auth_cache_ttl_seconds = {AUTH_CACHE_SECONDS}\n"
    )
    write_private(folder / CONFIG_FILE, config)
    private_database(sqlite_file(spec.database_uri))
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(folder / CONFIG_FILE),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secret,
        # read by MLflow only to create the admin on an empty users database, or to replace the
        # old shipped default password: a later change of the admin's password is kept
        "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN,
        "MLFLOW_AUTH_ADMIN_PASSWORD": password,
    }


def private_database(path: Path | None) -> None:
    """The SQLite users database readable by its owner alone: made empty, 0600, before MLflow opens
    it (SQLite takes an empty file for a new database and gives its journals the file's mode), or
    narrowed to 0600 where an earlier start left it as the umask made it. Its password hashes are
    the server's secrets as much as the files beside it."""
    if path is None:
        return
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
    finally:
        os.close(descriptor)


def check_private(path: Path, *, directory: bool = False) -> None:
    """Refuse a secret (or its folder) that other users may read, naming the chmod."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        fix = "700" if directory else "600"
        raise ValueError(
            f"{path} can be read by other users (mode {mode:04o}), and it holds the tracking server's "
            f"secrets: chmod {fix} {path}"
        )


def private_file(path: Path, make) -> str:
    """The content of a 0600 secret file, made by ``make()`` if it does not exist yet. Made under
    a temporary name and linked into place, so that two servers starting at once agree on one."""
    if not path.exists():
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        write_private(temporary, make() + "\n")
        try:
            os.link(temporary, path)  # fails if another process made it first: theirs is kept
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    check_private(path)
    value = path.read_text().strip()
    if not value:
        raise ValueError(f"{path} is empty: remove it, and the next start makes a new one")
    return value


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner alone from the first byte."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with contextlib.closing(os.fdopen(descriptor, "w")) as file:
        os.fchmod(descriptor, 0o600)  # an existing file keeps its mode through O_CREAT
        file.write(text)


def announce(spec: AuthSpec) -> str:
    """What a person starting the server reads: where the users are and where the admin's
    password is (its path only)."""
    return (
        f"Authentication on (MLflow basic-auth): users in {spec.database_uri}; the password of user {ADMIN!r} "
        f"is in {spec.password_file} (readable by you alone). Clients: export MLFLOW_TRACKING_USERNAME and "
        f"MLFLOW_TRACKING_PASSWORD (or ~/.mlflow/credentials); add users with `attent server users add NAME`, "
        f"permissions with `attent server grant NAME EXPERIMENT READ|EDIT|MANAGE`"
    )


def admin_password_works(url: str, spec: AuthSpec) -> bool:
    """Whether the server takes the admin's password file (an admin may have changed the password
    since; MLflow reads the file's only to create the admin)."""
    import base64
    import ssl
    import urllib.error
    import urllib.request

    password = spec.password_file.read_text().strip()
    token = base64.b64encode(f"{ADMIN}:{password}".encode()).decode()
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/users/current", headers={"Authorization": f"Basic {token}"})
    context = ssl._create_unverified_context() if url.startswith("https:") else None  # our own child, on loopback
    try:
        with urllib.request.urlopen(request, timeout=30, context=context):
            return True
    except urllib.error.HTTPError as error:
        return error.code != 401
    except OSError:  # no answer: nothing to say about the password
        return True


STALE_PASSWORD = (
    "warning: the server does not take the password in {path} for user 'admin' (changed since it was "
    "written?): that file logs nobody in; an admin changes passwords with MLflow's auth client"
)
NO_AUTH_WARNING = (
    "WARNING: authentication is off (--no-auth) on {host}:{port}: anyone who reaches this port can read, "
    "change and delete every experiment, run, model and artifact. Leave --no-auth out to require users."
)
