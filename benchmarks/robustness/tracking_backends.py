"""The tracking backends benchmarks/robustness/tracking_load.py writes into: a SQLite file, or `attent server`
over that file or over a throwaway PostgreSQL cluster started here (initdb in a temporary
directory, unix socket only, as the postgres user when run as root)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ATTENT = Path(sys.executable).parent / "attent"
BACKENDS = ("sqlite-direct", "sqlite", "server-sqlite", "server-postgresql")


def postgres_bin() -> Path | None:
    """The directory of PostgreSQL's initdb/pg_ctl (on PATH, or Debian's /usr/lib/postgresql/N/bin)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def postgres_unavailable() -> str | None:
    """Why a local PostgreSQL cannot be started here, or None."""
    if postgres_bin() is None:
        return "PostgreSQL is not installed (apt-get install postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser to start PostgreSQL as another user"
    if os.geteuid() == 0 and not _user_exists("postgres"):
        return "running as root and no postgres user to run PostgreSQL as"
    try:
        import psycopg2  # noqa: F401  (MLflow's PostgreSQL driver)
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[server]')"
    return None


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _as_postgres_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextlib.contextmanager
def local_postgres(port: int) -> Iterator[str]:
    """A throwaway PostgreSQL cluster (trust auth, unix socket only, in a temporary directory);
    yields the SQLAlchemy URI of its database ``mlflow``. Stopped and removed afterwards."""
    bindir = postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="attent-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    run = lambda cmd: subprocess.run(_as_postgres_user(cmd), check=True, capture_output=True, timeout=120)  # noqa: E731
    try:
        run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        options = f"-c listen_addresses='' -c unix_socket_directories={root} -p {port}"
        run([str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "postgres.log"), "-w", "start"])
        try:
            run([str(bindir / "createdb"), "-h", str(root), "-p", str(port), "-U", "postgres", "mlflow"])
            yield f"postgresql+psycopg2://postgres@/mlflow?host={root}&port={port}"
        finally:
            run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def tracking_server(backend_uri: str, workdir: Path, port: int) -> Iterator[str]:
    """`attent server` on 127.0.0.1:port over ``backend_uri``, artifacts in workdir/mlartifacts;
    yields its URL. Stopped (its whole process group) afterwards."""
    from attent.server import app as server

    with open(workdir / "server.log", "ab") as log:
        process = subprocess.Popen(
            [
                str(ATTENT),
                "server",
                "--backend-store-uri",
                backend_uri,
                "--port",
                str(port),
                "--artifacts-destination",
                str(workdir / "mlartifacts"),
            ],
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        server.wait_ready(url, process)
        yield url
    finally:
        server.stop(process)


@contextlib.contextmanager
def backend_uri(backend: str, workdir: Path, ports: Iterator[int]) -> Iterator[str]:
    """The tracking URI clients of ``backend`` use, with its server and database running."""
    sqlite_uri = f"sqlite:///{workdir / 'mlflow.db'}"
    if backend in ("sqlite", "sqlite-direct"):
        yield sqlite_uri
    elif backend == "server-sqlite":
        with tracking_server(sqlite_uri, workdir, next(ports)) as url:
            yield url
    elif backend == "server-postgresql":
        with local_postgres(next(ports)) as database, tracking_server(database, workdir, next(ports)) as url:
            yield url
    else:
        raise ValueError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}")


def free_ports() -> Iterator[int]:
    from attent.server.app import free_port

    while True:
        yield free_port()
