"""What one training run pays before its first epoch and after its last, phase by phase.

Each round is a fresh process doing what ``attent train`` does (imports, a local Ray,
``driver.train``) for ``--runs`` small runs in a row: Fashion-MNIST ViT on ``--samples`` images
(sklearn digits without it), full data, one CPU. A round's first run pays the imports and Ray's
start; later ones what every run of a sweep, benchmark or demo pays in the same Ray session.
Phases, off one machine's wall-clock: the driver's (imports, ``ray.init``, MLflow run, ``fit()``);
Ray Train's controller, through its internal callback interface (for this measurement only):
controller up, worker actors ready, torch process group, training function launched, workers
stopped; the worker's own split of its set-up (``time_setup_<part>_s``); CPU seconds of every
process below the driver (psutil, every 0.1 s), by kind.
``--workers 0 1``: Ray Train's local mode (``ray.num_workers: 0``, the run in the driver's process,
no Ray started) beside one Ray Train worker, the rounds alternating, with the ratio of their costs.

    python benchmarks/overheads/fixed_cost.py                          # 3 rounds x 2 runs
    python benchmarks/overheads/fixed_cost.py --workers 0 1 --md benchmarks/results/fixed_cost/fixed_cost.md

Writes ``README.md`` (the tables, the command, the machine) and ``rounds.json`` (every timestamp) into
``--out``, by default a new folder ``benchmarks/results/fixed_cost/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "fashion_mnist_vit.yaml"
SAMPLE_EVERY_S = 0.1


def phase_clock(path: str):
    """A Ray Train callback (its internal controller / worker-group interface, for this
    measurement only) that appends (event, unix time) lines to ``path`` from inside Train's
    controller. Defined after the driver's imports, pickled by value."""
    from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

    class PhaseClock(ControllerCallback, WorkerGroupCallback):
        def mark(self, event: str, **extra) -> None:
            with open(path, "a") as f:
                f.write(json.dumps({"event": event, "t": time.time(), **extra}) + "\n")

        def after_controller_start(self, train_run_context):
            import psutil

            me = psutil.Process()
            self.mark("controller_started", pid=me.pid, created=me.create_time())

        def before_init_train_context(self, workers):
            import psutil

            created = [psutil.Process(w.metadata.pid).create_time() for w in workers]
            self.mark("workers_created", worker_created=created)
            return {}

        def after_worker_group_start(self, worker_group):
            self.mark("backend_ready")

        def after_worker_group_training_start(self, worker_group):
            self.mark("train_fn_launched")

        def after_worker_group_shutdown(self, worker_group_context):
            self.mark("workers_stopped")

    return PhaseClock()


# --- processes and their CPU ----------------------------------------------------------------
DAEMONS = (
    ("gcs_server", "gcs_server"),
    ("raylet/raylet", "raylet"),
    ("dashboard/agent.py", "dashboard agent"),
    ("runtime_env/agent", "runtime env agent"),
    ("dashboard/dashboard.py", "dashboard"),
    ("ray-dashboard-", "dashboard"),
    ("multiprocessing", "dashboard"),
    ("log_monitor", "log monitor"),
    ("autoscaler/_private/monitor.py", "autoscaler monitor"),
    ("default_worker.py", "idle worker"),
)


def process_kind(titles: list[str]) -> str:
    """A Ray process by the titles it showed: its actor's class, a daemon's name, or 'idle worker'
    (a worker process that ran no actor)."""
    for title in titles:
        if title.startswith("ray::") and not title.startswith("ray::IDLE"):
            return title[5:].split()[0].split(".")[0]
    for title in titles:
        for marker, kind in DAEMONS:
            if marker in title:
                return kind
    return "idle worker" if any(t.startswith("ray::IDLE") for t in titles) else titles[0][:40]


class CpuSampler(threading.Thread):
    """Every process below this one: kind, creation time, and its CPU seconds over time."""

    def __init__(self):
        super().__init__(daemon=True)
        import psutil

        self.psutil, self.root = psutil, psutil.Process()
        self.seen: dict[int, dict] = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(SAMPLE_EVERY_S)

    def sample(self):
        now = time.time()
        for proc in self.root.children(recursive=True):
            try:
                cpu = proc.cpu_times()
                title = " ".join(proc.cmdline())
                info = self.seen.get(proc.pid) or {"created": proc.create_time(), "samples": [], "titles": []}
                if title and title not in info["titles"]:
                    info["titles"].append(title)
                info["samples"].append((now, cpu.user + cpu.system))
                self.seen[proc.pid] = info
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied, self.psutil.ZombieProcess):
                continue

    def cpu_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each kind of process used between two instants (sampled)."""
        used: dict[str, float] = {}
        for info in list(self.seen.values()):
            samples = list(info["samples"])
            if not samples:
                continue
            before = [c for t, c in samples if t <= start] or [0.0 if info["created"] >= start else samples[0][1]]
            within = [c for t, c in samples if t <= end]
            if within and info["titles"]:
                kind = process_kind(info["titles"])
                used[kind] = used.get(kind, 0.0) + max(0.0, within[-1] - before[-1])
        return used


# --- one round: a fresh driver process ----------------------------------------------------------
def experiment(args, name: str, workdir: str, workers: int):
    from attent.experiment.files import load_experiment
    from attent.tasks.vision.files import find_fashion_mnist

    try:
        find_fashion_mnist(None)
        data = [f"task.train_limit={args.samples}", "task.test_limit=500"]
    except FileNotFoundError:
        data = ["task.dataset=digits", "task.train_limit=null", "task.test_limit=null"]
    return load_experiment(
        CONFIG,
        [
            f"name={name}",
            "selection.preset=null",
            "selection.method=full",
            f"train.epochs={args.epochs}",
            *data,
            f"train.eval_every={args.epochs}",
            f"ray.num_workers={workers}",
            "ray.cpus_per_worker=1",
            f"ray.storage_path={workdir}/ray_results",
            f"mlflow.tracking_uri=sqlite:///{workdir}/mlflow.db",
            "mlflow.experiment=fixed-cost",
        ],
    ).resolved()


def one_run(args, number: int, sampler: CpuSampler) -> dict:
    """Run ``number`` of a round: ``driver.train`` with Train's phase clock and ``fit()`` timed,
    its timestamps from the driver, Train's controller and the worker's metrics, and CPU seconds
    by kind of process."""
    from attent import contract
    from attent.engine import driver
    from attent.engine.tracking import client_for

    workdir = args.workdir
    cfg = experiment(args, f"fixed-cost-{os.getpid()}-{number}", workdir, args.workers[0])
    phases = f"{workdir}/phases-{number}.jsonl"
    clock = phase_clock(phases)
    run = {"driver_started": time.time()}
    if number == 0 and cfg.ray.num_workers:  # local mode starts no Ray
        driver.ensure_ray(cfg)
        run["ray_ready"] = time.time()
    fit_started = {}

    class TimedTrainer(driver.TorchTrainer):
        def fit(self, fit_started=fit_started):
            fit_started["t"] = time.time()
            return super().fit()

    original, driver.TorchTrainer = driver.TorchTrainer, TimedTrainer
    try:
        result = driver.train(cfg, callbacks=[clock])
    finally:
        driver.TorchTrainer = original
    run["train_returned"] = time.time()
    run["fit_called"] = fit_started["t"]
    for line in Path(phases).read_text().splitlines() if Path(phases).exists() else []:
        event = json.loads(line)
        run[event["event"]] = event["t"]
        if "created" in event:
            run["controller_process_created"] = event["created"]
        if "worker_created" in event:
            run["worker_process_created"] = min(event["worker_created"])
    m = client_for(cfg.mlflow.tracking_uri).get_run(result.run_id).data.metrics
    run["entered"] = run["fit_called"] + m[contract.TIME_WORKER_START]
    run["setup_done"] = run["entered"] + m[contract.TIME_SETUP]
    run["epochs_ended"] = run["train_returned"] - m[contract.TIME_TEARDOWN]
    run["setup_parts"] = {
        k[len("time_setup_") : -2]: v for k, v in m.items() if k.startswith("time_setup_") and k != contract.TIME_SETUP
    }
    run["epoch_s"] = m[contract.TIME_TOTAL] / cfg.train.epochs
    run["cpu_startup"] = sampler.cpu_between(run["driver_started"], run["setup_done"])
    run["cpu_training"] = sampler.cpu_between(run["setup_done"], run["epochs_ended"])
    run["training_window_s"] = run["epochs_ended"] - run["setup_done"]
    return run


def child(args) -> None:
    """One round: what `attent train` does, with timestamps, into <workdir>/fixed_cost.json."""
    import psutil

    marks = {"process_started": psutil.Process().create_time(), "script_started": time.time(), "pid": os.getpid()}
    from attent.experiment.files import load_experiment  # noqa: F401 -- the CLI's first import

    marks["config_imported"] = time.time()
    from attent import contract  # noqa: F401 -- timed here: the driver's imports, as `attent train` pays them
    from attent.engine import driver  # noqa: F401
    from attent.engine.tracking import client_for  # noqa: F401

    marks["driver_imported"] = time.time()
    workdir = args.workdir
    sampler = CpuSampler()
    sampler.start()
    runs = [one_run(args, number, sampler) for number in range(args.runs)]
    sampler.stop.set()
    marks["runs_done"] = time.time()
    import ray

    ray.shutdown()  # what atexit does after `attent train` (nothing in local mode)
    marks["ray_shut_down"] = time.time()
    Path(workdir, "fixed_cost.json").write_text(json.dumps({"marks": marks, "runs": runs, "load": os.getloadavg()}))
    try:  # and then the CLI's exit
        from attent.cli.main import exit_without_teardown
    except ImportError:  # an engine from before it
        return
    exit_without_teardown(0)


def one_round(args, number: int, workers: int) -> dict:
    workdir = tempfile.mkdtemp(prefix="attent-fixed-cost-")
    env = (
        {**os.environ, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(args.health_check)}
        if args.health_check
        else dict(os.environ)
    )
    env["RAY_TMPDIR"] = env.get("RAY_TMPDIR", "/tmp")
    command = [
        sys.executable,
        __file__,
        "--child",
        "--workdir",
        workdir,
        "--runs",
        str(args.runs),
        "--epochs",
        str(args.epochs),
        "--samples",
        str(args.samples),
        "--workers",
        str(workers),
    ]
    started = time.time()
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=workdir)
    ended = time.time()
    result = Path(workdir, "fixed_cost.json")
    Path(workdir, "stdout.txt").write_text(out.stdout)
    Path(workdir, "stderr.txt").write_text(out.stderr)
    if out.returncode or not result.exists():
        errors = [line for line in (out.stdout + out.stderr).splitlines() if "import time:" not in line]
        sys.stderr.write("\n".join(errors[-60:]) + "\n")
        raise SystemExit(f"round {number + 1} failed (exit {out.returncode}); its output is in {workdir}")
    data = json.loads(result.read_text())
    data["marks"]["spawned"], data["marks"]["exited"] = started, ended
    result.write_text(json.dumps(data))
    data["workdir"], data["workers"] = workdir, workers
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh driver processes")
    parser.add_argument("--runs", type=int, default=2, help="training runs per process (one Ray session)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument(
        "--health-check",
        type=float,
        default=None,
        help="RAY_TRAIN_HEALTH_CHECK_INTERVAL_S for the rounds (default: the engine's)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1],
        help="ray.num_workers of each mode measured (0: Ray Train's local mode); rounds alternate",
    )
    parser.add_argument(
        "--out", type=Path, help="results folder (default: a new stamped one under results/fixed_cost/)"
    )
    parser.add_argument("--md", type=Path, help="also append the tables to this Markdown file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness (not in a round)
    import harness
    from fixed_cost_tables import report, side_by_side  # beside this script

    info, rounds = harness.machine(), []
    for number in range(args.rounds):
        for workers in args.workers:  # side by side: the modes alternate, one round at a time
            rounds.append(one_round(args, number, workers))
            print(
                f"round {number + 1}/{args.rounds}, ray.num_workers={workers} done, load {os.getloadavg()[0]:.1f}",
                file=sys.stderr,
                flush=True,
            )
    by_mode = {w: [r for r in rounds if r.get("workers", 1) == w] for w in args.workers}
    text = "\n\n".join(report(args, of_mode) for of_mode in by_mode.values() if of_mode)
    if len(by_mode) > 1:
        text += "\n\n" + side_by_side(by_mode)
    out = harness.results_folder(args.out, info)
    harness.write_json(out / "rounds.json", {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds})
    print(
        harness.write_readme(
            out, "A training run's fixed cost, phase by phase", harness.command_line(argv), text, info
        ).read_text()
    )
    if args.md:
        with args.md.open("a") as f:
            f.write(text + "\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
