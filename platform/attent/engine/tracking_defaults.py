"""What the engine's tracking assumes of a store and a host, shared with the tracking server
(``attent.server`` imports them from here, never the other way): standard library only, as the
command line's parsers read them before MLflow is imported."""

from __future__ import annotations

import ipaddress

DEFAULT_ARTIFACTS = "mlartifacts"  # a SQLite store's artifacts: this folder beside its database file


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
