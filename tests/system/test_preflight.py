"""Preflight on Ray clusters: a cluster without an autoscaler refuses impossible resources before any worker exists
(the session's), and one with an autoscaler (a head of its own with Ray's fake autoscaler) makes it a visible wait
(the rest of preflight: tests/engine/test_preflight.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from attent.engine.preflight import cluster

from tests.engine.test_preflight import DIGITS, RETURNS_WITHIN_S, attent
from tests.helpers.paths import BIN
from tests.helpers.processes import free_port, stop_ray_processes


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
