"""The MLflow credentials of this process, read as MLflow's client reads them, and kept out of
everything a run records.

A tracking server with authentication (``attent server`` beyond loopback) asks every request for
a user and password: MLflow's client takes them from ``$MLFLOW_TRACKING_USERNAME`` /
``$MLFLOW_TRACKING_PASSWORD``, else from ``~/.mlflow/credentials``. The driver reads them here (the
standard library only: the preflight runs before MLflow is imported), hands them to its Ray
workers through the job's set-up hook (``ray_process``), and ``redact`` keeps the password out of
params, tags, the logged config and messages."""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

USERNAME_ENV, PASSWORD_ENV, TOKEN_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"
SERVER_CERT_ENV, INSECURE_TLS_ENV = "MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_INSECURE_TLS"
CLIENT_CERT_ENV = "MLFLOW_TRACKING_CLIENT_CERT_PATH"
# What a worker needs to reach the server as its driver does: who it is and whom it trusts.
CLIENT_ENV = (USERNAME_ENV, PASSWORD_ENV, TOKEN_ENV, SERVER_CERT_ENV, INSECURE_TLS_ENV, CLIENT_CERT_ENV)
CREDENTIALS_FILE = "~/.mlflow/credentials"  # MLflow's own: [mlflow] mlflow_tracking_username / _password
REDACTED = "***"
FIX = (
    f"export {USERNAME_ENV}=<user> and {PASSWORD_ENV}=<password> (or write them to {CREDENTIALS_FILE}, "
    "chmod 600, as MLflow reads it); the server's admin adds users with `attent server users add NAME`"
)


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a repr, a log or a message
    source: str = ""  # where they came from, for messages: the variables or the file

    def __bool__(self) -> bool:
        return bool(self.username and self.password)


def read_credentials() -> Credentials:
    """The user and password MLflow's client sends: the environment's, else the credentials
    file's (each value separately, as ``mlflow.utils.credentials.read_mlflow_creds``)."""
    from_file = _from_file(Path(CREDENTIALS_FILE).expanduser())
    username = os.environ.get(USERNAME_ENV) or from_file.get(USERNAME_ENV.lower())
    password = os.environ.get(PASSWORD_ENV) or from_file.get(PASSWORD_ENV.lower())
    source = f"${PASSWORD_ENV}" if os.environ.get(PASSWORD_ENV) else CREDENTIALS_FILE if password else ""
    return Credentials(username, password, source)


def _from_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error:
        return {}
    return dict(parser["mlflow"]) if parser.has_section("mlflow") else {}


def client_env() -> dict[str, str]:
    """The MLflow client settings a Ray worker needs to log as this process does (the file's
    credentials as variables too: a worker on another node may have no such file)."""
    env = {name: os.environ[name] for name in CLIENT_ENV if os.environ.get(name)}
    credentials = read_credentials()
    if credentials:
        env |= {USERNAME_ENV: credentials.username, PASSWORD_ENV: credentials.password}
    return env


def secrets_of_this_process() -> list[str]:
    """The values ``redact`` hides: the password and token MLflow's client would send."""
    values = [read_credentials().password, os.environ.get(TOKEN_ENV)]
    return [value for value in values if value]


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):(?P<password>[^/@\s]+)@")


def redact(text: str) -> str:
    """``text`` without this process's MLflow password or token, nor any password written into a
    URL (``scheme://user:password@host``): each becomes ***."""
    return redactor()(text)


def redactor() -> Callable[[str], str]:
    """``redact`` with the secrets read once, for many values (a run's params)."""
    found = sorted(secrets_of_this_process(), key=len, reverse=True)

    def hide(text: str) -> str:
        text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
        for secret in found:
            text = text.replace(secret, REDACTED)
        return text

    return hide


def uri_has_password(uri: str | None) -> bool:
    """Whether a URI carries a password in its address (``http://user:password@host``)."""
    try:
        return bool(uri) and urlsplit(uri).password is not None
    except ValueError:
        return False


def redact_uri(uri: str) -> str:
    """The URI with the password of its address, if any, as ***."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{REDACTED}@{host}"))
