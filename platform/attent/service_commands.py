"""The commands that read results, serve the tracking store or make data: `attent report`, `attent ui`,
`attent server` and `attent data`, their parsers and what they run; and the tracking store a command reads
by default."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def add_service_commands(sub) -> None:
    """Commands that read results, serve the tracking store or make data."""
    from .analysis import command as report  # its parser is the standard library's alone

    report.add_arguments(sub.add_parser("report", help=report.SUMMARY))

    p = sub.add_parser("ui", help="the MLflow dashboard over the local store, on 127.0.0.1")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)

    from . import server  # standard library only: the defaults below live there

    p = sub.add_parser("server", help="the MLflow tracking server concurrent trials and cluster nodes share")
    p.add_argument(
        "--backend-store-uri",
        default=None,
        help="SQL database: default $MLFLOW_TRACKING_URI if SQL, else sqlite:///mlflow.db here; "
        "postgresql+psycopg2://user@host/db for a cluster",
    )
    p.add_argument(
        "--artifacts-destination",
        default=server.DEFAULT_ARTIFACTS,
        help="where uploaded artifacts land (default ./mlartifacts; s3://... works)",
    )
    p.add_argument(
        "--host",
        default=server.DEFAULT_HOST,
        help="default 127.0.0.1; this node's private IP to serve the cluster (0.0.0.0: every interface)",
    )
    p.add_argument("--port", type=int, default=server.DEFAULT_PORT)
    p.add_argument(
        "--workers", type=int, default=server.DEFAULT_WORKERS, help="server processes (default 4, as MLflow's)"
    )
    p.add_argument(
        "--allowed-hosts",
        default=None,
        help="Host headers accepted (default: localhost, private IPs, this machine's names)",
    )

    p = sub.add_parser("data", help="generate offline data sets")
    data = p.add_subparsers(dest="data_command", required=True)
    p = data.add_parser("scenes", help="rendered rgb/depth/semseg scenes in MultiMAE's layout")
    p.add_argument("--out", required=True, help="a new folder for <split>/{rgb,depth,semseg}/<class>/")
    p.add_argument("--train", type=int, default=10000, help="training scenes")
    p.add_argument("--test", type=int, default=2000, help="test scenes")
    p.add_argument("--size", type=int, default=32, help="image side in pixels (32-64 tested)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="processes (default: all CPUs)")


def cmd_report(args) -> int:
    """`attent report` (attent.analysis, which reads MLflow through the run contract alone), after the
    experiment's runs left RUNNING by a dead driver are closed KILLED (the report leaves them out);
    with --with, several benchmarks' runs (experiments, stores, saved per_run.csv files) joined."""
    from .analysis import command as report
    from .config import ConfigError, sqlite_file

    if args.experiment is None and not args.sources:
        raise ConfigError(report.NEEDS_A_SOURCE)
    args.tracking_uri = tracking_uri(args.tracking_uri)
    store = sqlite_file(args.tracking_uri)
    needs_store = args.experiment is not None or any(not s.endswith(".csv") and "@" not in s for s in args.sources)
    if needs_store and store is not None and not store.is_file():  # before MLflow's import: a report only reads
        raise ConfigError(
            f"no MLflow store at {store}. Fix: give --tracking-uri the store the runs were logged "
            f"to (attent train writes sqlite:///mlflow.db in the folder it runs in)"
        )
    from .engine.tracking import close_runs_of_dead_drivers_in

    if args.experiment is not None:
        close_runs_of_dead_drivers_in(args.tracking_uri, args.experiment)
    return report.run(args)


def tracking_uri(given: str | None) -> str:
    """The store the CLI reads: given, else $MLFLOW_TRACKING_URI, else ./mlflow.db (as train writes)."""
    from .config import absolute_sqlite_uri

    return absolute_sqlite_uri(given or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db", Path.cwd())


def cmd_ui(args) -> int:
    """`mlflow ui` over the store as a child: its links are printed once it answers."""
    from . import server

    uri = tracking_uri(args.tracking_uri)
    server.check_port_free(args.host, args.port)
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--workers",
        "1",
    ]
    base = server.local_url(args.host, args.port)  # a wildcard bind is browsed over loopback
    from .engine.dashboard import dashboard_links  # imports MLflow while the server starts
    from .engine.tracking import close_runs_of_dead_drivers_in

    def announce() -> None:
        close_runs_of_dead_drivers_in(uri)  # once the server made the store: no two first writers
        # the experiments' links alone: MLflow 3.17's home page (the bare address) and an experiment
        # opened from it land on its GenAI pages, without the training view
        links = dashboard_links(uri, base)
        if links:
            print(f"MLflow dashboard over {uri} (Ctrl-C stops it); each experiment's training runs:", flush=True)
        else:
            print(f"MLflow dashboard: {base}  (store {uri}, no runs yet; Ctrl-C stops it)", flush=True)
        for name, link in links:
            print(f"  {name}: {link}", flush=True)
        if log:
            print(f"(the server's own log: {log})", flush=True)

    log = None if args.verbose else server_log("ui", args.port)
    return server.serve_in_foreground(command, base, announce, log)


def server_log(kind: str, port: int) -> Path:
    """Where a server's own output goes (its access log): attent's log folder."""
    from .engine.progress import log_folder

    return log_folder() / f"mlflow-{kind}-{port}.log"


def cmd_server(args) -> int:
    """`mlflow server` over a SQL store with proxied artifacts; refuses a file store or a taken port."""
    from . import server

    env = os.environ.get("MLFLOW_TRACKING_URI")  # the server never serves itself: an http URI here is skipped
    backend = tracking_uri(args.backend_store_uri or (env if server.is_sql_uri(env) else server.DEFAULT_BACKEND))
    spec = server.ServerSpec(
        backend,
        server.resolve_artifacts(args.artifacts_destination, Path.cwd()),
        args.host,
        args.port,
        args.workers,
        args.allowed_hosts,
    )
    server.check_spec(spec)

    def announce() -> None:
        print(
            f"MLflow tracking server: export MLFLOW_TRACKING_URI={spec.url}  (store {backend}; artifacts "
            f"{spec.artifacts_destination}; Ctrl-C stops it)",
            flush=True,
        )
        if log:
            print(f"(the server's own log: {log})", flush=True)

    log = None if args.verbose else server_log("server", spec.port)
    return server.serve_in_foreground(
        server.server_command(spec), server.local_url(spec.host, spec.port), announce, log
    )


def cmd_data(args) -> int:
    """`attent data scenes`: render the offline multi-modal scenes (trimesh + Embree)."""
    from .tasks.mae.scenes import write_dataset

    s = write_dataset(
        Path(args.out), train=args.train, test=args.test, size=args.size, seed=args.seed, workers=args.workers
    )
    print(
        f"{s['out']}: {s['train']} train + {s['test']} test scenes at {s['size']} px "
        f"(seed {s['seed']}) in {s['seconds']:.1f}s with {s['workers']} worker(s)"
    )
    return 0
