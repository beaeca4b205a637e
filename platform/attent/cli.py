"""The `attent` command: train, validate, demo, sweep, bench, downstream, theory, report, ui, server, data,
doctor."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .extras import missing_extra, version

USAGE_ERROR = 2


FAILURE = 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attent", description="AtteNT experiments on Ray and MLflow.")
    parser.add_argument("--version", action="version", version=f"attent {version()}")
    parser.add_argument("--debug", action="store_true", help="print an error's whole traceback, not one line")
    parser.add_argument("--verbose", action="store_true",
                        help="print everything Ray, MLflow and the workers print (default: one progress line per "
                             "run, the rest in the run's log file)")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_commands(sub)
    add_service_commands(sub)
    # argparse fills a positional list only with the words before the first option, so
    # `attent bench spec.yaml --workload w train.epochs=3` leaves the override over: take it
    args, extra = parser.parse_known_args(argv)
    stray = [word for word in extra if word.startswith("-") or "=" not in word or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    if not args.verbose:  # MLflow's INFO records (store creation, migrations) are no news to a user
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        # a report reads small artifacts: their download bars broke the one-progress-line output
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        if getattr(args, "config", None) is not None:  # before any command imports Ray (seconds)
            from .config import require_file
            require_file(args.config)
        code = COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"attent {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 -- every failure ends in one line (and a log)
        code = report_error(args, exc)
    if argv is None and args.command in TRAINING_COMMANDS:  # the program itself, not a caller in-process
        exit_without_teardown(code)
    return code


# Commands that load torch, Ray and MLflow into this process.
TRAINING_COMMANDS = ("train", "sweep", "bench", "demo", "downstream")


def exit_without_teardown(code: int) -> None:
    """Exit as ``sys.exit(code)`` would, less the interpreter's teardown of every module: with
    torch, Ray and MLflow loaded, freeing their objects one by one took 1-1.5 s of CPU after
    the last line was printed (measured: benchmarks/results/fixed_cost.md). The atexit
    handlers still run (Ray's shutdown, MLflow's, logging's flush); with a non-daemon thread
    still alive this returns, and the interpreter waits for it as usual."""
    import atexit
    import threading
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def report_error(args, exc: Exception) -> int:
    """One line with the cause (and its fix, where the error names one); the traceback goes to a
    log file, or to the screen with --debug. Bad input and faults that retrying cannot mend exit
    2, anything else 1."""
    import traceback
    if args.debug:
        traceback.print_exception(exc)
    if (missing := missing_extra(exc)) is not None:  # before errors.py, which needs the platform's packages
        print(f"attent {args.command}: error: {missing}", file=sys.stderr)
        return FAILURE
    from .errors import describe, log_traceback
    line, usage = describe(exc)
    where = "" if args.debug or usage else f" (traceback: {log_traceback(args.command, exc)}; --debug shows it here)"
    print(f"attent {args.command}: error: {line}{where}", file=sys.stderr)
    return USAGE_ERROR if usage else FAILURE


def add_run_commands(sub) -> None:
    """Commands that run or check experiments."""
    p = sub.add_parser("train", help="run one experiment (local Ray, or the cluster at $RAY_ADDRESS)")
    p.add_argument("config", help="experiment YAML, e.g. experiments/fashion_mnist_vit.yaml")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. train.epochs=3")

    p = sub.add_parser("validate", help="check an experiment, sweep, benchmark or theory YAML (and its data) "
                                         "without running it")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--decode", action="store_true", help="also open every data file and name each unreadable one")

    p = sub.add_parser("doctor", help="self-check of this node: CUDA/bf16, NCCL, Ray, tracking store, storage, "
                                      "offline data")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    p.add_argument("--storage-path", default="ray_results", help="where checkpoints go (ray.storage_path)")

    p = sub.add_parser("demo", help="full-data baseline vs AtteNT on real data, offline, a few minutes")
    p.add_argument("--workdir", default=".", help="where mlflow.db and ray_results/ go")

    p = sub.add_parser("sweep", help="run a Ray Tune sweep declared in a YAML file")
    p.add_argument("config")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    p.add_argument("overrides", nargs="*")

    p = sub.add_parser("bench", help="time-to-accuracy benchmark: methods x workloads x seeds, one run at a time")
    p.add_argument("config", help="benchmark YAML, e.g. benchmarks/time_to_accuracy_small.yaml")
    p.add_argument("--out", default="reports", help="the report goes to <out>/<benchmark name>/")
    p.add_argument("--dry-run", action="store_true", help="list and check the runs, start nothing")
    p.add_argument("--workload", action="append", metavar="NAME",
                   help="only this workload (repeatable): a long one run on its own")
    p.add_argument("--local", action="store_true",
                   help="every run in this process on one device (the GPU if visible): Ray Train's local mode, "
                        "no Ray cluster")
    p.add_argument("--budget-s", type=float, default=float("inf"), metavar="SECONDS",
                   help="start a seed only if it would end within this many seconds, by the longest seed so far")
    p.add_argument("overrides", nargs="*", help="key.path=value for every run")

    p = sub.add_parser("downstream", help="run an experiment's downstream jobs on a finished training run")
    p.add_argument("config", help="the pretraining experiment YAML (its downstream: section)")
    p.add_argument("--run-id", required=True, help="MLflow run id of the pretraining run")
    p.add_argument("overrides", nargs="*")

    p = sub.add_parser("theory", help="theory lab: closed-form gradient check and Algorithm 1's teaching experiment")
    p.add_argument("config", help="theory YAML, e.g. experiments/theory_teaching.yaml")
    p.add_argument("overrides", nargs="*", help="key.path=value, e.g. teach.lr=0.25 seeds=[0,1]")
    p.add_argument("--out", default=None, help="also write summary.md, summary.json and figures/ here")


def add_service_commands(sub) -> None:
    """Commands that read results, serve the tracking store or make data."""
    p = sub.add_parser("report", help="tables and figures of an MLflow experiment, or of several benchmarks joined")
    p.add_argument("--experiment", help="MLflow experiment (optional with --with)")
    p.add_argument("--out", default="reports")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--margin", type=float, default=None,
                   help="equivalence margin of the tables' words (default: 0.01 for accuracy-like metrics)")
    p.add_argument("--with", dest="sources", action="append", default=[], metavar="SOURCE",
                   help="join another benchmark, read as one with the experiment's: EXPERIMENT[@TRACKING_URI] or "
                        "the per_run.csv a report saved (repeatable); writes the joined data-size view")
    p.add_argument("--size", action="append", default=[], metavar="WORKLOAD=N",
                   help="with --with: a workload's training-set size where no source gives it (repeatable)")

    p = sub.add_parser("ui", help="the MLflow dashboard over the local store, on 127.0.0.1")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)

    from . import server  # standard library only: the defaults below live there
    p = sub.add_parser("server", help="the MLflow tracking server concurrent trials and cluster nodes share")
    p.add_argument("--backend-store-uri", default=None,
                   help="SQL database: default $MLFLOW_TRACKING_URI if SQL, else sqlite:///mlflow.db here; "
                        "postgresql+psycopg2://user@host/db for a cluster")
    p.add_argument("--artifacts-destination", default=server.DEFAULT_ARTIFACTS,
                   help="where uploaded artifacts land (default ./mlartifacts; s3://... works)")
    p.add_argument("--host", default=server.DEFAULT_HOST,
                   help="default 127.0.0.1; this node's private IP to serve the cluster (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=server.DEFAULT_PORT)
    p.add_argument("--workers", type=int, default=server.DEFAULT_WORKERS,
                   help="server processes (default 4, as MLflow's)")
    p.add_argument("--allowed-hosts", default=None,
                   help="Host headers accepted (default: localhost, private IPs, this machine's names)")

    p = sub.add_parser("data", help="generate offline data sets")
    data = p.add_subparsers(dest="data_command", required=True)
    p = data.add_parser("scenes", help="rendered rgb/depth/semseg scenes in MultiMAE's layout")
    p.add_argument("--out", required=True, help="a new folder for <split>/{rgb,depth,semseg}/<class>/")
    p.add_argument("--train", type=int, default=10000, help="training scenes")
    p.add_argument("--test", type=int, default=2000, help="test scenes")
    p.add_argument("--size", type=int, default=32, help="image side in pixels (32-64 tested)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="processes (default: all CPUs)")


def cmd_validate(args) -> int:
    from .validate import validate
    return validate(args)


def cmd_train(args) -> int:
    from .config import load_experiment
    cfg = load_experiment(args.config, args.overrides).resolved()
    from .engine.preflight import check_experiment
    check_experiment(cfg)  # refuse before Ray (and torch) is even imported
    from .engine.driver import run_pipeline
    from .engine.progress import Console
    pipeline = run_pipeline(cfg, console=Console.for_cli(args.verbose))
    result, m = pipeline.training, pipeline.training.metrics
    evals = ", ".join(f"{k[5:]} {v:.4f}" for k, v in m.items() if k.startswith("eval_"))
    print(f"\n{cfg.name}: {evals}; {m.get('time_total_s', float('nan')):.1f}s training, "
          f"{result.wallclock_s:.1f}s wall-clock; MLflow run {result.run_id}"
          f"{' (resumed)' if result.resumed else ''} in {cfg.mlflow.tracking_uri}")
    for name, value in pipeline.downstream.items():
        print(f"  {name}: {value:.4f}")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    from .engine.progress import Console
    return run_demo(Path(args.workdir), Console.for_cli(args.verbose))


def cmd_sweep(args) -> int:
    from .sweep import run_sweep
    results = run_sweep(args.config, resume=args.resume, overrides=args.overrides)
    return 1 if any(r.error is not None for r in results) else 0  # scripts see failed trials


def cmd_bench(args) -> int:
    from .benchmark import executor_overrides, run_benchmark
    executor = "local" if args.local else "ray"
    if args.dry_run:
        args.overrides = executor_overrides(executor, args.overrides)
        return cmd_validate(args)
    from .engine.progress import Console
    out = run_benchmark(args.config, args.overrides, out_dir=args.out, console=Console.for_cli(args.verbose),
                        workloads=args.workload, executor=executor, budget_s=args.budget_s)
    if out is not None:
        print(f"\nreport: {out}/time_to_accuracy.md (CSV and figures beside it; also on the MLflow parent run)")
    return 0


def cmd_report(args) -> int:
    """The report (attent.analysis, which reads MLflow through the run contract alone), after the
    experiment's runs left RUNNING by a dead driver are closed KILLED (the report leaves them out);
    with --with, several benchmarks' runs (experiments, stores, saved per_run.csv files) joined."""
    from .config import ConfigError, sqlite_file
    if args.experiment is None and not args.sources:
        raise ConfigError("attent report needs --experiment NAME, or --with SOURCE to join saved results")
    uri = _tracking_uri(args.tracking_uri)
    store = sqlite_file(uri)
    needs_store = args.experiment is not None or any(not s.endswith(".csv") and "@" not in s for s in args.sources)
    if needs_store and store is not None and not store.is_file():  # before MLflow's import: a report only reads
        raise ConfigError(f"no MLflow store at {store}. Fix: give --tracking-uri the store the runs were logged "
                          f"to (attent train writes sqlite:///mlflow.db in the folder it runs in)")
    from attent.analysis.report import main as report_main
    from .engine.tracking import close_runs_of_dead_drivers_in
    if args.experiment is not None:
        close_runs_of_dead_drivers_in(uri, args.experiment)
    margin = [] if args.margin is None else ["--margin", str(args.margin)]
    joined = [f"--with={s}" for s in args.sources] + [f"--size={s}" for s in args.size]
    experiment = [] if args.experiment is None else ["--experiment", args.experiment]
    return report_main([*experiment, "--out", args.out, "--tracking-uri", uri, *margin, *joined])


def _tracking_uri(given: str | None) -> str:
    """The store the CLI reads: given, else $MLFLOW_TRACKING_URI, else ./mlflow.db (as train writes)."""
    from .config import absolute_sqlite_uri
    return absolute_sqlite_uri(given or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db", Path.cwd())


def cmd_ui(args) -> int:
    """`mlflow ui` over the store as a child: its links are printed once it answers."""
    from . import server
    uri = _tracking_uri(args.tracking_uri)
    server.check_port_free(args.host, args.port)
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
               "--host", args.host, "--port", str(args.port), "--workers", "1"]
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
    backend = _tracking_uri(args.backend_store_uri or (env if server.is_sql_uri(env) else server.DEFAULT_BACKEND))
    spec = server.ServerSpec(backend, server.resolve_artifacts(args.artifacts_destination, Path.cwd()),
                             args.host, args.port, args.workers, args.allowed_hosts)
    server.check_spec(spec)

    def announce() -> None:
        print(f"MLflow tracking server: export MLFLOW_TRACKING_URI={spec.url}  (store {backend}; artifacts "
              f"{spec.artifacts_destination}; Ctrl-C stops it)", flush=True)
        if log:
            print(f"(the server's own log: {log})", flush=True)
    log = None if args.verbose else server_log("server", spec.port)
    return server.serve_in_foreground(server.server_command(spec), server.local_url(spec.host, spec.port),
                                      announce, log)


def cmd_downstream(args) -> int:
    """The downstream jobs of a pretraining config on the weights of a given pretraining run,
    linked to it and logged back to it as on `attent train`."""
    from .config import ConfigError, load_experiment
    cfg = load_experiment(args.config, args.overrides).resolved()
    if not cfg.downstream:
        raise ConfigError(f"{args.config} has no downstream: section")
    from .engine.preflight import check_experiment
    check_experiment(cfg)
    from .engine.driver import run_downstream
    from .engine.progress import Console
    finals = run_downstream(cfg, args.run_id, Console.for_cli(args.verbose))
    for name, value in finals.items():
        print(f"  {name}: {value:.4f}")
    return 0


def cmd_doctor(args) -> int:
    """`attent doctor`: a self-check of this node, one line per check."""
    from .doctor import run_checks
    return run_checks(_tracking_uri(args.tracking_uri), Path(args.storage_path))


def cmd_theory(args) -> int:
    """`attent theory FILE`: the theory lab (attent.theory), into MLflow."""
    from .theory.__main__ import run_cli
    return run_cli(args.config, args.overrides, out=args.out)


def cmd_data(args) -> int:
    """`attent data scenes`: render the offline multi-modal scenes (trimesh + Embree)."""
    from .tasks.mae.scenes import write_dataset
    s = write_dataset(Path(args.out), train=args.train, test=args.test, size=args.size,
                      seed=args.seed, workers=args.workers)
    print(f"{s['out']}: {s['train']} train + {s['test']} test scenes at {s['size']} px "
          f"(seed {s['seed']}) in {s['seconds']:.1f}s with {s['workers']} worker(s)")
    return 0


COMMANDS = {"train": cmd_train, "validate": cmd_validate, "demo": cmd_demo, "sweep": cmd_sweep, "bench": cmd_bench,
            "report": cmd_report, "ui": cmd_ui, "server": cmd_server, "downstream": cmd_downstream, "theory": cmd_theory,
            "data": cmd_data, "doctor": cmd_doctor}

if __name__ == "__main__":
    sys.exit(main())
