"""Faults a user's cluster or data can cause, each ending in one line that names the cause and the
fix, with nothing recorded lost: corrupt checkpoints, an unreachable Ray address, runs of dead drivers, any
other error, and two first writers of a new SQLite store. Unreadable data files: test_unreadable_data.py. No
readable checkpoint under Ray Train's restarts, a tracking server refusing our Host header, a driver killed
mid-run and two drivers of one run: tests/system/test_faults.py. A worker preempted (SIGTERM) mid-epoch:
test_preemption.py."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from attent.cli.main import main as attent_main

from tests.helpers import shared_runs
from tests.helpers.paths import REPO
from tests.helpers.ranks import start_method

digits = functools.partial(shared_runs.digits_run, experiment="faults")  # local mode unless ray= says


def runs_named(uri: str, name: str):
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("faults")
    return client, client.search_runs([experiment.experiment_id], f"tags.`mlflow.runName` = '{name}'")


# --- 1. checkpoints -----------------------------------------------------------------------------
def test_a_failed_run_resumes_into_its_mlflow_run_past_a_corrupt_newest_checkpoint(tmp_path, mlflow_uri, capfd):
    """Re-running a failed run (same name and storage path) continues it in the same MLflow run;
    its newest checkpoint, overwritten, is skipped for the older intact one, and the terminal says
    both in a line each under the CLI's quiet console. In Ray Train's local mode: the checkpoints
    are the engine's, under Ray Train's names (the next test's are Ray Train's own)."""
    from attent.engine.driver import train
    from attent.engine.progress import PLAIN, Console

    cfg = digits(tmp_path, mlflow_uri, "corrupt-newest", fault={"fail_once_after_epoch": 1}, ray={"max_failures": 0})
    with pytest.raises(Exception):  # noqa: B017 -- whatever the worker raises, the run must end FAILED
        train(cfg)  # dies after epoch 2's checkpoint: checkpoints of epochs 1 and 2
    _, runs = runs_named(mlflow_uri, cfg.name)
    assert len(runs) == 1 and runs[0].info.status == "FAILED"  # never left RUNNING
    checkpoints = sorted(p for p in (Path(cfg.ray.storage_path) / cfg.name).glob("checkpoint_*") if p.is_dir())
    assert len(checkpoints) == 2
    (checkpoints[-1] / "state.pt").write_bytes(os.urandom(4096))  # the newest: overwritten

    capfd.readouterr()
    resumed = train(cfg, console=Console(PLAIN))  # `attent train`'s, output to a file or pipe
    screen = [line for line in capfd.readouterr().err.splitlines() if line.startswith("[attent]")]
    (skipped,) = [line for line in screen if line.startswith("[attent] skipped checkpoint ")]
    assert skipped.startswith(f"[attent] skipped checkpoint {checkpoints[-1]}: ") and "SHA-256" in skipped
    assert screen.count(f"[attent] resumed {cfg.name} from its epoch-1 checkpoint") == 1
    client, runs = runs_named(mlflow_uri, cfg.name)
    assert resumed.resumed and [r.info.run_id for r in runs] == [resumed.run_id]  # the same MLflow run
    run = client.get_run(resumed.run_id)
    assert run.info.status == "FINISHED"
    restored = client.get_metric_history(resumed.run_id, "restored_at_epoch")
    assert [m.value for m in restored] == [1]  # from epoch 1's checkpoint, not 2's
    assert str(checkpoints[-1]) in run.data.tags["attent.skipped_checkpoints"]
    assert "SHA-256" in run.data.tags["attent.skipped_checkpoints"]
    assert sorted({int(m.step) for m in client.get_metric_history(resumed.run_id, "train_loss")}) == [0, 1, 2]


# --- 3. an unreachable Ray -------------------------------------------------------------------------
def test_an_unreachable_ray_address_is_one_line_within_seconds(tmp_path, capsys):
    start = time.monotonic()
    code = attent_main(
        [
            "validate",
            str(REPO / "experiments/digits_vit.yaml"),
            "ray.address=127.0.0.1:9",
            f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db",
        ]
    )
    assert code == 2 and time.monotonic() - start < 15
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "the Ray cluster at 127.0.0.1:9 is unreachable (connection refused)" in line
    assert "ray start --head --port 9" in line and "$RAY_ADDRESS" in line


def test_runs_of_dead_drivers_end_killed_and_live_or_unknown_ones_stay_running(tmp_path, mlflow_uri, capsys):
    """Runs left RUNNING: by a driver that exited, or whose pid another process now holds, end
    KILLED in one line; by a live driver, a driver on another machine or an untagged run stay
    RUNNING; a finished run stays finished."""
    from attent import contract
    from attent.engine import faults, tracking

    exited = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited_identity = {**faults.process_identity(), "pid": exited.pid, "started": faults.process_start_time(exited.pid)}
    exited.kill()
    exited.wait()
    me = faults.process_identity()
    drivers = {
        "exited": exited_identity,
        "pid-reused": {**me, "started": me["started"] - 3600},  # this pid, an hour before this process
        "live": me,
        "elsewhere": {**me, "host": "another-machine"},
        "untagged": None,
        "finished": exited_identity,
    }
    client = tracking.client_for(mlflow_uri)
    experiment_id = tracking.ensure_experiment(client, "faults", mlflow_uri)
    for name, identity in drivers.items():
        tags = {contract.TAG_DRIVER: json.dumps(identity)} if identity else {}
        run = client.create_run(experiment_id, run_name=name, tags=tags)
        if name == "finished":
            client.set_terminated(run.info.run_id, "FINISHED")

    assert tracking.close_runs_of_dead_drivers_in(mlflow_uri, "faults") == ["exited", "pid-reused"]
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[attent]")]  # not MLflow's
    host = socket.gethostname()
    assert line == (
        f"[attent] closed 2 runs left RUNNING by dead drivers: exited (pid {exited.pid} on {host}) → "
        f"KILLED, pid-reused (pid {os.getpid()} on {host}) → KILLED"
    )
    status = {r.info.run_name: r.info.status for r in client.search_runs([experiment_id])}
    assert status == {
        "exited": "KILLED",
        "pid-reused": "KILLED",
        "live": "RUNNING",
        "elsewhere": "RUNNING",
        "untagged": "RUNNING",
        "finished": "FINISHED",
    }
    (killed,) = client.search_runs([experiment_id], "tags.`mlflow.runName` = 'exited'")
    assert f"its driver (pid {exited.pid} on {host}) was gone" in killed.data.tags[contract.TAG_CLOSED_AS_KILLED]
    assert tracking.close_runs_of_dead_drivers_in(mlflow_uri, "faults") == []  # once


def test_a_new_run_is_tagged_with_its_driver(tmp_path, mlflow_uri):
    from attent import contract
    from attent.engine import faults, tracking

    cfg = digits(tmp_path, mlflow_uri, "tagged").resolved()
    run_id, resumed = tracking.start_or_resume_run(cfg)
    driver = json.loads(tracking.client_for(mlflow_uri).get_run(run_id).data.tags[contract.TAG_DRIVER])
    assert not resumed and driver == faults.process_identity() and faults.driver_alive(driver) is True


# --- 5. any other error: one line, the traceback in a log ----------------------------------------
def test_an_unexpected_error_is_one_line_with_its_traceback_in_a_log(tmp_path, monkeypatch, capsys):
    from attent.cli.main import COMMANDS

    def broken(args):
        try:
            {}["missing"]
        except KeyError as exc:
            raise RuntimeError("Traceback (most recent call last):\n  File x\nValueError: the worker's cause") from exc

    monkeypatch.setitem(COMMANDS, "report", broken)
    monkeypatch.setenv("ATTENT_LOG_DIR", str(tmp_path / "logs"))
    assert attent_main(["report", "--experiment", "x"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("attent report: error: KeyError: 'missing' (traceback: ")
    (log,) = (tmp_path / "logs").glob("attent-report-*.log")
    assert "RuntimeError" in log.read_text() and "KeyError" in log.read_text()
    assert attent_main(["--debug", "report", "--experiment", "x"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_ray_train_failure_is_reduced_to_the_workers_last_line():
    from attent.cli.errors import describe
    from ray.train.v2.api.exceptions import WorkerGroupError

    remote = RuntimeError(
        "Traceback (most recent call last):\n  File \"w.py\", line 3\n_pickle.UnpicklingError: invalid load key, 'x'."
    )
    line, usage = describe(WorkerGroupError("Training failed due to worker errors: ...", {0: remote}))
    assert line == "RuntimeError: _pickle.UnpicklingError: invalid load key, 'x'." and not usage


# --- 6. every kind of file the CLI runs validates --------------------------------------------------
def test_validate_recognises_the_theory_lab_file(capsys):
    assert attent_main(["validate", str(REPO / "experiments/theory_teaching.yaml")]) == 0
    assert "OK — theory lab, 5 seed(s), teaching rules ['greedy', 'random', 'full']" in capsys.readouterr().out


# --- 7. two first writers of a new SQLite store -----------------------------------------------------
def _first_writer(uri: str, name: str, start) -> None:
    from attent.engine.tracking import client_for, ensure_experiment

    start.wait()  # every process at once: each finds no tables and goes to create them
    client = client_for(uri)
    client.create_run(ensure_experiment(client, "race", uri), run_name=name)


def test_processes_creating_one_new_sqlite_store_at_once_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path}/new.db"
    context = multiprocessing.get_context(start_method())
    start = context.Barrier(6)
    procs = [context.Process(target=_first_writer, args=(uri, f"w{i}", start)) for i in range(6)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    assert [proc.exitcode for proc in procs] == [0] * 6  # a child's traceback is in the captured output
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
    assert sorted(r.info.run_name for r in runs) == [f"w{i}" for i in range(6)]
