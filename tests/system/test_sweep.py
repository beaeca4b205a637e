"""A Ray Tune sweep through the Train engine, run by the command its RayJob runs, killed mid-sweep and run
again as the RayJob's retry would: it resumes only its unfinished trials (the sweeps themselves:
tests/sweep/test_sweep.py)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time

import mlflow

from tests.helpers.paths import BIN
from tests.sweep.test_sweep import write_sweep


def children(mlflow_uri, sweep):
    client = mlflow.MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("sweep-test")
    if exp is None:
        return client, None, []
    parents = client.search_runs(
        [exp.experiment_id], f"tags.`attent.role` = 'sweep' and tags.`attent.sweep` = '{sweep}'"
    )
    kids = client.search_runs([exp.experiment_id], f"tags.`attent.role` = 'trial' and tags.`attent.sweep` = '{sweep}'")
    return client, (parents[0] if parents else None), kids


def job_command(path, mlflow_uri) -> list[str]:
    """The command `attent kuberay` writes into the sweep's RayJob, first try and retries alike, with the
    image's paths mapped to this machine's (``tmp_path`` stands for the checkout the image holds)."""
    from attent.cli import kuberay

    checkout = path.parent
    (checkout / kuberay.DOCKERFILE).parent.mkdir(parents=True, exist_ok=True)
    (checkout / kuberay.DOCKERFILE).touch()
    words = shlex.split(kuberay.manifest(str(path), [], image="attent:test")["spec"]["entrypoint"])
    local = {
        f"{kuberay.IMAGE_ROOT}/{path.name}": str(path),
        f"ray.storage_path={kuberay.STORAGE_PATH}": f"ray.storage_path={checkout / 'ray_results'}",
        f"mlflow.tracking_uri={kuberay.tracking_uri()}": f"mlflow.tracking_uri={mlflow_uri}",
    }
    assert words[0] == "attent" and set(local) <= set(words), words
    return [str(BIN / "attent"), *(local.get(word, word) for word in words[1:])]


def test_a_sweeps_job_killed_mid_sweep_and_tried_again_resumes_only_unfinished_trials(
    ray_cluster, tmp_path, mlflow_uri
):
    path = write_sweep(tmp_path, mlflow_uri, "interrupted", [0], 1, epochs=3)
    env = dict(os.environ, RAY_ADDRESS=ray_cluster["address"])
    command = job_command(path, mlflow_uri)
    driver = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 600
    while time.time() < deadline:  # kill the driver once one trial finished and another is running
        _, _, kids = children(mlflow_uri, "interrupted")
        if sum(k.info.status == "FINISHED" for k in kids) >= 1 and any(k.info.status == "RUNNING" for k in kids):
            break
        assert driver.poll() is None, "the sweep ended before it could be interrupted"
        time.sleep(2)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    _, _, before = children(mlflow_uri, "interrupted")
    finished_before = {k.info.run_id: k.info.end_time for k in before if k.info.status == "FINISHED"}
    assert len(finished_before) == 1

    retry = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)  # the job's retry
    assert retry.returncode == 0, retry.stderr[-2000:]
    client, parent, kids = children(mlflow_uri, "interrupted")
    assert parent.info.status == "FINISHED"
    assert len(kids) == 2, "no MLflow run duplicated"
    assert len({k.data.tags["attent.trial"] for k in kids}) == 2
    assert {k.info.status for k in kids} == {"FINISHED"}
    for run_id, end_time in finished_before.items():  # finished trials did not run again
        assert client.get_run(run_id).info.end_time == end_time
