"""Preflight: an unreachable MLflow server or impossible Ray resources are refused in seconds,
before any worker or MLflow run exists, with the fix in the message; an autoscaler makes it a
visible wait instead. Real `attent` subprocesses, real Ray clusters (the tracking store's own
checks: test_preflight_tracking.py)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from attent.engine.preflight import cluster, resources
from conftest import BIN, REPO, free_port, stop_ray_processes

DIGITS = str(REPO / "experiments/digits_vit.yaml")
# A hang (today's failure) never returns; a refusal takes the CLI's import time plus seconds.
# Generous, for a loaded 2-core machine: the bound proves "returns", not "is fast".
RETURNS_WITHIN_S = 180


# ---------------------------------------------------------------------------- resources (unit)


def test_fit_counts_are_per_node():
    assert resources.fit_count({"CPU": 1}, {"CPU": 2}) == 2
    assert resources.fit_count({"CPU": 0.5}, {"CPU": 2}) == 4
    assert resources.fit_count({"CPU": 4}, {"CPU": 2}) == 0  # fits no 2-CPU node, whatever their number
    assert resources.fit_count({"CPU": 1, "GPU": 1}, {"CPU": 8, "GPU": 2}) == 2
    assert resources.fit_count({"CPU": 1, "accel": 1}, {"CPU": 8}) == 0


def test_room_follows_the_placement_strategy():
    nodes = [{"CPU": 4}, {"CPU": 1}, {"CPU": 0}]
    assert resources.room(3, {"CPU": 1}, nodes, "PACK") >= 3
    assert resources.room(3, {"CPU": 1}, nodes, "SPREAD") >= 3
    assert resources.room(3, {"CPU": 1}, nodes, "STRICT_SPREAD") == 2  # one per node, two nodes can host
    assert resources.room(5, {"CPU": 1}, nodes, "STRICT_PACK") == 4  # all on the largest node
    assert resources.room(2, {"CPU": 2}, [], "PACK") == 0


# Shapes as Ray 2.60's v1 monitor wrote them (`__autoscaling_status`), for a hand-started head
# (read-only provider) and one started with --autoscaling-config.
READONLY_STATUS = {
    "autoscaler_report": {
        "active_nodes": {"node_1e4dac82": 1},
        "pending_nodes": [],
        "pending_launches": {},
        "node_type_mapping": {"1e4dac82": "node_1e4dac82"},
        "legacy": True,
    }
}
AUTOSCALING_STATUS = {
    "autoscaler_report": {
        "active_nodes": {"ray.head.default": 1},
        "pending_nodes": [],
        "pending_launches": {},
        "node_type_mapping": {"ffff0000": "ray.head.default"},
        "legacy": True,
    }
}


def test_v1_status_tells_an_autoscaler_from_the_read_only_monitor():
    assert cluster.autoscaler_from_v1_status(json.dumps(READONLY_STATUS)) is None
    assert cluster.autoscaler_from_v1_status(None) is None
    scaler = cluster.autoscaler_from_v1_status(json.dumps(AUTOSCALING_STATUS).encode())
    assert scaler is not None and scaler.node_types == ["ray.head.default"]
    assert scaler.max_workers({"CPU": 1}) is None  # v1 does not publish its limits


def test_published_node_groups_bound_what_an_autoscaler_can_reach():
    scaler = cluster.Autoscaler(
        "cluster config in the GCS",
        groups=[("head", {"CPU": 2}, 1), ("cpu", {"CPU": 2}, 3), ("gpu", {"CPU": 4, "GPU": 1}, 0)],
    )
    assert scaler.max_workers({"CPU": 1}) == 8
    assert scaler.max_workers({"CPU": 4}) == 0  # the only 4-CPU group may have no node
    assert scaler.max_workers({"CPU": 1, "GPU": 1}) == 0
    unbounded = cluster.Autoscaler("x", groups=[("cpu", {"CPU": 2}, -1)], max_resources={"CPU": 10})
    assert unbounded.max_workers({"CPU": 1}) == 10


# ---------------------------------------------------------------------------- the CLI, end to end


def attent(args: list[str], cwd: Path, env_extra: dict[str, str] | None = None, drop=("RAY_ADDRESS",)):
    env = {k: v for k, v in os.environ.items() if k not in drop and k != "MLFLOW_TRACKING_URI"}
    env.update(OMP_NUM_THREADS="1", **(env_extra or {}))
    start = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "attent"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=RETURNS_WITHIN_S
    )  # a hang fails the test here
    return proc, time.monotonic() - start


def runs_in(db: Path) -> list:
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        return con.execute("select run_uuid from runs").fetchall()


def too_many_workers() -> int:
    return max(8, 4 * (os.cpu_count() or 1))


@pytest.fixture
def short_ray_tmp():
    """A private RAY_TMPDIR (short: Ray's socket paths have a length limit), so no cluster
    recorded by someone's `ray start` is joined instead of starting a local Ray."""
    path = tempfile.mkdtemp(prefix="pf", dir="/tmp")
    yield path
    subprocess.run(["rm", "-rf", path], check=False)


def test_train_with_an_unreachable_tracking_server_fails_fast(tmp_path, short_ray_tmp):
    port = free_port()
    proc, elapsed = attent(
        [
            "train",
            DIGITS,
            f"mlflow.tracking_uri=http://127.0.0.1:{port}",
            f"ray.storage_path={tmp_path / 'ray_results'}",
        ],
        tmp_path,
        {"RAY_TMPDIR": short_ray_tmp},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"attent train: error: MLflow tracking server http://127.0.0.1:{port} is unreachable" in proc.stderr
    assert "attent ui" in proc.stderr and "mlflow.tracking_uri" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ray_results").exists() and not (tmp_path / "mlflow.db").exists()
    assert not list(Path(short_ray_tmp).glob("session_*"))  # no Ray was started
    print(f"refused in {elapsed:.1f}s")


def test_train_with_more_workers_than_this_machine_fails_before_ray(tmp_path, short_ray_tmp):
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    n = too_many_workers()
    proc, elapsed = attent(
        [
            "train",
            DIGITS,
            f"ray.num_workers={n}",
            f"mlflow.tracking_uri=sqlite:///{db}",
            f"ray.storage_path={tmp_path / 'ray_results'}",
        ],
        tmp_path,
        {"RAY_TMPDIR": short_ray_tmp},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr
    assert f"attent train: error: ray.num_workers={n} × ray.cpus_per_worker=1 needs {n} CPUs" in err
    assert "lower ray.num_workers to at most" in err and "ray.address (or $RAY_ADDRESS)" in err
    assert "Traceback" not in err and "TrainController" not in err
    assert runs_in(db) == [] and not db.exists()  # no MLflow run, no store created
    assert not list(Path(short_ray_tmp).glob("session_*"))  # refused before a local Ray started
    print(f"refused in {elapsed:.1f}s")


def test_validate_runs_the_same_checks_without_ray(tmp_path, short_ray_tmp):
    proc, _ = attent(["validate", DIGITS, "ray.cpus_per_worker=64"], tmp_path, {"RAY_TMPDIR": short_ray_tmp})
    assert proc.returncode == 2
    assert "attent validate: error: one worker needs 64 CPU" in proc.stderr
    assert "lower ray.cpus_per_worker" in proc.stderr
    assert not list(Path(short_ray_tmp).glob("session_*"))


def test_sweep_with_more_workers_than_this_machine_fails_before_its_parent_run(tmp_path, short_ray_tmp):
    db = tmp_path / "mlflow.db"
    proc, _ = attent(
        [
            "sweep",
            str(REPO / "experiments/sweeps/ablation_digits.yaml"),
            f"ray.num_workers={too_many_workers()}",
            f"mlflow.tracking_uri=sqlite:///{db}",
            f"ray.storage_path={tmp_path / 'ray_results'}",
        ],
        tmp_path,
        {"RAY_TMPDIR": short_ray_tmp},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "attent sweep: error: ray.num_workers=" in proc.stderr
    assert not db.exists() and not (tmp_path / "ray_results").exists()


# ---------------------------------------------------------------------------- real clusters


def train_controllers(dashboard: str) -> int:
    from ray.util.state import list_actors

    return len(
        list_actors(
            address=dashboard,
            filters=[("class_name", "=", "TrainController")],
            limit=10_000,
            raise_on_missing_output=False,
        )
    )


@pytest.mark.system
def test_cluster_without_autoscaler_refuses_before_any_worker(ray_cluster, tmp_path):
    """The session cluster: `ray start --head --num-cpus=2`, no --autoscaling-config."""
    db = tmp_path / "mlflow.db"
    controllers = train_controllers(ray_cluster["dashboard"])
    proc, elapsed = attent(
        [
            "train",
            DIGITS,
            "ray.num_workers=8",
            f"mlflow.tracking_uri=sqlite:///{db}",
            f"ray.storage_path={tmp_path / 'ray_results'}",
        ],
        tmp_path,
        {"RAY_ADDRESS": ray_cluster["address"], "RAY_AUTH_MODE": "token"},
        drop=(),
    )
    err = proc.stderr
    assert proc.returncode == 2, err[-3000:]
    assert "attent train: error: ray.num_workers=8 workers need 8 CPU in all (1 CPU each)" in err
    assert "has 2 CPU on 1 node(s), room for 2 such worker(s)" in err
    assert "no autoscaler that could add nodes" in err
    assert "lower ray.num_workers to at most 2" in err and cluster.WAIT_ENV in err
    assert train_controllers(ray_cluster["dashboard"]) == controllers  # Ray Train never started
    assert not db.exists()
    print(f"refused in {elapsed:.1f}s")


FAKE_AUTOSCALING = {
    "cluster_name": "fake_multinode",
    "max_workers": 3,
    "provider": {
        "type": "fake_multinode",
        "use_node_id_as_ip": True,
        "disable_node_updaters": True,
        "disable_launch_config_check": True,
    },
    "available_node_types": {
        "ray.head.default": {"resources": {"CPU": 2}, "node_config": {}, "max_workers": 0},
        "ray.worker.cpu": {"resources": {"CPU": 2}, "node_config": {}, "min_workers": 0, "max_workers": 3},
    },
    "head_node_type": "ray.head.default",
    "auth": {},
    "upscaling_speed": 1.0,
    "idle_timeout_minutes": 1,
    "docker": {},
    "initialization_commands": [],
    "setup_commands": [],
    "head_setup_commands": [],
    "worker_setup_commands": [],
    "head_start_ray_commands": [],
    "worker_start_ray_commands": [],
    "file_mounts": {},
    "cluster_synced_files": [],
    "file_mounts_sync_continuously": False,
    "rsync_exclude": [],
    "rsync_filter": [],
}

CHECK_ON_CLUSTER = """
import sys, ray
from attent.experiment.files import load_experiment
from attent.engine.driver import ensure_ray
from attent.engine.preflight.cluster import check_cluster_resources
cfg = load_experiment(sys.argv[1], ["ray.num_workers=8"]).resolved()
ensure_ray(cfg)
check_cluster_resources(cfg)
print("CHECK RETURNED", flush=True)
"""


@pytest.mark.system
def test_cluster_with_an_autoscaler_waits_visibly(tmp_path):
    """A head with Ray's fake multi-node autoscaler (v1, worker type of 2 CPUs, up to 3 nodes):
    8 CPUs do not fit now but may later, so the check announces the wait and lets Train go on.
    The check creates no demand, so no node is launched."""
    config = tmp_path / "autoscaling.json"
    config.write_text(json.dumps(FAKE_AUTOSCALING))
    temp = Path(tempfile.mkdtemp(prefix="pfas", dir="/tmp"))
    port = free_port()
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
    env.pop("RAY_enable_autoscaler_v2", None)
    try:
        subprocess.run(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={free_port()}",
                "--num-cpus=2",
                "--disable-usage-stats",
                f"--temp-dir={temp}",
                f"--autoscaling-config={config}",
            ],
            check=True,
            capture_output=True,
            timeout=180,
            env=env,
        )
        env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token", "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, "-c", CHECK_ON_CLUSTER, DIGITS],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=RETURNS_WITHIN_S,
        )
    finally:
        stop_ray_processes(temp)
        subprocess.run(["rm", "-rf", str(temp)], check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CHECK RETURNED" in proc.stdout
    assert "[attent] waiting for resources: ray.num_workers=8 workers need 8 CPU in all" in proc.stderr
    assert "The autoscaler (autoscaler v1; node types ray.head.default) can add nodes" in proc.stderr
    assert "lower ray.num_workers to at most 2" in proc.stderr


def test_strict_spread_on_a_local_ray_is_refused(tmp_path, short_ray_tmp):
    proc, _ = attent(
        ["validate", DIGITS, "ray.num_workers=2", "ray.cpus_per_worker=0.5", "ray.placement_strategy=STRICT_SPREAD"],
        tmp_path,
        {"RAY_TMPDIR": short_ray_tmp},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "STRICT_SPREAD puts each of the ray.num_workers=2 workers on its own node" in proc.stderr
    assert "Traceback" not in proc.stderr
