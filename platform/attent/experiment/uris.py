"""Tracking-store URIs: a relative ``sqlite:///`` store made absolute, and the database file of a SQLite
store. Standard library only: the server's set-up and the command line's parsers use them before
anything heavy is imported."""

from __future__ import annotations

from pathlib import Path


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
