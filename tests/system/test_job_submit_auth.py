"""`ray job submit` to a Ray cluster with token auth whose jobs log through `attent server` with users over
HTTPS, set up as cluster.yaml and deploy/kubernetes/ set theirs: the cluster's processes find the user's
MLflow credentials file in their home (the head's ~/.mlflow/credentials; a Secret's mount on Kubernetes),
the server's URL and certificate in their environment, and nothing else; the submitting shell has Ray's
token and no MLflow password. An EDIT user's two-worker run and two-trial sweep log through the server and
finish; with a READ user's credentials in their place, the next job is refused in one line naming the
grant, before Ray Train starts. Then no password, and not Ray's token, is in any file of the cluster, the
runs, the store or the artifacts, and the users database is 0600. (The server's own attacks:
tests/system/test_server_auth.py.)"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import shared_runs
from tests.helpers.auth_server import as_user, auth_server, files_holding, self_signed
from tests.helpers.paths import BIN
from tests.helpers.processes import free_port, stop_ray_processes

# one after another with the rehearsal of every paper-scale file (test_rehearsal.py): two job-submitted clusters at
# once on two cores took this test past its timeout
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("job-submit")]
CLEAN = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
         "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_SERVER_CERT_PATH")  # fmt: skip


def credentials_of(server_dir: Path, name: str) -> str:
    return (server_dir / f"mlflow-credentials-{name}").read_text()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The server (alice EDIT on `jobs` and `jobs-sweep`, bob READ on `jobs`) and a `ray start` head whose
    home holds alice's credentials file; yields what the tests need, stops both."""
    work = tmp_path_factory.mktemp("job-auth")
    cert, key = self_signed(work)
    trust = {"MLFLOW_TRACKING_SERVER_CERT_PATH": str(cert)}
    server_dir = work / "server"
    with auth_server(server_dir, "--tls-cert", str(cert), "--tls-key", str(key)) as (url, _):
        from attent.server import users as accounts

        admin = (server_dir / "mlflow-auth" / "admin_password").read_text().strip()
        with as_user("admin", admin, url, **trust):  # `attent server users add` and `grant`, in this process
            for name in ("alice", "bob"):
                accounts.add_user(url, name, admin=False, out=str(server_dir / f"mlflow-credentials-{name}"))
            for name, experiment, permission in (("alice", "jobs", "EDIT"), ("alice", "jobs-sweep", "EDIT"),
                                                 ("bob", "jobs", "READ")):  # fmt: skip
                accounts.grant(url, name, experiment, permission)
        users = {"admin": admin}
        for name in ("alice", "bob"):
            users[name] = credentials_of(server_dir, name).split("mlflow_tracking_password = ")[1].strip()
        home = work / "head-home"
        (home / ".mlflow").mkdir(parents=True)
        (home / ".mlflow" / "credentials").write_text(credentials_of(server_dir, "alice"))
        (home / ".mlflow" / "credentials").chmod(0o600)
        token = work / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        temp, dashboard = Path(f"/tmp/ray-ja-{os.getpid()}"), free_port()
        base = {k: v for k, v in os.environ.items() if k not in CLEAN}
        ray = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        }
        from attent.engine.driver import PREEMPTION_WATCHER_ENV, TRAIN_POLL_ENV, TRAIN_POLL_SECONDS

        head = {**base, **ray, **trust, "HOME": str(home), "MLFLOW_TRACKING_URI": url,
                TRAIN_POLL_ENV: TRAIN_POLL_SECONDS, PREEMPTION_WATCHER_ENV: "0"}  # as cluster.yaml's `ray start`  # fmt: skip
        subprocess.run(
            [str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={free_port()}",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", "--num-cpus=2",
             f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats", f"--temp-dir={temp}"],
            check=True, capture_output=True, timeout=180, env=head,
        )  # fmt: skip
        try:
            client = {**base, **ray, "HOME": str(work / "client-home")}  # Ray's token, no MLflow password
            yield {"url": url, "work": work, "server": server_dir, "users": users, "token": token.read_text(),
                   "home": home, "temp": temp, "address": f"http://127.0.0.1:{dashboard}", "client": client}  # fmt: skip
        finally:
            stop_ray_processes(temp)
    shutil.rmtree(temp, ignore_errors=True)


def submit(cluster, job_dir: Path, *entrypoint: str) -> subprocess.CompletedProcess:
    """`ray job submit --working-dir` of ``entrypoint`` from the user's shell (a head under load may
    not have its job agent up yet; Ray says to retry)."""
    command = [str(BIN / "ray"), "job", "submit", "--address", cluster["address"], "--working-dir", str(job_dir),
               "--", *entrypoint]  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        done = subprocess.run(command, capture_output=True, text=True, timeout=540, cwd=job_dir, env=cluster["client"])
        if "No available agent to submit job" not in done.stderr or time.monotonic() > deadline:
            print("SUBMIT", entrypoint, round(time.monotonic() - deadline + 120, 1), flush=True)
            return done
        time.sleep(5)


def job_dir(cluster, name: str, *, experiment: str = "jobs", workers: int = 2) -> Path:
    folder = cluster["work"] / name
    folder.mkdir()
    (folder / "exp.yaml").write_text(
        f"name: {name}\nseed: 0\n"
        "task: {name: vision, dataset: digits, img_size: 8, train_limit: 400, test_limit: 100,"
        " model: {preset: vit_tiny_cpu, patch_size: 2}}\n"
        "train: {epochs: 1, batch_size: 128}\nselection: {preset: vit}\n"
        f"ray: {{num_workers: {workers}, storage_path: {cluster['work'] / 'ray_results'}}}\n"
        f"mlflow: {{experiment: {experiment}}}\n"  # the store: the cluster's MLFLOW_TRACKING_URI, as on cluster.yaml
    )
    return folder


def test_an_edit_users_jobs_log_through_the_server_and_a_read_users_job_is_refused_in_one_line(cluster):
    url, users, outputs = cluster["url"], cluster["users"], []
    done = submit(cluster, job_dir(cluster, "submitted"), "attent", "train", "exp.yaml")
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0 and "succeeded" in done.stdout.lower(), outputs[-1][-4000:]
    assert "plain HTTP" not in outputs[-1]  # TLS: no password in clear, no warning

    sweep_dir = cluster["work"] / "sweep"
    sweep_dir.mkdir()
    spec = shared_runs.write_sweep(
        sweep_dir, url, "jobs-sweep",
        {"grid": {"selection.temperature": [0.5, 2.0]}, "max_concurrent": 2, "overrides": {"train.epochs": 1}},
    )  # fmt: skip
    done = submit(cluster, sweep_dir, "attent", "sweep", spec.name)
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, outputs[-1][-4000:]

    with as_user(
        "admin", users["admin"], url, MLFLOW_TRACKING_SERVER_CERT_PATH=str(cluster["work"] / "cert.pem")
    ) as admin:
        (run,) = admin.search_runs([admin.get_experiment_by_name("jobs").experiment_id])
        assert run.info.status == "FINISHED" and run.data.params["ray.num_workers"] == "2"
        assert "eval_test_accuracy" in run.data.metrics  # logged by a Ray Train worker, through the server
        trials = admin.search_runs([admin.get_experiment_by_name("jobs-sweep").experiment_id])
        assert sorted(r.info.status for r in trials) == ["FINISHED"] * 3  # the parent and its two trials

    # bob's credentials where alice's were: he may read `jobs`, not log into it
    (cluster["home"] / ".mlflow" / "credentials").write_text(credentials_of(cluster["server"], "bob"))
    done = submit(cluster, job_dir(cluster, "read-only"), "attent", "train", "exp.yaml")
    outputs.append(done.stdout + done.stderr)
    assert done.returncode != 0, outputs[-1][-4000:]
    errors = {line for line in outputs[-1].splitlines() if "attent train: error:" in line}  # Ray shows the log twice
    assert len(errors) == 1, outputs[-1][-4000:]
    (error,) = errors
    assert "gives user 'bob' READ on experiment 'jobs', and a run there needs EDIT" in error
    assert "attent server grant bob jobs EDIT" in error and "Traceback" not in outputs[-1]
    assert not (cluster["work"] / "ray_results" / "read-only").exists()  # refused before Ray Train started

    # every file of the Ray cluster (its logs, the jobs' drivers' and workers'), the runs' folders, the
    # tracking store, the users database and the artifacts; and what the jobs printed
    t0 = time.monotonic()
    captured = cluster["work"] / "captured.txt"
    captured.write_text("\n".join(outputs))
    roots = [cluster["temp"], cluster["work"] / "ray_results", sweep_dir, cluster["server"], captured]
    own = {name: str(cluster["server"] / f"mlflow-credentials-{name}") for name in ("alice", "bob")}
    assert files_holding(users["alice"], roots) == [own["alice"]]
    assert files_holding(users["bob"], roots) == [own["bob"]]
    assert files_holding(users["admin"], roots) == [str(cluster["server"] / "mlflow-auth" / "admin_password")]
    assert files_holding(cluster["token"], roots + [cluster["home"]]) == []
    print("SCAN", round(time.monotonic() - t0, 1), sum(1 for _ in cluster["temp"].rglob("*")), flush=True)
    assert oct((cluster["server"] / "mlflow-auth" / "users.db").stat().st_mode & 0o777) == "0o600"
