"""Preflight on a cluster of two nodes, before any worker starts: a ``ray.storage_path`` the nodes do not
share, and a tracking store that lies on one machine (SQLite), are each refused in one line naming the fix.

A real two-node Ray cluster on this machine (`ray start --head`, then `ray start --address` for the second
node), whose second node does not share one folder with the first: its `ray start` runs in a mount namespace
of its own (`unshare --user --map-root-user --mount`), where an empty tmpfs is mounted over that folder.
Every process of that node (its raylet, and the workers it starts for tasks) sees the tmpfs at that path,
the driver and the head node the machine's folder: two machines' local disks at one path, as a node-local
`ray.storage_path` is on a real cluster. The check itself runs for real: the driver writes its marker in the
folder, a task pinned to each node looks for it and writes its own, the driver looks for each node's.
Skipped, saying why, where unprivileged user namespaces are off."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest
from attent.engine.preflight.nodes import MARKER

from tests.engine.test_preflight import DIGITS, RETURNS_WITHIN_S, attent
from tests.helpers.paths import BIN, REPO
from tests.helpers.processes import free_port, stop_ray_processes

UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]
# One pytest-xdist worker runs the module: its cluster (the module's fixture) is started once, not on each.
pytestmark = pytest.mark.xdist_group("split_nodes")


def namespaces_work() -> str | None:
    """None if this machine lets a user mount a tmpfs in a namespace of its own; else why not."""
    if shutil.which("unshare") is None:
        return "no unshare(1) here (util-linux)"
    probe = subprocess.run([*UNSHARE, "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"no unprivileged mount namespaces here: {probe.stderr.strip()}"


def ray_start(temp: Path, *args: str, prefix: list[str] = ()) -> None:
    subprocess.run(
        [*prefix, str(BIN / "ray"), "start", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
         f"--temp-dir={temp}", f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
         f"--runtime-env-agent-port={free_port()}", *args],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip


@pytest.fixture(scope="module")
def split_nodes(tmp_path_factory):
    """Head + a second node, one CPU each; ``node_local``: a folder the second node sees as its own empty
    tmpfs. Yields the cluster's address, the folders and the second node's raylet pid; stops both."""
    why = namespaces_work()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("nodes")
    node_local, shared = root / "node_local", root / "shared"
    node_local.mkdir()
    shared.mkdir()
    temp = Path(tempfile.mkdtemp(prefix="pfn", dir="/tmp"))  # short: Ray's socket paths have a length limit
    port = free_port()
    try:
        ray_start(
            temp, "--head", f"--port={port}", "--include-dashboard=false", f"--ray-client-server-port={free_port()}"
        )
        # its own view of node_local: the mount lives as long as the node's processes (started from this shell)
        mount = 'mount -t tmpfs tmpfs "$1" && shift && exec "$@"'
        ray_start(temp, f"--address=127.0.0.1:{port}", prefix=[*UNSHARE, "sh", "-c", mount, "sh", str(node_local)])
        yield {
            "address": f"127.0.0.1:{port}",
            "node_local": node_local,
            "shared": shared,
            "second_raylet": second_raylet(temp),
        }
    finally:
        stop_ray_processes(temp)
        shutil.rmtree(temp, ignore_errors=True)


def second_raylet(temp: Path) -> int:
    """The pid of the raylet that runs in a mount namespace other than this process's."""
    ours = os.readlink("/proc/self/ns/mnt")
    for proc in psutil.process_iter(["cmdline", "pid"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if "raylet" in cmdline and str(temp) in cmdline:
            try:
                if os.readlink(f"/proc/{proc.info['pid']}/ns/mnt") != ours:
                    return proc.info["pid"]
            except OSError:
                continue
    raise AssertionError("no raylet of the second node")


def markers(folder: Path, raylet: int | None = None) -> list[str]:
    """The check's markers left in ``folder``, as this machine sees it or (``raylet``) as that raylet's node does."""
    seen = Path(f"/proc/{raylet}/root{folder}") if raylet else folder
    return sorted(p.name for p in seen.iterdir() if p.name.startswith(MARKER))


def test_a_storage_path_the_nodes_do_not_share_is_refused_before_training(split_nodes, tmp_path):
    """`attent train` against the cluster, its ``ray.storage_path`` the folder the second node sees as its
    own: refused in one line naming the node and the fix, before the MLflow run or any worker; no marker left
    on either node. Its store is SQLite (no tracking server to start): refused in the same line, both
    problems at once."""
    folder, db = split_nodes["node_local"], tmp_path / "mlflow.db"
    proc, elapsed = attent(
        ["train", DIGITS, "ray.num_workers=2", f"mlflow.tracking_uri=sqlite:///{db}", f"ray.storage_path={folder}"],
        tmp_path,
        {"RAY_ADDRESS": split_nodes["address"]},
        drop=(),
    )
    err = proc.stderr
    assert proc.returncode == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("attent train: error:")]
    assert len(errors) == 1, err[-3000:]
    storage = errors[0][errors[0].index(f"ray.storage_path={folder} is not shared") :]
    assert storage.startswith(f"ray.storage_path={folder} is not shared between the Ray cluster's 2 nodes (node ")
    assert f"cannot see the file the driver wrote in {folder}" in storage
    assert "would fail at its first checkpoint" in storage and "NFS" in storage and "s3://" in storage
    assert f"mlflow.tracking_uri sqlite:///{db} is a SQLite file on this machine" in errors[0]
    assert "Traceback" not in err and "RayTrainWorker" not in err
    assert not db.exists()  # refused before the MLflow run (and its store)
    assert markers(folder) == [] and markers(folder, split_nodes["second_raylet"]) == []
    print(f"refused in {elapsed:.1f}s: {errors[0]}")


@pytest.mark.parametrize("command", ["train", "sweep", "bench"])
def test_a_sqlite_store_on_two_nodes_is_refused_for_every_command(split_nodes, tmp_path, command):
    """A SQLite store with a storage path both nodes share: `attent train` (one worker), `attent sweep`
    (one trial at a time, as every shipped GPU sweep) and `attent bench` are refused in one line naming
    `attent server`, before any worker, run (a benchmark's parent run included) or store file exists."""
    db = tmp_path / "mlflow.db"
    configs = {
        "train": DIGITS,
        "sweep": str(REPO / "experiments/sweeps/ablation_digits.yaml"),
        "bench": str(REPO / "benchmarks/specs/time_to_accuracy_demo.yaml"),
    }
    config = configs[command]
    proc, elapsed = attent(
        [command, config, f"mlflow.tracking_uri=sqlite:///{db}", f"ray.storage_path={split_nodes['shared']}"],
        tmp_path,
        {"RAY_ADDRESS": split_nodes["address"]},
        drop=(),
    )
    err = proc.stderr
    assert proc.returncode == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith(f"attent {command}: error:")]
    assert errors == [
        f"attent {command}: error: mlflow.tracking_uri sqlite:///{db} is a SQLite file on this machine, but the Ray "
        "cluster has 2 nodes, and the workers on every one of them log to the store; nothing was run or recorded. "
        f"Fix: run `attent server --host <this node's private IP> --backend-store-uri sqlite:///{db}` here (a "
        "PostgreSQL --backend-store-uri for a lasting store) and set mlflow.tracking_uri (or $MLFLOW_TRACKING_URI) "
        "to the URL it prints"
    ], err[-3000:]
    assert "Traceback" not in err and "RayTrainWorker" not in err
    assert not db.exists()  # no run, no store
    print(f"refused in {elapsed:.1f}s")


CHECK_SHARED = """
import sys, ray
from attent.engine.preflight.nodes import check_shared_across_nodes
from attent.experiment.files import load_experiment
ray.init(address=sys.argv[1], logging_level="WARNING")
cfg = load_experiment(sys.argv[2], ["mlflow.tracking_uri=http://127.0.0.1:9", f"ray.storage_path={sys.argv[3]}"])
check_shared_across_nodes(cfg.resolved())
print("SHARED", flush=True)
"""


def test_a_storage_path_both_nodes_share_passes_and_is_left_clean(split_nodes):
    """The same check on a folder both nodes see: it passes, and removes its markers."""
    shared = split_nodes["shared"]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHECK_SHARED), split_nodes["address"], DIGITS, str(shared)],
        capture_output=True,
        text=True,
        timeout=RETURNS_WITHIN_S,
    )
    assert proc.returncode == 0 and "SHARED" in proc.stdout, proc.stderr[-3000:]
    assert markers(shared) == [] and markers(shared, split_nodes["second_raylet"]) == []
