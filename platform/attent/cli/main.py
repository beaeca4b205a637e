"""The `attent` command: train, validate, plan, rehearse, demo, sweep, bench, downstream, theory, report, ui,
server, data, doctor, kuberay. Those that read results, serve the tracking store or make data (report, ui, server, data) are in
``attent.cli.services``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .extras import missing_extra, version
from .kuberay_command import add_kuberay_command, cmd_kuberay
from .plan import add_plan_command, cmd_plan
from .services import add_service_commands, cmd_data, cmd_report, cmd_server, cmd_ui, tracking_uri

USAGE_ERROR = 2


FAILURE = 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attent", description="AtteNT experiments on Ray and MLflow.")
    parser.add_argument("--version", action="version", version=f"attent {version()}")
    parser.add_argument("--debug", action="store_true", help="print an error's whole traceback, not one line")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print everything Ray, MLflow and the workers print (default: one progress line per "
        "run, the rest in the run's log file)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_commands(sub)
    add_service_commands(sub)
    add_kuberay_command(sub)
    add_plan_command(sub)
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
            from ..experiment.files import require_file

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
TRAINING_COMMANDS = ("train", "sweep", "bench", "demo", "downstream", "rehearse")


def exit_without_teardown(code: int) -> None:
    """Exit as ``sys.exit(code)`` would, less the interpreter's teardown of every module: with
    torch, Ray and MLflow loaded, freeing their objects one by one took 1-1.5 s of CPU after
    the last line was printed (measured: benchmarks/results/fixed_cost/fixed_cost.md). The atexit
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
    if (missing := missing_extra(exc)) is not None:  # before cli/errors.py, which needs the platform's packages
        print(f"attent {args.command}: error: {missing}", file=sys.stderr)
        return FAILURE
    from .errors import describe, log_traceback

    line, usage = describe(exc)
    where = "" if args.debug or usage else f" (traceback: {log_traceback(args.command, exc)}; --debug shows it here)"
    print(f"attent {args.command}: error: {line}{where}", file=sys.stderr)
    return USAGE_ERROR if usage else FAILURE


def add_run_commands(sub) -> None:
    """Commands that run or check experiments: train, validate, doctor, demo, sweep, then the studies'."""
    p = sub.add_parser("train", help="run one experiment (local Ray, or the cluster at $RAY_ADDRESS)")
    p.add_argument("config", help="experiment YAML, e.g. experiments/fashion_mnist_vit.yaml")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. train.epochs=3")

    p = sub.add_parser(
        "validate", help="check an experiment, sweep, benchmark or theory YAML (and its data) without running it"
    )
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--decode", action="store_true", help="also open every data file and name each unreadable one")

    p = sub.add_parser(
        "doctor", help="self-check of this node: CUDA/bf16, NCCL, Ray, tracking store, storage, offline data"
    )
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    p.add_argument("--storage-path", default="ray_results", help="where checkpoints go (ray.storage_path)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="the offline mirror the LLM task reads (task.data_dir; default $ATTENT_DATA_DIR)",
    )

    p = sub.add_parser("demo", help="full-data baseline vs AtteNT on real data, offline, a few minutes")
    p.add_argument("--workdir", default=".", help="where mlflow.db and ray_results/ go")

    p = sub.add_parser("sweep", help="run a Ray Tune sweep declared in a YAML file")
    p.add_argument("config")
    p.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        choices=["auto"],
        help="continue an interrupted sweep; --resume=auto: continue it if it is there, else start it",
    )
    p.add_argument("overrides", nargs="*")
    add_study_commands(sub)  # after sweep: --help lists the commands in the order they are added


def add_study_commands(sub) -> None:
    """The studies' commands: the benchmark, rehearsals, downstream jobs and the theory lab."""
    p = sub.add_parser("bench", help="time-to-accuracy benchmark: arms x workloads x seeds, one run at a time")
    p.add_argument("config", help="benchmark YAML, e.g. benchmarks/specs/time_to_accuracy_small.yaml")
    p.add_argument("--out", default="reports", help="the report goes to <out>/<benchmark name>/")
    p.add_argument("--dry-run", action="store_true", help="list and check the runs, start nothing")
    p.add_argument(
        "--workload", action="append", metavar="NAME", help="only this workload (repeatable): a long one run on its own"
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="every run in this process on one device (the GPU if visible): Ray Train's local mode, no Ray cluster",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=float("inf"),
        metavar="SECONDS",
        help="start a seed only if it would end within this many seconds, by the longest seed so far",
    )
    p.add_argument("overrides", nargs="*", help="key.path=value for every run")

    p = sub.add_parser(
        "rehearse",
        help="run experiment or sweep files end to end at a stand-in size where they would run, before buying them",
    )
    p.add_argument(
        "configs",
        nargs="+",
        metavar="config",
        help="experiment or sweep YAML files, then key.path=value overrides for each (a sweep's: its base)",
    )
    p.add_argument(
        "--shared-folder",
        default=None,
        metavar="DIR",
        help="a folder standing for the cluster's shared storage: the files' /shared/... paths are read "
        "under it (default: the cluster's own)",
    )
    p.add_argument("--out", default="reports", help="the sweeps' reports go to <out>/<sweep>-rehearsal/")

    p = sub.add_parser("downstream", help="run an experiment's downstream jobs on a finished training run")
    p.add_argument("config", help="the pretraining experiment YAML (its downstream: section)")
    p.add_argument("--run-id", required=True, help="MLflow run id of the pretraining run")
    p.add_argument("overrides", nargs="*")

    p = sub.add_parser("theory", help="theory lab: closed-form gradient check and Algorithm 1's teaching experiment")
    p.add_argument("config", help="theory YAML, e.g. experiments/theory_teaching.yaml")
    p.add_argument("overrides", nargs="*", help="key.path=value, e.g. teach.lr=0.25 seeds=[0,1]")
    p.add_argument("--out", default=None, help="also write summary.md, summary.json and figures/ here")


def cmd_validate(args) -> int:
    from .validate import validate

    return validate(args)


def cmd_train(args) -> int:
    from ..experiment.files import load_experiment

    cfg = load_experiment(args.config, args.overrides).resolved()
    from ..engine.preflight import check_experiment

    check_experiment(cfg)  # refuse before Ray (and torch) is even imported
    from ..engine.driver import run_pipeline
    from ..engine.progress import Console

    pipeline = run_pipeline(cfg, console=Console.for_cli(args.verbose))
    result, m = pipeline.training, pipeline.training.metrics
    evals = ", ".join(f"{k[5:]} {v:.4f}" for k, v in m.items() if k.startswith("eval_"))
    print(
        f"\n{cfg.name}: {evals}; {m.get('time_total_s', float('nan')):.1f}s training, "
        f"{result.wallclock_s:.1f}s wall-clock; MLflow run {result.run_id}"
        f"{' (resumed)' if result.resumed else ''} in {cfg.mlflow.tracking_uri}"
    )
    for name, value in pipeline.downstream.items():
        print(f"  {name}: {value:.4f}")
    return 0


def cmd_demo(args) -> int:
    from ..engine.progress import Console
    from .demo import run_demo

    return run_demo(Path(args.workdir), Console.for_cli(args.verbose))


def cmd_sweep(args) -> int:
    from ..sweep.tune import run_sweep

    results = run_sweep(args.config, resume=args.resume, overrides=args.overrides)
    return 1 if any(r.error is not None for r in results) else 0  # scripts see failed trials


def cmd_bench(args) -> int:
    from ..benchmark import executor_overrides, run_benchmark

    executor = "local" if args.local else "ray"
    if args.dry_run:
        args.overrides = executor_overrides(executor, args.overrides)
        return cmd_validate(args)
    from ..engine.progress import Console

    out = run_benchmark(
        args.config,
        args.overrides,
        out_dir=args.out,
        console=Console.for_cli(args.verbose),
        workloads=args.workload,
        executor=executor,
        budget_s=args.budget_s,
    )
    if out is not None:
        print(f"\nreport: {out}/time_to_accuracy.md (CSV and figures beside it; also on the MLflow parent run)")
    return 0


def cmd_rehearse(args) -> int:
    """`attent rehearse FILE...`: each file's stand-in, its unreachable parts named before any worker."""
    from ..experiment.files import require_file

    overrides = [word for word in args.configs if "=" in word and not Path(word).is_file()]
    files = [require_file(word) and word for word in args.configs if word not in overrides]  # before Ray
    from ..engine.progress import Console
    from ..rehearsal.run import rehearse

    return rehearse(
        files, overrides, shared_folder=args.shared_folder, out=Path(args.out), console=Console.for_cli(args.verbose)
    )


def cmd_downstream(args) -> int:
    """The downstream jobs of a pretraining config on the weights of a given pretraining run,
    linked to it and logged back to it as on `attent train`."""
    from ..experiment.files import load_experiment
    from ..experiment.schema import ConfigError

    cfg = load_experiment(args.config, args.overrides).resolved()
    if not cfg.downstream:
        raise ConfigError(f"{args.config} has no downstream: section")
    from ..engine.preflight import check_experiment

    check_experiment(cfg)
    from ..engine.driver import run_downstream
    from ..engine.progress import Console

    finals = run_downstream(cfg, args.run_id, Console.for_cli(args.verbose))
    for name, value in finals.items():
        print(f"  {name}: {value:.4f}")
    return 0


def cmd_doctor(args) -> int:
    """`attent doctor`: a self-check of this node, one line per check."""
    from .doctor import run_checks

    return run_checks(tracking_uri(args.tracking_uri), Path(args.storage_path), args.data_dir)


def cmd_theory(args) -> int:
    """`attent theory FILE`: the theory lab (attent.lab, running attent.theory's maths), into MLflow."""
    from ..lab.__main__ import run_cli

    return run_cli(args.config, args.overrides, out=args.out)


COMMANDS = {
    "train": cmd_train,
    "validate": cmd_validate,
    "demo": cmd_demo,
    "sweep": cmd_sweep,
    "bench": cmd_bench,
    "report": cmd_report,
    "ui": cmd_ui,
    "server": cmd_server,
    "downstream": cmd_downstream,
    "rehearse": cmd_rehearse,
    "theory": cmd_theory,
    "data": cmd_data,
    "doctor": cmd_doctor,
    "kuberay": cmd_kuberay,
    "plan": cmd_plan,
}
