"""Faults a run meets, and how it meets them:

- **deterministic failures** (an unreadable data file, no intact checkpoint): retrying only spends
  Ray Train's restart budget on the same error. The worker that meets one writes it to the run's
  storage folder (``FATAL_FILE``) before it fails; a restarted worker that finds the note stops at
  once, and the driver raises it as a ``RunFault``: one line, naming the file and the fix;
- **a driver that dies** (SIGKILL, a closed laptop): workers on its machine stop within a second
  (``watch_driver``), so no orphaned training goes on logging into its MLflow run; and a second
  driver of the same run refuses while one is alive (``run_lock``); the next command on this machine
  ends its runs left RUNNING as KILLED (``close_runs_of_dead_drivers``, by the ``driver_tags`` of each);
- **injected failures** (``fault:`` in a config) to exercise restarts; and, for the tests of
  preemption (``preemption``), a SIGTERM a worker sends itself at a given step (``SIGTERM_FILE``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import contract
from ..experiment.schema import ExperimentConfig
from ..tasks.config import DataError

if TYPE_CHECKING:  # MLflow is imported by the code that hands a client over, not at a worker's start
    from mlflow.tracking import MlflowClient

FATAL_FILE = ".attent-fatal.json"  # in <storage_path>/<name>/: a deterministic failure, for the driver
LOCK_FILE = ".attent-driver.lock"  # in <storage_path>/<name>/: held by the live driver of the run
DRIVER_POLL_S = 1.0  # how often a worker checks that its driver lives
# in <storage_path>/<name>/, written by a test: {"epoch": e, "step": s, "rank": r}, a SIGTERM (0-based epoch)
SIGTERM_FILE = ".attent-inject-sigterm.json"


class RunFault(RuntimeError):
    """A run stopped by a failure that retrying cannot mend; its message is one line: what, where,
    and the fix."""


class CheckpointError(RuntimeError):
    """No checkpoint of the run can be read."""


NOT_RETRYABLE = (DataError, CheckpointError)


def run_folder(cfg: ExperimentConfig) -> Path | None:
    """The run's folder under a local storage path (None for a URI such as s3://: no notes there)."""
    storage = cfg.ray.storage_path
    return None if "://" in storage else Path(storage) / cfg.name


# --- deterministic failures ----------------------------------------------------------------------
def record_fatal(cfg: ExperimentConfig, error: BaseException) -> None:
    folder = run_folder(cfg)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / FATAL_FILE).write_text(json.dumps({"error": str(error), "type": type(error).__name__}))


def recorded_fatal(cfg: ExperimentConfig) -> str | None:
    folder = run_folder(cfg)
    try:
        return json.loads((folder / FATAL_FILE).read_text())["error"] if folder else None
    except (OSError, ValueError, KeyError):
        return None


def clear_fatal(cfg: ExperimentConfig) -> None:
    folder = run_folder(cfg)
    if folder is not None:
        (folder / FATAL_FILE).unlink(missing_ok=True)


def take_fatal(cfg: ExperimentConfig) -> RunFault | None:
    """The recorded deterministic failure of the run, as a RunFault (the note is removed: the
    next attempt starts clean)."""
    message = recorded_fatal(cfg)
    clear_fatal(cfg)
    return RunFault(message) if message else None


# --- a dead driver ------------------------------------------------------------------------------
def process_identity() -> dict[str, object]:
    """This process as a later process can recognise it, alive or dead: host name and pid, its
    start time (a pid the system hands out again belongs to a process started later), and its
    process table (Linux: the boot and pid namespace, so two containers sharing a host name, as
    Docker's --network host gives them, never take each other's pids for their own)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": process_start_time(os.getpid()),
        "process_table": process_table(),
    }


def driver_identity() -> dict[str, object]:
    """Who the driver is, for its workers' watchdog, a second driver's refusal and the MLflow
    run's tag (``contract.TAG_DRIVER``)."""
    import ray.util

    return {**process_identity(), "node_ip": ray.util.get_node_ip_address()}


def process_start_time(pid: int) -> float | None:
    """When the process started (seconds since the epoch), None if there is no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_table() -> str:
    """The boot and pid namespace this process's pids belong to, '' where the system does not say."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def driver_alive(identity: dict[str, object]) -> bool | None:
    """Whether the process ``identity`` names still runs: None where this process cannot tell (it
    ran on another machine or in another container, or its pid is another user's we may not
    inspect), else whether its pid is held by the process that started when it did."""
    if identity.get("host") != socket.gethostname() or identity.get("process_table") != process_table():
        return None
    pid = int(identity["pid"])
    if not pid_alive(pid):
        return False
    started = process_start_time(pid)
    if started is None:
        return None
    return abs(started - float(identity.get("started") or 0)) < START_TIME_SLACK_S


START_TIME_SLACK_S = 1.0  # start times are read in clock ticks (10 ms); a reused pid starts well after its last holder


def describe_driver(identity: dict[str, object]) -> str:
    """``pid 1234 on host-a``."""
    return f"pid {identity.get('pid')} on {identity.get('host')}"


def watch_driver(driver: dict[str, object] | None) -> None:
    """On the driver's machine, a daemon thread ends this worker process once the driver process
    is gone: Ray tears a dead driver's actors down only after its own timeouts, and until then
    the workers would go on training and logging into the run. Workers on other nodes rely on Ray."""
    import ray.util

    if not driver or driver.get("node_ip") != ray.util.get_node_ip_address():
        return
    pid = int(driver["pid"])

    def watch() -> None:
        while pid_alive(pid):
            time.sleep(DRIVER_POLL_S)
        print(f"[attent] the driver (pid {pid}) is gone: this worker stops", flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="attent-driver-watchdog", daemon=True).start()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


@contextlib.contextmanager
def run_lock(cfg: ExperimentConfig) -> Iterator[None]:
    """Held by the driver while it trains the run: a second ``attent train`` of the same run (same
    storage path and name) refuses, naming the live one, instead of writing into the same MLflow
    run and checkpoints. The kernel drops the lock when its holder dies. (A storage URI gets no lock.)"""
    folder = run_folder(cfg)
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunFault(
                f"run {cfg.name} is being trained by another `attent train` ({holder}) into the same "
                f"checkpoints ({folder}) and MLflow run; nothing was started. Fix: wait for it to end, "
                "stop it, or give this run another name"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- runs whose driver died: the next command on this machine closes them KILLED ----------------
def driver_tags() -> dict[str, str]:
    """The tag naming this process as the driver of a run, so that any later command on this
    machine can tell whether the run's driver still lives."""
    return {contract.TAG_DRIVER: json.dumps(process_identity())}


def reopen_run(client: MlflowClient, run_id: str) -> None:
    """A run this process goes on with: tagged as its driver first, then RUNNING (the other order
    would show a RUNNING run with a dead driver to a command looking in between)."""
    for key, value in driver_tags().items():
        client.set_tag(run_id, key, value)
    client.update_run(run_id, status=contract.STATUS_RUNNING)


def close_runs_of_dead_drivers(client: MlflowClient, experiment_ids: list[str]) -> list[str]:
    """End KILLED the RUNNING runs of these experiments whose driver is gone (SIGKILL, a closed
    laptop: nothing closed them), saying so in one line; their names. A run whose driver ran on
    another machine is left as it is: only that machine can see its process (and the run's lock
    file may lie on storage this one does not share)."""
    closed = []
    for run in search_runs_paged(
        client,
        experiment_ids,
        f"attributes.status = '{contract.STATUS_RUNNING}'",
        order_by=["attributes.start_time ASC"],
    ):
        identity = run_driver(run)
        if identity is None or driver_alive(identity) is not False:
            continue
        if run_driver(client.get_run(run.info.run_id)) != identity:  # a new driver reopened it meanwhile
            continue
        driver = describe_driver(identity)
        client.set_tag(
            run.info.run_id,
            contract.TAG_CLOSED_AS_KILLED,
            f"its driver ({driver}) was gone at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        )
        client.set_terminated(run.info.run_id, status=contract.STATUS_KILLED)
        closed.append((run.info.run_name, driver))
    if len(closed) == 1:
        ((name, driver),) = closed
        print(f"[attent] closed 1 run left RUNNING by a dead driver ({driver}): {name} → KILLED", file=sys.stderr)
    elif closed:
        print(
            f"[attent] closed {len(closed)} runs left RUNNING by dead drivers: "
            + ", ".join(f"{name} ({driver}) → KILLED" for name, driver in closed),
            file=sys.stderr,
        )
    return [name for name, _ in closed]


def run_driver(run) -> dict[str, object] | None:
    """The driver a run is tagged with (None for runs from before the tag, or a tag not ours)."""
    try:
        identity = json.loads(run.data.tags.get(contract.TAG_DRIVER, "null"))
    except ValueError:
        return None
    return identity if isinstance(identity, dict) and "pid" in identity else None


def search_runs_paged(
    client: MlflowClient, experiment_ids: list[str], filter_string: str, order_by: list[str] | None = None
) -> list:
    from mlflow.utils import get_results_from_paginated_fn

    return get_results_from_paginated_fn(
        lambda count, token: client.search_runs(
            experiment_ids, filter_string, max_results=count, order_by=order_by, page_token=token
        ),
        1000,
    )


# --- injected failures --------------------------------------------------------------------------
def maybe_fail(cfg: ExperimentConfig, epoch: int, rank: int) -> None:
    """Fault injection: die once (a marker file remembers) after the given epoch's checkpoint."""
    fault = cfg.fault
    if fault.fail_once_after_epoch is None or epoch != fault.fail_once_after_epoch or rank != fault.fail_rank:
        return
    marker = Path(cfg.ray.storage_path) / cfg.name / f".injected-failure-epoch{epoch}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    if cfg.ray.num_workers == 0:  # local mode: the worker is the driver's process, which must live on
        raise InjectedFailure(f"fault injection: the run fails after epoch {epoch + 1}")
    print(f"[attent] fault injection: rank {rank} exits after epoch {epoch + 1}", flush=True)
    os._exit(1)


class InjectedFailure(RuntimeError):
    """The failure ``fault.fail_once_after_epoch`` injects in Ray Train's local mode."""


def sigterm_injection(cfg: ExperimentConfig) -> dict[str, Any] | None:
    """The SIGTERM a test asked for in ``SIGTERM_FILE`` (read once, at a worker's start), if any."""
    path = run_folder(cfg) / SIGTERM_FILE if run_folder(cfg) else None
    try:
        return {**json.loads(path.read_text()), "path": path} if path else None
    except (OSError, ValueError):
        return None


def maybe_sigterm(injection: dict[str, Any] | None, epoch: int, step: int, rank: int, received: threading.Event):
    """Fault injection: the rank the injection names sends itself SIGTERM (as the kubelet would)
    after optimiser step ``step`` of ``epoch``, once (the file is removed), and waits until the
    process's handler has seen it (``received``): a notice that came during that step."""
    if not injection or (injection["epoch"], injection["step"], injection["rank"]) != (epoch, step, rank):
        return
    injection["path"].unlink(missing_ok=True)  # once: a restarted worker finds none
    injection.clear()
    print(
        f"[attent] fault injection: rank {rank} sends itself SIGTERM after step {step} of epoch {epoch + 1}", flush=True
    )
    os.kill(os.getpid(), signal.SIGTERM)
    received.wait(30)  # the handler runs in the main thread, between its Ray calls
