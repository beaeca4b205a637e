"""Concurrent trials against MLflow: what each tracking backend keeps.

A sweep of N one-epoch digits trials, all N at once (`attent sweep`, max_concurrent N, each
trial's worker asking for 2/N CPUs), logs into one backend:
- sqlite-direct: every trial writes straight into one SQLite file (sqlite:////…/mlflow.db), the
  sweep's own server turned off ($ATTENT_SWEEP_DIRECT_SQLITE=1);
- sqlite: the default for that URI: the sweep serves the file with a tracking server of its own;
- server-sqlite / server-postgresql: every trial logs over HTTP through `attent server`, whose
  store is that SQLite file or a PostgreSQL cluster started here (initdb in a temporary
  directory, unix socket only, as the postgres user when run as root).
Then it counts, through MLflow's API, every metric point (each trial's metric history),
every artifact, the runs left RUNNING or FAILED and the errors in the sweep's output.

The expected points of a trial are the (metric, step) pairs any trial of the backend logged,
plus the contract's names the engine always logs (per epoch at step 0, at the end at step 1),
so a point lost in every run is still counted as lost.

    python benchmarks/robustness/tracking_load.py                 # 8 trials; bursts of 8 and 16 writers
    python benchmarks/robustness/tracking_load.py --trials 8 12 --backends sqlite-direct server-postgresql

Writes ``README.md`` (the tables, the command, the machine) and ``counts.json`` (every count, with the
floors the engine's contract sets) into ``--out``, by default a new folder
``benchmarks/results/tracking_load/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attent import contract
from tracking_backends import ATTENT, BACKENDS, backend_uri, free_ports, local_postgres, postgres_unavailable
from tracking_burst import BURST_BATCHES, BURST_METRICS, BurstCount, burst_table, burst_writer, run_burst

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

REPO = harness.REPO
BASE = REPO / "experiments" / "digits_vit.yaml"
EXPERIMENT = "tracking-load"
EPOCHS = 1
TRAIN_SAMPLES = 300
CORE_ARTIFACTS = ("config.yaml", "selection_history.json", "epoch_history.json")
# What the engine always logs, from the contract: per epoch (step 0) and at the end (step EPOCHS).
PER_EPOCH = (
    contract.TRAIN_LOSS,
    contract.SELECTED_RATIO,
    contract.TIME_METHOD,
    contract.TIME_TOTAL,
    contract.SAMPLES_FORWARDED,
    contract.SAMPLES_BACKPROPAGATED,
    *(contract.time_metric(part) for part in contract.TIME_PARTS),
)
START = (
    contract.TIME_SETUP,
    contract.TIME_WORKER_START,
    contract.NUM_TRAIN_SAMPLES,
    contract.TIME_WALLCLOCK,
    contract.TIME_STARTUP,
    contract.TIME_TEARDOWN,
)
FINAL = (
    contract.SAMPLE_SAVING,
    contract.MEAN_SELECTED_RATIO,
    contract.MAX_SELECTED_RATIO,
    contract.OPTIMIZER_STEPS,
    contract.SAMPLES_BACKPROPAGATED,
    contract.TIME_METHOD,
)
# Lines of the sweep's output that tell of a write that failed (or had to be retried).
ERROR_PATTERNS = {
    "database is locked": r"database is locked",
    "OperationalError": r"OperationalError",
    "MLflow API error": r"API request to .* failed|MlflowException|RestException",
    "retried request": r"Retrying \(|Retry\(total",
}


@dataclass
class LoadCount:
    backend: str
    trials: int
    seconds: float = 0.0  # the sweep's wall-clock (`attent sweep`, Ray start-up included)
    sweep_exit_code: int | None = None
    runs_found: int = 0  # trial runs in MLflow
    finished: int = 0
    running: int = 0  # left RUNNING: nobody will ever close them
    failed: int = 0
    parent_status: str = "missing"
    points_expected: int = 0
    points_found: int = 0
    points_duplicated: int = 0  # a (metric, step) logged more than once in one run
    artifacts_expected: int = 0
    artifacts_found: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # ERROR_PATTERNS -> lines in the output
    lost_examples: list[str] = field(default_factory=list)

    @property
    def lost_anything(self) -> bool:
        return (
            self.points_found < self.points_expected
            or self.artifacts_found < self.artifacts_expected
            or self.running
            or self.failed
            or self.runs_found < self.trials
            or self.sweep_exit_code != 0
        )


# ------------------------------------------------------------------------------------------
# The load: one sweep of concurrent trials
# ------------------------------------------------------------------------------------------


def write_sweep(workdir: Path, name: str, trials: int, tracking_uri: str, workers: int = 1) -> Path:
    """N one-epoch digits trials (seeds 0..N-1), all at once, each worker on 2/N CPUs; on the Ray
    at $RAY_ADDRESS, else on a fresh local one (never on another Ray `ray start` left running).
    ``workers`` 0: each trial trains in its own process (Ray Train's local mode), the same writers."""
    path = workdir / f"{name}.yaml"
    address = "" if os.environ.get("RAY_ADDRESS") else "\n    ray.address: local"
    path.write_text(f"""
sweep:
  name: {name}
  base: {BASE}
  overrides:
    train.epochs: {EPOCHS}
    task.train_limit: {TRAIN_SAMPLES}
    ray.cpus_per_worker: {2 / trials:g}
    ray.num_workers: {workers}
    ray.storage_path: {workdir / "ray_results"}
    mlflow.tracking_uri: '{tracking_uri}'
    mlflow.experiment: {EXPERIMENT}{address}
  seeds: {list(range(trials))}
  max_concurrent: {trials}
""")
    return path


def run_sweep_command(sweep: Path, log_path: Path, extra_env: dict[str, str] | None = None) -> tuple[int, float]:
    """`attent sweep FILE` (joins $RAY_ADDRESS if set, else starts a local Ray); (exit code, seconds)."""
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        done = subprocess.run(
            [str(ATTENT), "sweep", str(sweep)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(extra_env or {})},
            cwd=sweep.parent,
            timeout=1800,
        )
    return done.returncode, time.perf_counter() - start


def run_load(backend: str, trials: int, workdir: Path, ports: Iterator[int], workers: int = 1) -> LoadCount:
    """One sweep of ``trials`` concurrent trials into ``backend``, counted (``workers``: per trial)."""
    from attent.sweep.tune import DIRECT_SQLITE_ENV

    workdir.mkdir(parents=True, exist_ok=True)
    name, log = f"load-{backend}-{trials}", workdir / f"load-{backend}-{trials}.log"
    env = {DIRECT_SQLITE_ENV: "1" if backend == "sqlite-direct" else ""}
    with backend_uri(backend, workdir, ports) as uri:
        code, seconds = run_sweep_command(write_sweep(workdir, name, trials, uri, workers), log, env)
        count = count_logged(uri, name, trials)
    count.backend, count.seconds, count.sweep_exit_code = backend, seconds, code
    count.errors = count_errors(log.read_text(errors="replace"))
    return count


def count_errors(output: str) -> dict[str, int]:
    return {what: len(re.findall(pattern, output)) for what, pattern in ERROR_PATTERNS.items()}


# ------------------------------------------------------------------------------------------
# Counting what landed
# ------------------------------------------------------------------------------------------


def count_logged(tracking_uri: str, sweep: str, trials: int) -> LoadCount:
    """Every metric point and artifact of the sweep's trial runs, and their statuses."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    count = LoadCount(backend="", trials=trials)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = (
        []
        if experiment is None
        else client.search_runs(
            [experiment.experiment_id], f"tags.`{contract.TAG_SWEEP}` = '{sweep}'", max_results=1000
        )
    )
    kids = [r for r in runs if r.data.tags.get(contract.TAG_ROLE) == contract.ROLE_TRIAL]
    parents = [r for r in runs if r.data.tags.get(contract.TAG_ROLE) == contract.ROLE_SWEEP]
    count.parent_status = parents[0].info.status if parents else "missing"
    count.runs_found = len(kids)
    statuses = [r.info.status for r in kids]
    count.finished, count.running, count.failed = (statuses.count(s) for s in ("FINISHED", "RUNNING", "FAILED"))
    points = {r.info.run_id: metric_points(client, r) for r in kids}
    files = {r.info.run_id: artifact_files(client, r.info.run_id) for r in kids}
    expected_points = expected_metric_points(points.values())
    expected_files = set(CORE_ARTIFACTS).union(*files.values())
    count.points_expected = len(expected_points) * trials  # a missing run loses all of its points
    count.artifacts_expected = len(expected_files) * trials
    for run_id in points:
        logged = points[run_id]
        count.points_found += len(expected_points & set(logged))
        count.points_duplicated += sum(n - 1 for n in logged.values() if n > 1)
        count.artifacts_found += len(expected_files & files[run_id])
        missing = sorted(expected_points - set(logged)) + sorted(expected_files - files[run_id])
        count.lost_examples += [f"{run_id[:8]}: {m}" for m in missing[:3]]
    return count


def metric_points(client, run) -> dict[tuple[str, int], int]:
    """(metric, step) -> how many points the run's history holds; system metrics (sampled every
    few seconds, so no count is expected of them) left out."""
    points: dict[tuple[str, int], int] = {}
    for key in run.data.metrics:
        if key.startswith(contract.SYSTEM_METRICS_PREFIX):
            continue
        for metric in client.get_metric_history(run.info.run_id, key):
            points[(key, metric.step)] = points.get((key, metric.step), 0) + 1
    return points


def expected_metric_points(logged: Iterator[dict[tuple[str, int], int]]) -> set[tuple[str, int]]:
    """What any trial logged, plus the contract's names every run logs."""
    expected = {(key, 0) for key in PER_EPOCH + START} | {(key, EPOCHS) for key in FINAL}
    for points in logged:
        expected |= set(points)
    return expected


def artifact_files(client, run_id: str, path: str | None = None) -> set[str]:
    """Every artifact file of a run, recursively (relative paths)."""
    found = set()
    for info in client.list_artifacts(run_id, path):
        found |= artifact_files(client, run_id, info.path) if info.is_dir else {info.path}
    return found


# ------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------


def table(counts: list[LoadCount]) -> str:
    rows = [
        "| backend | trials | sweep (s) | sweep exit | trial runs | FINISHED / RUNNING / FAILED | parent "
        "| metric points found / expected | duplicated | artifacts found / expected | errors in output |",
        "|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for c in counts:
        errors = ", ".join(f"{what} ×{n}" for what, n in c.errors.items() if n) or "none"
        rows.append(
            f"| {c.backend} | {c.trials} | {c.seconds:.0f} | {c.sweep_exit_code} | {c.runs_found} | "
            f"{c.finished} / {c.running} / {c.failed} | {c.parent_status} | {c.points_found} / "
            f"{c.points_expected} | {c.points_duplicated} | {c.artifacts_found} / {c.artifacts_expected} "
            f"| {errors} |"
        )
    return "\n".join(rows)


def measure(args, workdir: Path) -> tuple[list[LoadCount], list[BurstCount]]:
    """Every (size, backend) of the command line, one at a time."""
    loads, bursts, ports = [], [], free_ports()
    runnable = [b for b in args.backends if not (b == "server-postgresql" and postgres_unavailable())]
    for writers in args.burst_writers:
        for backend, new_store in [(b, False) for b in runnable if b != "sqlite"] + [("sqlite-direct", True)]:
            bursts.append(
                run_burst(backend, writers, workdir / f"burst-{backend}-{writers}-{new_store}", ports, new_store)
            )
            print(burst_table(bursts[-1:]), flush=True)
    for trials in args.trials:
        for backend in runnable:
            loads.append(run_load(backend, trials, workdir / f"{backend}-{trials}", ports, args.workers))
            print(table(loads[-1:]), flush=True)
    return loads, bursts


def write_report(args, loads: list[LoadCount], bursts: list[BurstCount], info: dict) -> Path:
    """README.md (the tables) and counts.json (every count, with the floors) in the results folder."""
    report = (
        f"## Concurrent trials\n\nOne sweep per row, all trials at "
        f"once, {EPOCHS} epoch of digits ({TRAIN_SAMPLES} samples) each; points and artifacts counted "
        f"through MLflow's API (system metrics, sampled every few seconds, left out).\n\n{table(loads)}\n"
    )
    lost = [f"- {c.backend} × {c.trials}: " + "; ".join(c.lost_examples[:5]) for c in loads if c.lost_examples]
    if lost:
        report += "\nFirst points or artifacts missing:\n\n" + "\n".join(lost) + "\n"
    report += (
        f"\n## Bursts of writers\n\nN processes released at the same instant, each creating a run and "
        f"logging {BURST_BATCHES} batches of {BURST_METRICS} metrics (MLflow's client, no engine); "
        f"'new' store: no database exists yet, as for N `attent train` on a new mlflow.db."
        f"\n\n{burst_table(bursts)}\n"
    )
    out = harness.results_folder(args.out, info)
    floors = {
        "points_floor_per_trial": len(PER_EPOCH) + len(START) + len(FINAL),
        "artifacts_floor_per_trial": len(CORE_ARTIFACTS),
    }
    harness.write_json(
        out / "counts.json",
        {**floors, "loads": [dataclasses.asdict(c) for c in loads], "bursts": [dataclasses.asdict(c) for c in bursts]},
    )
    return harness.write_readme(out, "Concurrent writers against MLflow backends", harness.command_line(), report, info)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--burst-writer"]:  # one writer process of a burst
        burst_writer(argv[1], Path(argv[2]), int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="*", default=[8])
    parser.add_argument("--burst-writers", type=int, nargs="*", default=[8, 16])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument(
        "--out", type=Path, help="results folder (default: a new stamped one under results/tracking_load/)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, stores)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Ray Train workers per trial (0: each trial trains in its own process, local mode)",
    )
    parser.add_argument(
        "--why-no-postgres",
        action="store_true",
        help="print why server-postgresql cannot run here (nothing if it can) and stop",
    )
    parser.add_argument(
        "--serve-postgres",
        type=int,
        metavar="PORT",
        help="start a throwaway PostgreSQL on PORT, print its URI, keep it until stdin closes (for the tests)",
    )
    args = parser.parse_args(argv)
    if args.why_no_postgres:
        print(postgres_unavailable() or "", end="")
        return 0
    if args.serve_postgres:
        with local_postgres(args.serve_postgres) as uri:
            print(uri, flush=True)
            sys.stdin.read()  # until the caller closes it
        return 0
    if "server-postgresql" in args.backends and postgres_unavailable():
        print(f"skipping server-postgresql: {postgres_unavailable()}", flush=True)
    info, workdir = harness.machine(), Path(tempfile.mkdtemp(prefix="attent-tracking-load-"))
    try:
        loads, bursts = measure(args, workdir)
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    readme = write_report(args, loads, bursts, info)
    print(f"\n{readme.read_text()}\nwritten to {readme.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
