"""Faults of the system tier, each ending in one line that names the cause and the fix, with nothing recorded lost:
no readable checkpoint under Ray Train's restarts, a tracking server refusing our Host header, a driver killed
mid-run taking its worker with it, and two drivers of one run (the other faults: tests/engine/test_faults.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import mlflow
import pytest
from attent.engine.faults import RunFault
from attent.experiment.schema import PreflightError

from tests.engine.test_faults import digits, runs_named
from tests.helpers.paths import BIN
from tests.helpers.processes import free_port, ray_processes


def test_no_readable_checkpoint_stops_at_once_with_one_line_in_the_same_run(ray_cluster, tmp_path, mlflow_uri):
    """On a Ray Train worker: the restarts Ray Train would make find the worker's note and stop."""
    from attent.engine.driver import train

    cfg = digits(
        tmp_path,
        mlflow_uri,
        "corrupt-all",
        fault={"fail_once_after_epoch": 0},
        ray={"num_workers": 1, "max_failures": 0},
    )
    with pytest.raises(Exception):  # noqa: B017 -- the injected fault, whatever its type
        train(cfg)
    (only,) = (p for p in (Path(cfg.ray.storage_path) / cfg.name).glob("checkpoint_*") if p.is_dir())
    (only / "state.pt").write_bytes(b"not a checkpoint")
    cfg = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"max_failures": 3})})
    with pytest.raises(RunFault) as fault:
        train(cfg)
    message = str(fault.value)
    assert "no checkpoint of this run can be read" in message and str(only) in message
    assert "delete" in message and "\n" not in message
    client, runs = runs_named(mlflow_uri, cfg.name)
    assert len(runs) == 1 and runs[0].info.status == "FAILED"  # the same run, not a new one
    assert "train_loss" in runs[0].data.metrics  # epoch 1, logged before, kept


# --- 2. a tracking server that refuses the API ----------------------------------------------------
def test_a_server_refusing_our_host_header_is_refused_before_anything_starts(tmp_path):
    from attent.engine.preflight import store

    port = free_port()
    proc = subprocess.Popen(
        [
            str(BIN / "attent"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp_path}/m.db",
            "--artifacts-destination",
            str(tmp_path / "art"),
            "--port",
            str(port),
            "--workers",
            "1",
            "--allowed-hosts",
            "tracking.example.org",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    from attent.server import app as server

    try:
        server.wait_ready(f"http://127.0.0.1:{port}", proc)
        with pytest.raises(PreflightError) as refused:
            store.check_tracking(f"http://127.0.0.1:{port}")
        message = str(refused.value)
        assert "refuses its API" in message and f"127.0.0.1:{port}" in message
        assert "attent server --allowed-hosts" in message and "mlflow server --allowed-hosts" in message
    finally:
        server.stop(proc)


# --- 4. a killed driver, and two drivers of one run ----------------------------------------------
def test_workers_stop_with_their_killed_driver_and_a_second_driver_refuses(ray_cluster, tmp_path, mlflow_uri):
    """A second driver of a live run refuses, and `attent report` leaves the live driver's run
    RUNNING. SIGKILLed, the driver takes its workers with it; the next `attent report` closes its
    run KILLED, saying so, and leaves it out of the report."""
    import psutil

    cfg = tmp_path / "long.yaml"
    env = dict(os.environ, RAY_ADDRESS=ray_cluster["address"])
    driver = start_a_long_driver(cfg, tmp_path, mlflow_uri, env)
    try:
        client = mlflow.MlflowClient(mlflow_uri)
        run_id = run_with_two_epochs(client, "faults")

        second = subprocess.run(
            [str(BIN / "attent"), "train", str(cfg)], env=env, capture_output=True, text=True, timeout=300
        )
        assert second.returncode == 2
        line = second.stderr.strip().splitlines()[-1]
        assert "is being trained by another `attent train` (pid" in line and str(driver.pid) in line
        report = attent_report(mlflow_uri, tmp_path)
        assert "closed" not in report.stderr and "(1 unfinished, 0 killed)" in report.stderr
        assert client.get_run(run_id).info.status == "RUNNING"  # its driver lives

        workers = [
            p
            for p in ray_processes(ray_cluster["temp_dir"])  # this cluster's, not another Ray's
            if "RayTrainWorker" in " ".join(p.cmdline())
        ]
        assert workers
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive  # the watchdog ended them within seconds
        logged = len(client.get_metric_history(run_id, "train_loss"))
        time.sleep(3)
        assert len(client.get_metric_history(run_id, "train_loss")) == logged  # nothing logs into the run now
        assert client.get_run(run_id).info.status == "RUNNING"  # as the dead driver left it

        report = attent_report(mlflow_uri, tmp_path)
        assert (
            f"[attent] closed 1 run left RUNNING by a dead driver (pid {driver.pid} on {socket.gethostname()}): "
            "orphan → KILLED"
        ) in report.stderr.splitlines()
        assert client.get_run(run_id).info.status == "KILLED"
        assert report.returncode == 1 and "has no finished training runs (0 unfinished, 1 killed)" in report.stderr
    finally:
        if driver.poll() is None:
            driver.kill()


def start_a_long_driver(cfg: Path, tmp_path: Path, mlflow_uri: str, env: dict[str, str]) -> subprocess.Popen:
    """`attent train` of a 200-epoch run written to ``cfg``, in a session of its own (to be killed)."""
    cfg.write_text(
        json.dumps(
            {
                "name": "orphan",
                "task": {"name": "vision", "dataset": "digits", "model": {"preset": "vit_tiny_cpu"}},
                "train": {"epochs": 200, "batch_size": 32},
                "selection": {"method": "full"},
                "ray": {"num_workers": 1, "storage_path": str(tmp_path / "ray_results"), "checkpoint_every": 1000},
                "mlflow": {"tracking_uri": mlflow_uri, "experiment": "faults"},
            }
        )
    )
    return subprocess.Popen(
        [str(BIN / "attent"), "train", str(cfg)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def run_with_two_epochs(client, experiment: str) -> str:
    """The id of the experiment's first run once it has logged two epochs (within 300 s)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = client.search_experiments(filter_string=f"name = '{experiment}'")
        runs = client.search_runs([found[0].experiment_id]) if found else []
        if runs and len(client.get_metric_history(runs[0].info.run_id, "train_loss")) >= 2:
            break
        time.sleep(1)
    return runs[0].info.run_id


def attent_report(uri: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(BIN / "attent"),
            "report",
            "--experiment",
            "faults",
            "--tracking-uri",
            uri,
            "--out",
            str(tmp_path / "reports"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
