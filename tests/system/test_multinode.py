"""Multi-node runs, proven on one machine: a real two-node Ray cluster (``ray.cluster_utils``),
the reference AtteNT soft run (``shared_runs``: digits, 2 workers, 4 epochs) with one worker per
node, checkpoints on storage both nodes share, MLflow reached over HTTP, and the second node's
worker killed mid-run: the run still logs the reference's numbers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import mlflow
import psutil
import pytest
from attent import contract

from tests.helpers import shared_runs
from tests.helpers.paths import BIN, REPO
from tests.helpers.processes import poll_train_workers_often, start_tracking_server

EXPERIMENT = "multinode"
REFERENCE = "digits-soft"


@pytest.fixture(scope="module")
def two_nodes():
    """Head + a second node, one CPU each: two one-CPU workers must sit on different nodes."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    poll_train_workers_often()
    # Ray's own node address (Ray maps 127.0.0.1 to it when a driver connects); no dashboard,
    # whose fixed port the session's cluster holds.
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"head_node": 1}, "include_dashboard": False}
    )
    second = cluster.add_node(num_cpus=1, resources={"second_node": 1})
    cluster.wait_for_nodes()
    raylets = {
        name: node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
        for name, node in (("head", cluster.head_node), ("second", second))
    }
    yield cluster.address, raylets
    cluster.shutdown()
    # The head's Ray client server (proxy mode) was seen to outlive shutdown() by the whole suite.
    left = [
        proc
        for proc in psutil.process_iter(["cmdline"])
        if f"--address={cluster.address}" in (proc.info["cmdline"] or ())
    ]
    for proc in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(left, timeout=30)


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracking")
    with start_tracking_server(f"sqlite:///{root / 'mlflow.db'}", root / "artifacts") as url:
        yield url


def train_workers(raylet_pid: int) -> list[psutil.Process]:
    """The Ray Train worker processes a node's raylet started."""
    found = []
    for child in psutil.Process(raylet_pid).children(recursive=True):
        try:
            if "RayTrainWorker" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def start_run(name: str, address: str, tracking_url: str, storage) -> subprocess.Popen:
    """`attent train` as a user would drive it against the cluster: the reference run's settings
    (experiments/digits_vit.yaml is its task and selection), 2 workers, one per node."""
    reference = shared_runs.REFERENCE_RUNS[REFERENCE]
    overrides = [
        f"name={name}",
        f"seed={reference['seed']}",
        f"task.split_seed={reference['task']['split_seed']}",
        f"train.epochs={reference['train']['epochs']}",
        f"train.batch_size={reference['train']['batch_size']}",
        f"task.model.patch_size={reference['task']['model']['patch_size']}",
        "train.lr=null",  # the reference's: the task's own rate, without warm-up (digits_vit.yaml sets both)
        "train.warmup_ratio=null",
        "ray.num_workers=2",
        "ray.cpus_per_worker=1",
        "ray.placement_strategy=STRICT_SPREAD",
        "ray.max_failures=1",
        "ray.checkpoint_every=1",  # a checkpoint per epoch: the restart resumes from one
        f"ray.storage_path={storage}",
        f"mlflow.tracking_uri={tracking_url}",
        f"mlflow.experiment={EXPERIMENT}",
    ]
    env = {**os.environ, "RAY_ADDRESS": address, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [str(BIN / "attent"), "train", "experiments/digits_vit.yaml", *overrides],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return out


def the_run(client: mlflow.MlflowClient, name: str):
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = (
        client.search_runs([experiment.experiment_id], f"tags.`{contract.TAG_RUN_NAME}` = '{name}'")
        if experiment
        else []
    )
    return runs


def kill_second_node_worker_after(client, name: str, epochs_logged: int, raylets: dict, proc) -> int:
    """Once the run has logged ``epochs_logged`` epochs: check there is one Train worker on each
    node, SIGKILL the second node's, and return its pid."""
    deadline = time.time() + 300
    while time.time() < deadline:
        assert proc.poll() is None, "the run ended before the worker could be killed"
        runs = the_run(client, name)
        if runs and len(client.get_metric_history(runs[0].info.run_id, contract.TRAIN_LOSS)) >= epochs_logged:
            head, second = train_workers(raylets["head"]), train_workers(raylets["second"])
            assert len(head) == 1 and len(second) == 1, (head, second)  # one worker per node
            second[0].send_signal(signal.SIGKILL)
            return second[0].pid
        time.sleep(0.2)
    raise AssertionError(f"{name} logged fewer than {epochs_logged} epochs in 300 s")


def test_two_node_run_survives_losing_a_worker(two_nodes, tracking_server, tmp_path):
    address, raylets = two_nodes
    storage = tmp_path / "shared_storage"  # both nodes see it: it stands for NFS / S3
    client = mlflow.MlflowClient(tracking_server)

    proc = start_run("interrupted", address, tracking_server, storage)
    killed = kill_second_node_worker_after(client, "interrupted", 2, raylets, proc)
    out = finish(proc)
    assert not psutil.pid_exists(killed) or psutil.Process(killed).status() == psutil.STATUS_ZOMBIE

    runs = the_run(client, "interrupted")
    assert len(runs) == 1, "the restart must continue the same MLflow run"
    resumed = runs[0]
    assert resumed.info.status == "FINISHED", out[-3000:]
    restored = client.get_metric_history(resumed.info.run_id, contract.RESTORED_AT_EPOCH)
    assert restored and 1 <= restored[-1].value < 4  # restarted from a checkpoint, not from scratch
    # every per-epoch number and every subset as in the reference run (one node, no failure)
    shared_runs.assert_reproduces(REFERENCE, *shared_runs.histories(tracking_server, resumed.info.run_id, tmp_path))
    epochs = sorted({int(m.step) for m in client.get_metric_history(resumed.info.run_id, contract.TRAIN_LOSS)})
    assert epochs == list(range(4))
    # the artifacts went through the server to its artifact store
    names = {a.path for a in client.list_artifacts(resumed.info.run_id)}
    assert {"config.yaml", "epoch_history.json", "selection_history.json"} <= names


@pytest.fixture
def two_fresh_nodes():
    """A cluster of its own for the elastic run, whose second node the test kills for good."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    poll_train_workers_often()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    second = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster.address, second.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    cluster.shutdown()


ELASTIC = [
    "ray.num_workers=[1, 2]",  # elastic: it starts on two, goes on with one
    "train.batch_size=32",
    "train.global_batch_size=64",  # 2 x 32, or 1 x 32 x 2 accumulated
    "selection.preset=null",
    "selection.strategy=random",  # picks that read no loss: the same whatever the ranks trained
    "selection.ratio={kind: incremental, start: 0.3, end: 0.9}",
    "ray.max_failures=2",
]


def registered_checkpoints(snapshot: Path) -> int:
    """The checkpoints Ray Train's controller has registered (its snapshot in the run's storage), 0 before any."""
    try:
        return len(json.loads(snapshot.read_text())["checkpoint_results"])
    except (OSError, ValueError, KeyError):  # not written yet, or being written
        return 0


def kill_the_second_node_after_two_epochs(proc: subprocess.Popen, client, second_raylet: int, snapshot: Path) -> None:
    """Once the elastic run has logged two epochs and Ray Train registered their checkpoints (the metrics reach
    MLflow before the controller registers the epoch's checkpoint: a kill between the two restores from the one
    before), the second node dies for good: its raylet and its Train worker (a worker whose raylet dies trains on,
    orphaned)."""
    deadline = time.time() + 300
    while time.time() < deadline:  # the second node dies for good once two epochs are logged and checkpointed
        assert proc.poll() is None, "the run ended before the node could be killed"
        runs = the_run(client, "elastic")
        logged = runs and len(client.get_metric_history(runs[0].info.run_id, contract.TRAIN_LOSS)) >= 2
        if logged and registered_checkpoints(snapshot) >= 2:
            workers = train_workers(second_raylet)
            assert len(workers) == 1, workers
            os.kill(second_raylet, signal.SIGKILL)
            workers[0].kill()
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the elastic run logged fewer than 2 epochs in 300 s")


def test_an_elastic_run_loses_a_node_and_goes_on_with_one_worker(two_fresh_nodes, tracking_server, tmp_path):
    """``ray.num_workers: [1, 2]`` on two one-CPU nodes: the second node is killed after epoch 2; Ray Train restarts
    the group with the one worker left, from the latest checkpoint, in the same MLflow run, which finishes with the
    plan's subsets, the global batch of 64 (accumulation 1 on two ranks, 2 on one) and the learning rate of each
    epoch's progress."""
    from attent.engine.lr import lr_factor
    from attent.experiment.files import load_experiment
    from attent.selection.selector import Selector

    address, second_raylet = two_fresh_nodes
    client = mlflow.MlflowClient(tracking_server)
    overrides = [
        "name=elastic",
        "train.epochs=4",
        "ray.cpus_per_worker=1",
        "ray.checkpoint_every=1",
        f"ray.storage_path={tmp_path / 'shared_storage'}",
        f"mlflow.tracking_uri={tracking_server}",
        f"mlflow.experiment={EXPERIMENT}",
        *ELASTIC,
    ]
    env = {**os.environ, "RAY_ADDRESS": address, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [str(BIN / "attent"), "train", "experiments/digits_vit.yaml", *overrides],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    snapshot = tmp_path / "shared_storage" / "elastic" / "checkpoint_manager_snapshot.json"
    kill_the_second_node_after_two_epochs(proc, client, second_raylet, snapshot)
    out = finish(proc)
    (run,) = the_run(client, "elastic")
    assert run.info.status == "FINISHED", out[-3000:]
    history = {
        name: [(int(m.step), m.value) for m in client.get_metric_history(run.info.run_id, name)]
        for name in (contract.RANKS, contract.GRAD_ACCUMULATION, contract.RESTORED_AT_EPOCH)
    }
    assert history[contract.RESTORED_AT_EPOCH], (history, out.replace("\r", "\n")[-6000:])
    (restored_at, _), *_ = history[contract.RESTORED_AT_EPOCH]
    assert 2 <= restored_at < 4
    assert history[contract.RANKS] == [(0, 2.0), (restored_at, 1.0)]
    assert history[contract.GRAD_ACCUMULATION] == [(0, 1.0), (restored_at, 2.0)]  # 64 = 2 x 32 x 1 = 1 x 32 x 2
    # the plan's subsets, as a Selector alone draws them (Random reads no loss)
    cfg = load_experiment(REPO / "experiments/digits_vit.yaml", ["train.epochs=4", *ELASTIC])
    epochs, subsets = shared_runs.histories(tracking_server, run.info.run_id, tmp_path)
    samples = int(run.data.metrics[contract.NUM_TRAIN_SAMPLES])
    selector = Selector(range(samples), selection=cfg.selection, epochs=4, seed=cfg.seed)
    for epoch in range(4):
        selector.begin_epoch(epoch)
    assert subsets == [r.indices.tolist() for r in selector.history]
    # each epoch ends at the learning rate of its progress, on two ranks and on one
    lr = cfg.train.lr or 1e-3
    rates = [row[contract.LEARNING_RATE] for row in sorted(epochs, key=lambda r: r["epoch"])]
    warmup = cfg.train.warmup_ratio or 0.0
    assert rates == pytest.approx([lr * lr_factor((e + 1) / 4, "cosine", warmup) for e in range(4)], rel=1e-9)
