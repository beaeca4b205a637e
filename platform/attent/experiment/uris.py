"""Tracking-store URIs: the store a run logs to, a relative ``sqlite:///`` store made absolute, and the
database file of a SQLite store. Standard library only: the server's set-up and the command line's parsers
use them before anything heavy is imported."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"  # in the working directory


def resolve_tracking_uri(uri: str | None, base: Path) -> str:
    """The store a run logs to: ``uri`` (a config's ``mlflow.tracking_uri``), else $MLFLOW_TRACKING_URI,
    else ``sqlite:///mlflow.db``; a relative SQLite path taken from ``base``. The one rule, for experiments
    (``ExperimentConfig.resolved``) and the theory lab alike."""
    return absolute_sqlite_uri(uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI, base)


def absolute_sqlite_uri(uri: str, base: Path) -> str:
    """``sqlite:///relative.db`` -> ``sqlite:////abs/base/relative.db``; other URIs unchanged."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + str((base / uri[len(prefix) :]).resolve())
    return uri


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite://`` store (its query string left out); None for an
    in-memory store or another scheme. The one reading of a SQLite URI's path."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    path = tracking_uri.split("?", 1)[0].removeprefix("sqlite:///").removeprefix("sqlite://")
    return Path(path) if path and path != ":memory:" else None
