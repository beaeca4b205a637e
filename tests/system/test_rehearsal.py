"""Every paper-scale file (experiments/*_gpu.yaml, experiments/sweeps/*_gpu.yaml) rehearsed through the cluster's own
path: `ray job submit` of `attent rehearse` to a Ray cluster of two nodes started as cluster.yaml starts its nodes
(token auth, the tracking server's URL and certificate in their environment, a user's MLflow credentials in their
home), logging through the authenticated HTTPS `attent server`, with a folder standing for the shared storage that
holds the files' data and models at a few samples each in their own formats (tests/helpers/standin_storage.py) and
the job given the environment the cluster guide gives it (cluster_layout.OFFLINE_ENV). Each experiment's stand-in
trains on two workers, one of them fails and the run resumes from its checkpoint, its downstream jobs and evaluations
run; each sweep's covering trials train their settings (their base file, rehearsed beside them, has the workers,
the failure and the downstream jobs) and its report is built; every run is in MLflow, FINISHED. Then, with a READ
user's credentials in the nodes' homes, the next job is refused in one line naming the grant, before Ray Train starts;
and no password, and not Ray's token, is in any file of the cluster, the runs, the store or the artifacts, and the
users database is 0600. (The server's own attacks, and concurrent trials through it: tests/system/test_server_auth.py.)"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from attent.experiment import cluster_layout

from tests.helpers import standin_storage
from tests.helpers.auth_server import as_user, auth_server, files_holding, self_signed
from tests.helpers.paths import BIN, REPO
from tests.helpers.processes import free_port, stop_ray_processes

# A third of the system tier's time: after the session-Ray group on its worker (after_the_ray_group), while the other
# worker runs the lighter tests. Started beside the Ray group instead, the two took 2,000 s and more together.
pytestmark = [pytest.mark.timeout(3600), pytest.mark.after_the_ray_group]
PAPER_SCALE = sorted(REPO.glob("experiments/*_gpu.yaml")) + sorted(REPO.glob("experiments/sweeps/*_gpu.yaml"))
EXPERIMENTS = {path.name for path in PAPER_SCALE if path.parent.name != "sweeps"}  # each sweep's base is one
CLEAN = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
         "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_SERVER_CERT_PATH", "HF_HOME", "ATTENT_DATA_DIR")  # fmt: skip


def rehearsal_experiments(storage: Path) -> dict[str, str]:
    """File -> the MLflow experiment its rehearsal logs to (what the user must be granted)."""
    from attent.experiment.cluster_layout import SHARED
    from attent.rehearsal.run import derive

    found = {}
    for path in PAPER_SCALE:
        rehearsal = derive(str(path), [], use_gpu=False, shared=((SHARED,), str(storage)))
        found[path.name] = rehearsal.experiments()[0].mlflow.experiment
    return found


def start_node(env: dict[str, str], temp: Path, *args: str) -> None:
    subprocess.run(
        [str(BIN / "ray"), "start", "--node-ip-address=127.0.0.1", "--num-cpus=2", "--disable-usage-stats",
         f"--temp-dir={temp}", f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
         f"--runtime-env-agent-port={free_port()}", *args],
        check=True, capture_output=True, timeout=180, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The HTTPS server with users (alice EDIT on every rehearsal's experiment, bob READ on the first) and two
    `ray start` nodes whose homes hold alice's credentials; yields what the tests need, stops them."""
    from attent.engine.driver import PREEMPTION_WATCHER_ENV, TRAIN_POLL_ENV, TRAIN_POLL_SECONDS

    work = tmp_path_factory.mktemp("rehearsal")
    storage = standin_storage.build(work / "storage")
    cert, key = self_signed(work)
    trust = {"MLFLOW_TRACKING_SERVER_CERT_PATH": str(cert)}
    server_dir = work / "server"
    experiments = rehearsal_experiments(storage)
    with auth_server(server_dir, "--tls-cert", str(cert), "--tls-key", str(key)) as (url, _):
        admin = (server_dir / "mlflow-auth" / "admin_password").read_text().strip()
        credentials = server_dir / "mlflow-credentials-alice"
        passwords = {"admin": admin} | add_alice_and_bob(url, admin, server_dir, experiments, trust)
        token = work / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        base = {k: v for k, v in os.environ.items() if k not in CLEAN}
        ray = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        }
        temps = [Path(f"/tmp/ray-rh-{os.getpid()}-{i}") for i in (0, 1)]
        nodes = []
        for temp in temps:
            home = temp.with_name(temp.name + "-home")
            (home / ".mlflow").mkdir(parents=True, exist_ok=True)
            shutil.copy(credentials, home / ".mlflow" / "credentials")
            (home / ".mlflow" / "credentials").chmod(0o600)
            nodes.append({**base, **ray, **trust, "HOME": str(home), "MLFLOW_TRACKING_URI": url,
                          TRAIN_POLL_ENV: TRAIN_POLL_SECONDS, PREEMPTION_WATCHER_ENV: "0"})  # as cluster.yaml's  # fmt: skip
        gcs, dashboard = free_port(), free_port()
        try:
            start_node(nodes[0], temps[0], "--head", f"--port={gcs}", "--dashboard-host=127.0.0.1",
                       f"--dashboard-port={dashboard}", f"--ray-client-server-port={free_port()}")  # fmt: skip
            start_node(nodes[1], temps[1], f"--address=127.0.0.1:{gcs}")
            client = {**base, **ray, "HOME": str(work / "client-home")}  # Ray's token, no MLflow password
            yield {"url": url, "work": work, "storage": storage, "admin": admin, "cert": cert, "server": server_dir,
                   "address": f"http://127.0.0.1:{dashboard}", "client": client, "experiments": experiments,
                   "passwords": passwords, "token": token.read_text(), "temps": temps,
                   "homes": [temp.with_name(temp.name + "-home") for temp in temps]}  # fmt: skip
        finally:
            for temp in reversed(temps):
                stop_ray_processes(temp)
    for temp in temps:
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(temp.with_name(temp.name + "-home"), ignore_errors=True)


def add_alice_and_bob(url: str, admin: str, server_dir: Path, experiments: dict[str, str], trust) -> dict[str, str]:
    """alice EDIT on every rehearsal's experiment, bob READ on the first; their credentials files in
    ``server_dir``; returns their passwords."""
    from attent.server import users as accounts

    with as_user("admin", admin, url, **trust):
        for name in ("alice", "bob"):
            accounts.add_user(url, name, admin=False, out=str(server_dir / f"mlflow-credentials-{name}"))
        for experiment in sorted(set(experiments.values())):
            accounts.grant(url, "alice", experiment, "EDIT")
        accounts.grant(url, "bob", experiments[PAPER_SCALE[0].name], "READ")
    return {
        name: (server_dir / f"mlflow-credentials-{name}").read_text().split("mlflow_tracking_password = ")[1].strip()
        for name in ("alice", "bob")
    }


def submit(cluster, job_dir: Path, *entrypoint: str) -> subprocess.CompletedProcess:
    """`ray job submit --working-dir` with the job's environment, as the cluster guide writes it."""
    runtime_env = json.dumps({"env_vars": standin_storage.job_env(cluster["storage"])})
    command = [str(BIN / "ray"), "job", "submit", "--address", cluster["address"], "--working-dir", str(job_dir),
               "--runtime-env-json", runtime_env, "--", *entrypoint]  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        done = subprocess.run(command, capture_output=True, text=True, timeout=3500, cwd=job_dir, env=cluster["client"])
        if "No available agent to submit job" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(5)


def test_every_paper_scale_file_is_rehearsed_through_ray_job_submit_on_two_nodes_and_no_secret_is_left(cluster):
    job_dir = cluster["work"] / "job"
    shutil.copytree(REPO / "experiments", job_dir / "experiments")
    files = [str(path.relative_to(REPO)) for path in PAPER_SCALE]
    reports = cluster["work"] / "reports"
    start = time.monotonic()
    done = submit(cluster, job_dir, "attent", "rehearse", "--shared-folder", str(cluster["storage"]),
                  "--out", str(reports), *files)  # fmt: skip
    output = done.stdout + done.stderr
    (cluster["work"] / "captured.txt").write_text(output)  # what the job printed: scanned for secrets below
    print(f"REHEARSED {len(files)} files in {time.monotonic() - start:.0f}s", flush=True)
    print("\n".join(line for line in output.splitlines() if line.startswith("[attent] rehearsed")), flush=True)
    assert done.returncode == 0 and "succeeded" in done.stdout.lower(), output[-6000:]
    for name in files:
        assert f"rehearsed {name} as " in output, name
    # each experiment's worker failure, resumed from its checkpoint (the sweeps leave it to their base files)
    assert output.count("from its epoch-2 checkpoint") >= len(EXPERIMENTS)

    with as_user(
        "admin", cluster["admin"], cluster["url"], MLFLOW_TRACKING_SERVER_CERT_PATH=str(cluster["cert"])
    ) as admin:
        for file, experiment in cluster["experiments"].items():
            runs = admin.search_runs([admin.get_experiment_by_name(experiment).experiment_id])
            assert runs and {r.info.status for r in runs} == {"FINISHED"}, (file, experiment)
            workers = {r.data.params["ray.num_workers"] for r in runs if "ray.num_workers" in r.data.params}
            # two workers, or Ray Train's local mode: a sweep's setting trials, an experiment's later downstream jobs
            assert workers <= {"0", "2"} and (file not in EXPERIMENTS or "2" in workers), (file, workers)
        (pretraining,) = [
            r for r in admin.search_runs([admin.get_experiment_by_name(cluster["experiments"]["multimae_gpu.yaml"]).experiment_id])
            if r.info.run_name == "multimae-vitb16-attent-rehearsal"
        ]  # fmt: skip
        assert {"downstream.classification", "downstream.semseg", "downstream.depth"} <= {
            key.rsplit(".", 1)[0] for key in pretraining.data.metrics
        }
    sweeps = [path for path in PAPER_SCALE if path.parent.name == "sweeps"]
    assert all(any((reports / f"{exp}").glob("*.md")) for exp in
               (cluster["experiments"][path.name] for path in sweeps)), sorted(p.name for p in reports.iterdir())  # fmt: skip
    refuse_a_read_user_then_find_no_secret(cluster)  # in what the rehearsal left: its runs, checkpoints and logs


def refuse_a_read_user_then_find_no_secret(cluster) -> None:
    """A READ user's job refused in one line before Ray Train starts; then no password and no Ray token in any
    file of the cluster, the runs, the store or the artifacts, and the users database 0600."""
    experiment = cluster["experiments"][PAPER_SCALE[0].name]
    folder = cluster["work"] / "read-only"
    folder.mkdir()
    results = cluster["work"] / "ray_results"
    (folder / "exp.yaml").write_text(
        "name: read-only\nseed: 0\n"
        "task: {name: vision, dataset: digits, img_size: 8, train_limit: 64, test_limit: 32,"
        " model: {preset: vit_tiny_cpu, patch_size: 2}}\n"
        f"train: {{epochs: 1, batch_size: 32}}\nray: {{num_workers: 2, storage_path: {results}}}\n"
        f"mlflow: {{experiment: {experiment}}}\n"  # the store: the cluster's MLFLOW_TRACKING_URI, as on cluster.yaml
    )
    for home in cluster["homes"]:  # bob's credentials where alice's were: he may read the experiment, not log into it
        shutil.copy(cluster["server"] / "mlflow-credentials-bob", home / ".mlflow" / "credentials")
    done = submit(cluster, folder, "attent", "train", "exp.yaml")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    errors = {line for line in output.splitlines() if "attent train: error:" in line}  # Ray shows the log twice
    assert len(errors) == 1, output[-4000:]
    (error,) = errors
    assert f"gives user 'bob' READ on experiment '{experiment}', and a run there needs EDIT" in error
    assert f"attent server grant bob {experiment} EDIT" in error and "Traceback" not in output
    assert not (results / "read-only").exists()  # refused before Ray Train started

    # every file of the Ray cluster (its logs, the jobs' drivers' and workers'), the runs' folders and
    # checkpoints, the tracking store, the users database and the artifacts; and what the jobs printed
    captured = cluster["work"] / "captured.txt"
    captured.write_text(captured.read_text() + output)
    runs = standin_storage.on_storage(cluster["storage"], cluster_layout.STORAGE_PATH)
    roots = [*cluster["temps"], runs, cluster["server"], captured]
    passwords, server = cluster["passwords"], cluster["server"]
    for name in ("alice", "bob"):
        assert files_holding(passwords[name], roots) == [str(server / f"mlflow-credentials-{name}")], name
    assert files_holding(passwords["admin"], roots) == [str(server / "mlflow-auth" / "admin_password")]
    assert files_holding(cluster["token"], roots + cluster["homes"]) == []
    assert oct((server / "mlflow-auth" / "users.db").stat().st_mode & 0o777) == "0o600"
