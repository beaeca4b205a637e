"""Preflight: an unreachable MLflow server or impossible Ray resources are refused in seconds,
before any worker or MLflow run exists, with the fix in the message; an autoscaler makes it a
visible wait instead. Real `attent` subprocesses, real Ray clusters (the tracking store's own
checks: test_preflight_tracking.py; a cluster's resources, the session's and one with Ray's fake autoscaler:
tests/system/test_preflight.py)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from attent.engine.preflight import cluster, resources
from attent.engine.preflight.nodes import check_store_reaches_nodes, local_storage
from attent.experiment.schema import PreflightError

from tests.helpers.paths import BIN, REPO
from tests.helpers.processes import free_port

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


def test_strict_spread_on_a_local_ray_is_refused(tmp_path, short_ray_tmp):
    proc, _ = attent(
        ["validate", DIGITS, "ray.num_workers=2", "ray.cpus_per_worker=0.5", "ray.placement_strategy=STRICT_SPREAD"],
        tmp_path,
        {"RAY_TMPDIR": short_ray_tmp},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "STRICT_SPREAD puts each of the ray.num_workers=2 workers on its own node" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_store_inside_ray_job_submits_copy_of_the_working_dir_is_refused(tmp_path, monkeypatch):
    """`ray job submit --working-dir .` runs the job in Ray's copy of the folder, deleted after the
    job: the default sqlite:///mlflow.db and ray_results resolved inside it, and the run never reached
    the user's store. Refused before anything starts, naming the absolute paths; absolute ones pass."""
    from attent.engine.preflight import check_experiment
    from attent.experiment.files import load_experiment
    from attent.experiment.schema import PreflightError

    copy = tmp_path / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123abcd"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for overrides, key in (
        ([], "mlflow.tracking_uri"),
        ([f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"], "ray.storage_path"),
    ):
        cfg = load_experiment(DIGITS, overrides).resolved()
        with pytest.raises(PreflightError) as refused:
            check_experiment(cfg)
        assert str(refused.value).startswith(f"{key} resolves to {copy}/")
        assert "ray.storage_path=/<abs path>/ray_results" in str(refused.value)
    cfg = load_experiment(DIGITS, [f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db", f"ray.storage_path={tmp_path}/rr"])
    from attent.engine.preflight import check_outside_job_copy

    check_outside_job_copy(cfg.resolved())


def test_the_store_rule_refuses_a_store_on_one_machine_for_several_nodes():
    """The one rule, without a cluster: a SQLite file or a file store is refused on two nodes (not on one);
    a server, a database server or Databricks pass. Only a local ``ray.storage_path`` is checked."""
    for uri in ("sqlite:////x/mlflow.db", "file:///x/mlruns", "/x/mlruns", "mlruns"):
        check_store_reaches_nodes(uri, 1)
        with pytest.raises(PreflightError, match="attent server --host <this node's private IP>"):
            check_store_reaches_nodes(uri, 2)
    for uri in ("http://10.0.0.1:5000", "https://mlflow.example", "postgresql://u@db/mlflow", "databricks"):
        check_store_reaches_nodes(uri, 2)
    assert local_storage("/shared/ray_results") == Path("/shared/ray_results")
    assert local_storage("file:///shared/ray_results") == Path("/shared/ray_results")
    assert local_storage("s3://bucket/ray_results") is None and local_storage("gs://b/r") is None
