"""The commands that read results, serve the tracking store or make data: `attent report`, `attent ui`,
`attent server` and `attent data`, their parsers and what they run; and the tracking store a command reads
by default."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path


def add_service_commands(sub) -> None:
    """Commands that read results, serve the tracking store or make data."""
    from ..analysis import command as report  # its parser is the standard library's alone

    report.add_arguments(sub.add_parser("report", help=report.SUMMARY))

    p = sub.add_parser("ui", help="the MLflow dashboard over the local store, on 127.0.0.1")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)

    from ..engine.tracking_defaults import DEFAULT_ARTIFACTS
    from ..server import app as server  # standard library only: the defaults below live there

    p = sub.add_parser("server", help="the MLflow tracking server concurrent trials and cluster nodes share")
    p.add_argument(
        "--backend-store-uri",
        default=None,
        help="SQL database: default $MLFLOW_TRACKING_URI if SQL, else sqlite:///mlflow.db here; "
        "postgresql+psycopg2://user@host/db for a cluster",
    )
    p.add_argument(
        "--artifacts-destination",
        default=DEFAULT_ARTIFACTS,
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
    add_server_auth_arguments(p)
    add_data_command(sub)  # after server: --help lists the commands in the order they are added


def add_data_command(sub) -> None:
    """`attent data` and its subcommands: scenes (render a data set) and cache (decode one)."""
    p = sub.add_parser("data", help="generate offline data sets, or decode one once into a cache")
    data = p.add_subparsers(dest="data_command", required=True)
    p = data.add_parser("scenes", help="rendered rgb/depth/semseg scenes in MultiMAE's layout")
    p.add_argument("--out", required=True, help="a new folder for <split>/{rgb,depth,semseg}/<class>/")
    p.add_argument("--train", type=int, default=10000, help="training scenes")
    p.add_argument("--test", type=int, default=2000, help="test scenes")
    p.add_argument("--size", type=int, default=32, help="image side in pixels (32-64 tested)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="processes (default: all CPUs)")
    p = data.add_parser(
        "cache",
        help="decode a data set's images once, at the training size, into memory-mapped uint8/uint16 arrays "
        "that runs read instead of the files (task.cache_path)",
    )
    p.add_argument(
        "source",
        help="an experiment YAML (its task's data_path, img_size, channels) or a data folder: "
        "MultiMAE's <split>/{rgb,depth,semseg}/ layout or an image folder of class subfolders",
    )
    p.add_argument("--img-size", type=int, default=None, help="square size (default: the experiment's img_size)")
    p.add_argument("--out", default=None, help="the cache folder (default: <data>/.attent-cache/<img_size>px)")
    p.add_argument("--workers", type=int, default=None, help="processes decoding (default: the CPUs available)")
    p.add_argument("--force", action="store_true", help="rebuild a cache that is there")
    p.add_argument("--color-mode", choices=("rgb", "grayscale"), default=None, help="an image folder's channels")
    p.add_argument("--num-semseg-classes", type=int, default=None, help="multi-modal data without dataset.json")


def cmd_report(args) -> int:
    """`attent report` (attent.analysis, which reads MLflow through the run contract alone), after the
    experiment's runs left RUNNING by a dead driver are closed KILLED (the report leaves them out);
    with --with, several benchmarks' runs (experiments, stores, saved per_run.csv files) joined."""
    from ..analysis import command as report
    from ..experiment.schema import ConfigError
    from ..experiment.uris import sqlite_file

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
    from ..engine.tracking import close_runs_of_dead_drivers_in

    if args.experiment is not None:
        close_runs_of_dead_drivers_in(args.tracking_uri, args.experiment)
    return report.run(args)


def tracking_uri(given: str | None) -> str:
    """The store the CLI reads: the one a run started here writes (``resolve_tracking_uri``)."""
    from ..experiment.uris import resolve_tracking_uri

    return resolve_tracking_uri(given, Path.cwd())


def cmd_ui(args) -> int:
    """`mlflow ui` over the store as a child: its links are printed once it answers."""
    from ..server import app as server

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
    from ..engine.dashboard import dashboard_links  # imports MLflow while the server starts
    from ..engine.tracking import close_runs_of_dead_drivers_in

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
    from ..engine.progress import log_folder

    return log_folder() / f"mlflow-{kind}-{port}.log"


def cmd_server(args) -> int:
    """`mlflow server` over a SQL store with proxied artifacts, with authentication beyond loopback;
    refuses a file store, a taken port, or a server open to the network that cannot require users."""
    if getattr(args, "server_command", None):
        return cmd_server_manage(args)
    from ..engine.tracking_defaults import is_loopback
    from ..server import app as server
    from ..server import auth as server_auth

    env = os.environ.get("MLFLOW_TRACKING_URI")  # the server never serves itself: an http URI here is skipped
    backend = tracking_uri(args.backend_store_uri or (env if server.is_sql_uri(env) else server.DEFAULT_BACKEND))
    spec = server.ServerSpec(
        backend,
        server.resolve_artifacts(args.artifacts_destination, Path.cwd()),
        args.host,
        args.port,
        args.workers,
        args.allowed_hosts,
        auth=None,
        tls_cert=args.tls_cert and str(Path(args.tls_cert).resolve()),
        tls_key=args.tls_key and str(Path(args.tls_key).resolve()),
    )
    server.check_spec(spec)
    secrets_env = None
    if server.wants_auth(spec.host, args.auth):
        server_auth.check_available()
        auth = server_auth.auth_spec(backend, args.auth_dir, args.default_permission, Path.cwd())
        secrets_env = server_auth.prepare(auth)
        spec = replace(spec, auth=auth)
    elif not is_loopback(spec.host):
        print(server_auth.NO_AUTH_WARNING.format(host=spec.host, port=spec.port), file=sys.stderr, flush=True)

    def announce() -> None:
        print(
            f"MLflow tracking server: export MLFLOW_TRACKING_URI={spec.url}  (store {backend}; artifacts "
            f"{spec.artifacts_destination}; Ctrl-C stops it)",
            flush=True,
        )
        if spec.auth is not None:
            print(server_auth.announce(spec.auth), flush=True)
            if not server_auth.admin_password_works(local, spec.auth):
                print(server_auth.STALE_PASSWORD.format(path=spec.auth.password_file), file=sys.stderr, flush=True)
        if spec.tls_cert:
            print(
                f"HTTPS with {spec.tls_cert}: clients export MLFLOW_TRACKING_SERVER_CERT_PATH=<it or its CA>",
                flush=True,
            )
        if log:
            print(f"(the server's own log: {log})", flush=True)

    log = None if args.verbose else server_log("server", spec.port)
    local = server.local_url(spec.host, spec.port, spec.scheme)
    return server.serve_in_foreground(server.server_command(spec), local, announce, log, env=secrets_env)


def add_server_auth_arguments(p) -> None:
    """`attent server`'s authentication and TLS options, and its users/grant subcommands."""
    from ..server import auth as server_auth

    switch = p.add_mutually_exclusive_group()
    switch.add_argument(
        "--auth",
        dest="auth",
        action="store_true",
        default=None,
        help="require users (MLflow's basic-auth app); the default beyond 127.0.0.1",
    )
    switch.add_argument(
        "--no-auth",
        dest="auth",
        action="store_false",
        help="no users beyond 127.0.0.1 either: anyone who reaches the port reads and deletes everything",
    )
    p.add_argument(
        "--auth-dir",
        default=None,
        help="the users' secrets (admin_password, flask_secret, basic_auth.ini): default mlflow-auth/ beside a "
        "SQLite store, else ./mlflow-auth; give several servers the same folder",
    )
    p.add_argument(
        "--default-permission",
        default=server_auth.DEFAULT_PERMISSION,
        choices=[server_auth.NO_PERMISSION, *server_auth.PERMISSIONS],
        help="a user's permission on an experiment nobody granted them (default READ, MLflow's)",
    )
    p.add_argument("--tls-cert", default=None, help="serve HTTPS: the PEM certificate (with its chain)")
    p.add_argument("--tls-key", default=None, help="serve HTTPS: the certificate's private key (chmod 600)")
    manage = p.add_subparsers(dest="server_command", metavar="{users,grant}")
    users = manage.add_parser("users", help="the server's users").add_subparsers(dest="users_command", required=True)
    q = users.add_parser("add", help="add a user with a new password, written to a 0600 credentials file")
    q.add_argument("name")
    q.add_argument("--admin", action="store_true", help="an admin: manages users and every experiment")
    q.add_argument(
        "--credentials-file", default=None, help="where the password goes (default ./mlflow-credentials-NAME)"
    )
    add_admin_arguments(q)
    q = manage.add_parser("grant", help="give a user a permission on an experiment (created if new)")
    q.add_argument("name")
    q.add_argument("experiment", help="the experiment's name (or id)")
    q.add_argument("permission", type=str.upper, choices=server_auth.PERMISSIONS)
    add_admin_arguments(q)


def add_admin_arguments(p) -> None:
    p.add_argument("--tracking-uri", default=None, help="the server (default $MLFLOW_TRACKING_URI)")
    p.add_argument(
        "--admin-password-file",
        default=None,
        help="log in as user admin with this file's password (<auth dir>/admin_password); default: "
        "$MLFLOW_TRACKING_USERNAME / _PASSWORD or ~/.mlflow/credentials",
    )


def cmd_server_manage(args) -> int:
    """`attent server users add` / `attent server grant`, through MLflow's auth client."""
    from ..server import users as server_users

    uri = server_users.tracking_server(args.tracking_uri)
    server_users.use_admin_password_file(args.admin_password_file)
    if args.server_command == "users":
        path = server_users.add_user(uri, args.name, admin=args.admin, out=args.credentials_file)
        server_users.print_added(args.name, args.admin, path)
        return 0
    experiment_id, created = server_users.grant(uri, args.name, args.experiment, args.permission)
    made = " (created now)" if created else ""
    print(f"{args.name!r} may now {args.permission} experiment {args.experiment!r} (id {experiment_id}){made}")
    return 0


def cmd_data(args) -> int:
    """`attent data scenes`: render the offline multi-modal scenes (trimesh + Embree);
    `attent data cache`: decode a data set once into a cache (``attent.tasks.cache``)."""
    if args.data_command == "cache":
        return _cache_data(args)
    from ..tasks.mae.scenes import write_dataset

    s = write_dataset(
        Path(args.out), train=args.train, test=args.test, size=args.size, seed=args.seed, workers=args.workers
    )
    print(
        f"{s['out']}: {s['train']} train + {s['test']} test scenes at {s['size']} px "
        f"(seed {s['seed']}) in {s['seconds']:.1f}s with {s['workers']} worker(s)"
    )
    return 0


def _cache_target(args) -> dict:
    """What `attent data cache` decodes: kind, root, size, channels or modalities, from an
    experiment's task or a data folder."""
    from ..tasks.mae.files import MODALITIES

    source = Path(args.source).expanduser()
    target = {"img_size": args.img_size, "in_chans": 1 if args.color_mode == "grayscale" else 3, "out": args.out}
    if source.is_file():
        from ..experiment.files import load_experiment

        task = load_experiment(source).resolved().task
        if task.name == "vision" and task.dataset != "image_folder":
            raise SystemExit(f"attent data cache: {task.dataset} is read from arrays in memory; nothing to cache")
        if not hasattr(task, "data_path") or task.name not in ("vision", "mae", "multimae", "mae_downstream"):
            raise SystemExit(f"attent data cache: task {task.name!r} reads no image files; nothing to cache")
        root = Path(task.data_path)
        target["img_size"] = args.img_size or getattr(task, "image_size", None) or task.img_size
        if task.name == "vision":
            target["in_chans"] = task.in_chans if args.color_mode is None else target["in_chans"]
        if task.cache_path not in (None, "auto", "required") and target["out"] is None:
            target["out"] = task.cache_path
        kind = "image_folder" if task.name == "vision" else "multimodal"
        needed = task.modalities_needed() if kind == "multimodal" else ()
    else:
        root, needed = source, ()
        if not root.is_dir():
            raise SystemExit(f"attent data cache: {root} is neither an experiment YAML nor a data folder")
        kind = "multimodal" if any((root / "train" / m).is_dir() for m in MODALITIES) else "image_folder"
    if target["img_size"] is None:
        raise SystemExit("attent data cache: give --img-size (the task's img_size) for a data folder")
    # every modality the data has (a cache serves mae, multimae and the downstream jobs alike)
    present = tuple(m for m in MODALITIES if (root / "train" / m).is_dir()) or tuple(needed)
    target.update(root=root, kind=kind, modalities=present)
    return target


def _cache_data(args) -> int:
    """`attent data cache SOURCE`: every sample decoded once at img_size into memory-mapped arrays."""
    target = _cache_target(args)
    progress = lambda message: print(f"[attent] {message}", flush=True)  # noqa: E731
    common = {"workers": args.workers, "force": args.force, "progress": progress, "img_size": target["img_size"]}
    if target["kind"] == "multimodal":
        from ..tasks.mae.data import build_cache

        index = build_cache(
            target["root"],
            target["out"],
            modalities=target["modalities"],
            num_semseg_classes=args.num_semseg_classes,
            **common,
        )
    else:
        from ..tasks.vision.folder import build_cache

        index = build_cache(target["root"], target["out"], in_chans=target["in_chans"], **common)
    counts = ", ".join(f"{entry['count']} {split}" for split, entry in index["splits"].items())
    print(
        f"{index['out']}: {counts} samples at {index['img_size']} px, {index['bytes'] / 2**30:.2f} GiB, "
        f"in {index['seconds']:.1f}s with {index['workers']} worker(s). Runs of {target['root']} at this size "
        "read it by default (task.cache_path: auto); `required` refuses to run without it"
    )
    return 0
