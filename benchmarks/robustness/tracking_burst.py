"""The bursts of benchmarks/robustness/tracking_load.py: N processes that only write into one tracking
backend, all released at the same instant, and what of their writes the backend kept."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tracking_backends import backend_uri

# A writer is a process of the study's own script (its --burst-writer): this module is no script.
STUDY = Path(__file__).with_name("tracking_load.py")

BURST_EXPERIMENT = "tracking-burst"
BURST_BATCHES, BURST_METRICS = 20, 20  # per writer: 20 log_batch calls of 20 metrics (one step each)


@dataclass
class BurstCount:
    backend: str
    writers: int
    new_store: bool  # the writers found no database yet (N `attent train` on a new mlflow.db)
    seconds: float = 0.0
    writers_failed: int = 0  # processes that died of an error
    runs_found: int = 0
    running: int = 0
    points_expected: int = 0
    points_found: int = 0
    locked: int = 0  # "database is locked" in the writers' output
    store_error: str = ""  # the store could not even be read afterwards (a broken migration)


def run_burst(backend: str, writers: int, workdir: Path, ports: Iterator[int], new_store: bool = False) -> BurstCount:
    """``writers`` processes released together, each creating a run and logging 400 points."""
    gate = workdir / "gate"
    gate.mkdir(parents=True, exist_ok=True)
    count = BurstCount(backend, writers, new_store, points_expected=writers * BURST_BATCHES * BURST_METRICS)
    with backend_uri(backend, workdir, ports) as uri:
        if not new_store:
            _experiment_id(uri)  # the database exists and is migrated before the burst
        logs = [open(workdir / f"writer-{i}.log", "wb") for i in range(writers)]
        procs = [
            subprocess.Popen(
                [sys.executable, str(STUDY), "--burst-writer", uri, str(gate), str(i)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for i, log in enumerate(logs)
        ]
        while len(list(gate.glob("ready-*"))) < writers and all(p.poll() is None for p in procs):
            time.sleep(0.05)
        start = time.perf_counter()
        (gate / "go").touch()
        count.writers_failed = sum(p.wait(timeout=900) != 0 for p in procs)
        count.seconds = time.perf_counter() - start
        for log in logs:
            log.close()
        try:
            _count_burst(uri, count)
        except Exception as error:  # e.g. a schema migration that concurrent writers left half done
            count.store_error = str(error).splitlines()[0][:120]
    count.locked = sum(
        len(re.findall("database is locked", (workdir / f"writer-{i}.log").read_text(errors="replace")))
        for i in range(writers)
    )
    return count


def _count_burst(uri: str, count: BurstCount) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(BURST_EXPERIMENT)
    runs = [] if experiment is None else client.search_runs([experiment.experiment_id], max_results=1000)
    count.runs_found = len(runs)
    count.running = sum(r.info.status == "RUNNING" for r in runs)
    count.points_found = sum(len(client.get_metric_history(r.info.run_id, key)) for r in runs for key in r.data.metrics)


def _experiment_id(uri: str) -> str:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(BURST_EXPERIMENT)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(BURST_EXPERIMENT)
    except Exception:  # another writer created it first
        return client.get_experiment_by_name(BURST_EXPERIMENT).experiment_id


def burst_writer(uri: str, gate: Path, index: int) -> None:
    """One writer of a burst: ready, wait for the gate, then create a run and log into it."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(uri)
    (gate / f"ready-{index}").touch()
    while not (gate / "go").exists():
        time.sleep(0.01)
    run = client.create_run(_experiment_id(uri), run_name=f"writer-{index}")
    for step in range(BURST_BATCHES):
        now = int(time.time() * 1000)
        client.log_batch(
            run.info.run_id, metrics=[Metric(f"m{k}", float(step), now, step) for k in range(BURST_METRICS)]
        )
    client.set_terminated(run.info.run_id)


def burst_table(counts: list[BurstCount]) -> str:
    rows = [
        "| backend | writers | store | seconds | writers failed | runs found | left RUNNING "
        '| points found / expected | "database is locked" | store afterwards |',
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in counts:
        rows.append(
            f"| {c.backend} | {c.writers} | {'new' if c.new_store else 'existing'} | {c.seconds:.0f} | "
            f"{c.writers_failed} | {c.runs_found} | {c.running} | {c.points_found} / {c.points_expected} "
            f"| {c.locked} | {('unreadable: ' + c.store_error) if c.store_error else 'fine'} |"
        )
    return "\n".join(rows)
