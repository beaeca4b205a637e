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

    python benchmarks/fixed_cost.py                          # 3 rounds x 2 runs, table to stdout
    python benchmarks/fixed_cost.py --workers 0 1 --md out.md --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "experiments" / "fashion_mnist_vit.yaml"
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

DAEMONS = (("gcs_server", "gcs_server"), ("raylet/raylet", "raylet"), ("dashboard/agent.py", "dashboard agent"),
           ("runtime_env/agent", "runtime env agent"), ("dashboard/dashboard.py", "dashboard"),
           ("ray-dashboard-", "dashboard"), ("multiprocessing", "dashboard"), ("log_monitor", "log monitor"),
           ("autoscaler/_private/monitor.py", "autoscaler monitor"), ("default_worker.py", "idle worker"))


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
    from attent.config import load_experiment
    from attent.tasks.vision.files import find_fashion_mnist
    try:
        find_fashion_mnist(None)
        data = [f"task.train_limit={args.samples}", "task.test_limit=500"]
    except FileNotFoundError:
        data = ["task.dataset=digits", "task.train_limit=null", "task.test_limit=null"]
    return load_experiment(CONFIG, [
        f"name={name}", "selection.preset=null", "selection.method=full", f"train.epochs={args.epochs}",
        *data, f"train.eval_every={args.epochs}", f"ray.num_workers={workers}", "ray.cpus_per_worker=1",
        f"ray.storage_path={workdir}/ray_results", f"mlflow.tracking_uri=sqlite:///{workdir}/mlflow.db",
        "mlflow.experiment=fixed-cost"]).resolved()


def child(args) -> None:
    """One round: what `attent train` does, with timestamps, into <workdir>/fixed_cost.json."""
    import psutil
    marks = {"process_started": psutil.Process().create_time(), "script_started": time.time(), "pid": os.getpid()}
    from attent.config import load_experiment  # noqa: F401 -- the CLI's first import
    marks["config_imported"] = time.time()
    from attent import contract
    from attent.engine import driver
    from attent.engine.tracking import client_for
    marks["driver_imported"] = time.time()
    workdir = args.workdir
    sampler = CpuSampler()
    sampler.start()
    runs = []
    for number in range(args.runs):
        cfg = experiment(args, f"fixed-cost-{os.getpid()}-{number}", workdir, args.workers[0])
        phases = f"{workdir}/phases-{number}.jsonl"
        clock = phase_clock(phases)
        run = {"driver_started": time.time()}
        if number == 0 and cfg.ray.num_workers:  # local mode starts no Ray
            driver.ensure_ray(cfg)
            run["ray_ready"] = time.time()
        fit_started = {}

        class TimedTrainer(driver.TorchTrainer):
            def fit(self):
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
        run["setup_parts"] = {k[len("time_setup_"):-2]: v for k, v in m.items()
                              if k.startswith("time_setup_") and k != contract.TIME_SETUP}
        run["epoch_s"] = m[contract.TIME_TOTAL] / cfg.train.epochs
        run["cpu_startup"] = sampler.cpu_between(run["driver_started"], run["setup_done"])
        run["cpu_training"] = sampler.cpu_between(run["setup_done"], run["epochs_ended"])
        run["training_window_s"] = run["epochs_ended"] - run["setup_done"]
        runs.append(run)
    sampler.stop.set()
    marks["runs_done"] = time.time()
    import ray
    ray.shutdown()  # what atexit does after `attent train` (nothing in local mode)
    marks["ray_shut_down"] = time.time()
    Path(workdir, "fixed_cost.json").write_text(json.dumps({"marks": marks, "runs": runs, "load": os.getloadavg()}))
    try:  # and then the CLI's exit
        from attent.cli import exit_without_teardown
    except ImportError:  # an engine from before it
        return
    exit_without_teardown(0)


def one_round(args, number: int, workers: int) -> dict:
    workdir = tempfile.mkdtemp(prefix="attent-fixed-cost-")
    env = {**os.environ, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(args.health_check)} if args.health_check else dict(os.environ)
    env["RAY_TMPDIR"] = env.get("RAY_TMPDIR", "/tmp")
    command = [sys.executable, __file__, "--child", "--workdir", workdir, "--runs", str(args.runs),
               "--epochs", str(args.epochs), "--samples", str(args.samples), "--workers", str(workers)]
    started = time.time()
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=workdir)
    ended = time.time()
    result = Path(workdir, "fixed_cost.json")
    Path(workdir, "stdout.txt").write_text(out.stdout)
    Path(workdir, "stderr.txt").write_text(out.stderr)
    if out.returncode or not result.exists():
        errors = [l for l in (out.stdout + out.stderr).splitlines() if "import time:" not in l]
        sys.stderr.write("\n".join(errors[-60:]) + "\n")
        raise SystemExit(f"round {number + 1} failed (exit {out.returncode}); its output is in {workdir}")
    data = json.loads(result.read_text())
    data["marks"]["spawned"], data["marks"]["exited"] = started, ended
    result.write_text(json.dumps(data))
    data["workdir"], data["workers"] = workdir, workers
    return data


# --- the table ----------------------------------------------------------------------------------

# (phase, from, to) on the timeline of one run; the first run adds the driver's start and Ray's.
FIRST_ONLY = [("python start + CLI imports", "process_started", "config_imported"),
              ("driver imports (ray, torch, mlflow)", "config_imported", "driver_imported"),
              ("ray.init (local)", "driver_started", "ray_ready")]
PHASES = [("MLflow run, preflight", "ray_ready", "fit_called"),
          ("fit() -> training function entered (local mode)", "fit_called", "entered"),
          ("fit() -> controller up", "fit_called", "controller_started"),
          ("placement group + worker process + actor init", "controller_started", "workers_created"),
          ("train context + torch process group (gloo)", "workers_created", "backend_ready"),
          ("train fn unpickled (our imports) + launched", "backend_ready", "train_fn_launched"),
          ("worker set-up (task, data, model, MLflow)", "train_fn_launched", "setup_done"),
          ("set-up in the driver's process (task, data, model, MLflow)", "entered", "setup_done"),
          ("after the last epoch -> workers stopped", "epochs_ended", "workers_stopped"),
          ("controller finishes, fit() returns, run closed", "workers_stopped", "train_returned"),
          ("after the last epoch -> fit() returns, run closed", "epochs_ended", "train_returned")]
LOCAL_ONLY = {"fit() -> training function entered (local mode)", "set-up in the driver's process (task, data, model, MLflow)",
              "after the last epoch -> fit() returns, run closed"}


def phase_rows(rounds: list[dict]) -> list[tuple[str, list[float], list[float]]]:
    """(phase, seconds in first runs, seconds in later runs)."""
    rows = []
    for name, start, end in FIRST_ONLY + PHASES:
        first, later = [], []
        for data in rounds:
            for number, run in enumerate(data["runs"]):
                if number > 0 and (name, start, end) in FIRST_ONLY:
                    continue
                points = {**data["marks"], **run}
                if name in LOCAL_ONLY and data.get("workers", 1) != 0:  # Ray's rows lack their marks there
                    continue
                if start == "ray_ready" and (number > 0 or "ray_ready" not in run):
                    points["ray_ready"] = run["driver_started"]
                if start in points and end in points:
                    (first if number == 0 else later).append(points[end] - points[start])
        rows.append((name, first, later))
    setup_parts = sorted({k for data in rounds for run in data["runs"] for k in run["setup_parts"]})
    for part in setup_parts:
        first = [d["runs"][0]["setup_parts"].get(part, 0.0) for d in rounds]
        later = [r["setup_parts"].get(part, 0.0) for d in rounds for r in d["runs"][1:]]
        rows.append((f"  set-up: {part}", first, later))
    marks = [d["marks"] for d in rounds]
    rows.append(("ray.shutdown()", [m["ray_shut_down"] - m["runs_done"] for m in marks if "ray_shut_down" in m], []))
    rows.append(("interpreter exit", [m["exited"] - m.get("ray_shut_down", m["runs_done"]) for m in marks if "exited" in m], []))
    return rows


def totals(rounds: list[dict]) -> tuple[list[float], list[float]]:
    """Fixed cost per run: everything but the epochs (first runs from process start to exit)."""
    first, later = [], []
    for data in rounds:
        for number, run in enumerate(data["runs"]):
            epochs = run["epochs_ended"] - run["setup_done"]
            if number == 0:
                end = data["marks"].get("exited", run["train_returned"]) if len(data["runs"]) == 1 else run["train_returned"]
                first.append(end - data["marks"]["process_started"] - epochs)
            else:
                later.append(run["train_returned"] - run["driver_started"] - epochs)
    return first, later


def fmt(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{min(values):.2f} / {statistics.median(values):.2f}"


def cpu_rows(rounds: list[dict], key: str) -> list[tuple[str, list[float]]]:
    kinds = sorted({k for d in rounds for r in d["runs"] for k in r[key]})
    rows = []
    for kind in kinds:
        rows.append((kind, [r[key].get(kind, 0.0) for d in rounds for r in d["runs"][1:] or d["runs"]]))
    return sorted(rows, key=lambda row: -statistics.median(row[1]))


def report(args, rounds: list[dict]) -> str:
    load = [d["load"] for d in rounds]
    workers = rounds[0].get("workers", 1)
    mode = "Ray Train's local mode (ray.num_workers 0), 1 CPU" if workers == 0 else f"{workers} worker(s) x 1 CPU"
    lines = [f"{len(rounds)} round(s) x {args.runs} run(s) of {args.epochs} epoch(s), {args.samples} images, "
             f"{mode}; RAY_TRAIN_HEALTH_CHECK_INTERVAL_S={args.health_check or 'engine default'}; "
             f"load average at round ends (1 min): {', '.join(f'{l[0]:.1f}' for l in load)}; "
             f"{os.cpu_count()} CPUs", "",
             "| phase | first run of a process, s (min / median) | later runs, same Ray, s (min / median) |",
             "|---|---:|---:|"]
    for name, first, later in phase_rows(rounds):
        lines.append(f"| {name} | {fmt(first)} | {fmt(later)} |")
    first, later = totals(rounds)
    lines.append(f"| **fixed cost per run** (wall-clock minus epochs) | **{fmt(first)}** | **{fmt(later)}** |")
    epoch = [r["epoch_s"] for d in rounds for r in d["runs"]]
    lines += ["", f"Epochs: {statistics.median(epoch):.2f} s each (median).", "",
              "CPU seconds by process kind from the run's start to its first epoch (later runs; the first "
              "run when there is one run per round), median:", "",
              "| process | CPU s |", "|---|---:|"]
    lines += [f"| {kind} | {statistics.median(v):.2f} |" for kind, v in cpu_rows(rounds, "cpu_startup")]
    window = statistics.median(r["training_window_s"] for d in rounds for r in d["runs"])
    lines += ["", f"CPU seconds by process kind while the epochs ran ({window:.1f} s window), median "
              "(share of one core in brackets):", "", "| process | CPU s | share of a core |", "|---|---:|---:|"]
    for kind, values in cpu_rows(rounds, "cpu_training"):
        windows = [r["training_window_s"] for d in rounds for r in d["runs"][1:] or d["runs"]]
        share = statistics.median(v / w for v, w in zip(values, windows))
        lines.append(f"| {kind} | {statistics.median(values):.2f} | {share:.1%} |")
    return "\n".join(lines)


def side_by_side(by_mode: dict[int, list[dict]]) -> str:
    """Fixed cost per run of each mode, and each mode's over the first's (medians)."""
    base = by_mode[next(iter(by_mode))]
    (base_first, base_later) = totals(base)
    lines = ["| ray.num_workers | first run of a process, s (min / median) | later runs, s (min / median) | "
             "first / first's | later / first's |", "|---:|---:|---:|---:|---:|"]
    for workers, rounds in by_mode.items():
        first, later = totals(rounds)
        ratio = [statistics.median(v) / statistics.median(b) if v and b else float("nan")
                 for v, b in ((first, base_first), (later, base_later))]
        lines.append(f"| {workers} | {fmt(first)} | {fmt(later)} | {ratio[0]:.2f} | {ratio[1]:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh driver processes")
    parser.add_argument("--runs", type=int, default=2, help="training runs per process (one Ray session)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--health-check", type=float, default=None,
                        help="RAY_TRAIN_HEALTH_CHECK_INTERVAL_S for the rounds (default: the engine's)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1],
                        help="ray.num_workers of each mode measured (0: Ray Train's local mode); rounds alternate")
    parser.add_argument("--md", type=Path, help="append the table to this Markdown file")
    parser.add_argument("--json", type=Path, help="write every timestamp here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    rounds = []
    for number in range(args.rounds):
        for workers in args.workers:  # side by side: the modes alternate, one round at a time
            rounds.append(one_round(args, number, workers))
            print(f"round {number + 1}/{args.rounds}, ray.num_workers={workers} done, load {os.getloadavg()[0]:.1f}",
                  file=sys.stderr, flush=True)
    by_mode = {w: [r for r in rounds if r.get("workers", 1) == w] for w in args.workers}
    text = "\n\n".join(report(args, of_mode) for of_mode in by_mode.values() if of_mode)
    if len(by_mode) > 1:
        text += "\n\n" + side_by_side(by_mode)
    print(text)
    if args.md:
        with args.md.open("a") as f:
            f.write(text + "\n\n")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
