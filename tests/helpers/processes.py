"""The processes the tests start beside themselves: free loopback ports, the Ray of one local cluster (found by
its temp dir and stopped without touching any other Ray on the machine), Ray Train's polling as `attent train`
sets it, and `attent server` on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

from tests.helpers.paths import BIN


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll_train_workers_often() -> None:
    """What ``attent train`` sets for the local Ray it starts (and cluster.yaml for a cluster):
    Ray Train's controller polls its workers every 0.25 s, not 2 s, so a run's reports after a
    checkpoint and its teardown do not wait ~5 s; and it starts no preemption watcher (one actor
    process fewer per run). Ray processes started after this inherit both."""
    from attent.engine.driver import PREEMPTION_WATCHER_ENV, TRAIN_POLL_ENV, TRAIN_POLL_SECONDS

    os.environ.setdefault(TRAIN_POLL_ENV, TRAIN_POLL_SECONDS)
    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")  # as attent's own local Ray: no spot nodes here


def ray_processes(temp_dir: Path) -> list:
    """The processes of one local cluster: those started with its temp dir, and their children."""
    import psutil

    mine = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(temp_dir) in part for part in proc.info["cmdline"] or ()):
                mine += [proc, *proc.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return mine


def stop_ray_processes(temp_dir: Path) -> None:
    """Stop the Ray processes of one local cluster. Unlike `ray stop`, leaves any other Ray on
    the machine alone (parallel sessions)."""
    import psutil

    mine = ray_processes(temp_dir)
    for proc in mine:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(mine, timeout=30)


@contextlib.contextmanager
def start_tracking_server(backend_uri: str, artifacts: Path):
    """`attent server` on 127.0.0.1 (a SQL backend, proxied artifact store) in its own process
    group, its URL yielded once /health answers; stopped with its workers afterwards."""
    from attent.server import app as server

    port = free_port()
    proc = subprocess.Popen(
        [
            str(BIN / "attent"),
            "server",
            "--backend-store-uri",
            backend_uri,
            "--artifacts-destination",
            str(artifacts),
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(url, proc)
        yield url
    finally:
        server.stop(proc)


def wait_for_line(path: Path, text: str, seconds: float = 60) -> str:
    """A process's output file once it holds ``text`` (or at the deadline): `attent server`
    announces itself just after it first answers, so a test that read the file at once raced it."""
    deadline = time.monotonic() + seconds
    while text not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.read_text()
