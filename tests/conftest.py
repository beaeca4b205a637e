"""Shared fixtures: one real Ray cluster (``ray start --head`` on 127.0.0.1) for the whole
session, the runs several tests read, and a scratch MLflow SQLite store per test. The paths and
helpers the tests import are in ``tests.helpers`` (``paths``, ``processes``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import BIN
from tests.helpers.processes import free_port, poll_train_workers_often, stop_ray_processes

# `ray start` in Ray 2.60 turns on token auth; Ray reads the mode once, at import, so set it
# before any test module imports ray.
os.environ["RAY_AUTH_MODE"] = "token"
# ... and with the mode set, `ray start` refuses to run without a token: on a machine that never
# made one (`ray get-auth-token --generate`), the session uses its own, never written to ~/.ray.
if not (
    os.environ.get("RAY_AUTH_TOKEN")
    or os.environ.get("RAY_AUTH_TOKEN_PATH")
    or (Path.home() / ".ray" / "auth_token").is_file()
):
    import atexit
    import secrets
    import shutil
    import tempfile

    _token = Path(tempfile.mkdtemp(prefix="attent-ray-token-")) / "auth_token"
    _token.write_text(secrets.token_hex(32))
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(_token)
    # removed when this pytest process ends (after the session's Ray is stopped): one per process
    # was left in /tmp by every run of the suite
    atexit.register(shutil.rmtree, _token.parent, ignore_errors=True)
# One BLAS/OpenMP thread per process: tests run beside Ray workers on 2 cores, and oversubscribed
# OpenMP threads made the LLM tests 5-10x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No thread a test did not start: the multi-process tests fork only a single-threaded process
# (``ranks.start_method``), and Hugging Face Hub's telemetry thread (TRL reports its trainers'
# use) and tqdm's monitor thread stayed alive for the rest of the worker. Neither is under test.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def pytest_configure(config):
    import tqdm

    from tests.helpers import ranks

    refuse_ungrouped_loadgroup(config)
    tqdm.tqdm.monitor_interval = 0  # no monitor thread (above)
    ranks.preload_fork_server()


def refuse_ungrouped_loadgroup(config) -> None:
    """`make test`'s ``--dist loadgroup`` groups nothing with pytest 9.2 and pytest-xdist 3.8 (xdist
    rewrites a test's id, which 9.2 no longer reads: pytest-dev/pytest-xdist#1386): the Ray tests
    would run on both workers, each training the session's runs again. Refused in one line."""
    if config.getoption("dist", "no") != "loadgroup" or hasattr(config, "workerinput"):
        return
    import xdist
    from packaging.version import Version

    if Version(pytest.__version__) >= Version("9.2") and Version(xdist.__version__) <= Version("3.8.0"):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__}: --dist loadgroup "
            "groups no test (pytest-dev/pytest-xdist#1386); install the tested versions "
            "with `make setup` (requirements/platform.lock)"
        )


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A local Ray head node bound to 127.0.0.1, with the job server for ``ray job submit``."""
    poll_train_workers_often()
    port, dashboard = free_port(), free_port()
    temp = Path("/tmp") / f"ray-attent-{os.getpid()}"
    cmd = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        "--num-cpus=2",
        # its own agent port: the default (52365) may be held by another Ray on the machine
        f"--dashboard-agent-listen-port={free_port()}",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    old_address = os.environ.get("RAY_ADDRESS")
    # started from the venv, as docs/guides/ray.md asks: a submitted job's entrypoint finds `attent` on its PATH
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(cmd, check=True, capture_output=True, timeout=180, env=env)
    info = {"address": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dashboard}", "temp_dir": temp}
    os.environ["RAY_ADDRESS"] = info["address"]
    yield info
    import ray

    ray.shutdown()
    stop_ray_processes(temp)
    if old_address is None:
        os.environ.pop("RAY_ADDRESS", None)
    else:
        os.environ["RAY_ADDRESS"] = old_address


@pytest.fixture(scope="session")
def reference_runs(ray_cluster, tmp_path_factory):
    """(name, variant) -> that reference run (``tests.helpers.shared_runs``), trained on first use, once per
    session."""
    from tests.helpers import shared_runs

    root = tmp_path_factory.mktemp("reference")
    trained = {}

    def get(name: str, variant: str = "") -> shared_runs.TrainedRun:
        if (name, variant) not in trained:
            cfg = shared_runs.reference_experiment(name, root, variant)
            trained[name, variant] = shared_runs.train_run(cfg, root / "read")
        return trained[name, variant]

    return get


@pytest.fixture(scope="session")
def restarted_reference(reference_runs):
    """The reference AtteNT soft run, killed after epoch 2 and restarted, tracking kernels."""
    return reference_runs("digits-soft", "restarted")


@pytest.fixture(scope="session")
def known_sweep_store(tmp_path_factory):
    """(tracking URI, sweep parent run id, report folder) of report_store's known sweep, built once
    for the report tests; some add experiments of their own beside it."""
    from tests.helpers.report_store import known_sweep

    return known_sweep(tmp_path_factory)


@pytest.fixture(scope="session")
def digits_sweeps(ray_cluster, tmp_path_factory):
    """The two small digits sweeps (``shared_runs``), run once per session on first use."""
    from tests.helpers import shared_runs

    return shared_runs.run_digits_sweeps(tmp_path_factory.mktemp("sweeps"))


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """A new SQLite tracking store, its tables created once per session (MLflow's migrations, ~2 s
    each time): the tests' scratch stores are copies of it. The stores whose creation is under
    test are made by the test (tests/engine/test_faults.py, test_preflight.py)."""
    import mlflow

    path = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments(max_results=1)
    return path


@pytest.fixture
def mlflow_uri(tmp_path, empty_store) -> str:
    import shutil

    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


RAY_FIXTURES = {"ray_cluster", "reference_runs", "restarted_reference", "digits_sweeps"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """The tests that use the session's Ray run one after another on one pytest-xdist worker
    (``--dist loadgroup``): one Ray is started, and the runs trained once per session are trained
    once. A test marked ``after_the_ray_group`` runs last on that worker (it and the Ray group, each a
    cluster of processes, slow each other down more than they overlap); the rest spread over both
    workers around them."""
    for item in items:
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("after_the_ray_group"):
            item.add_marker(pytest.mark.xdist_group("ray"))
    items.sort(key=lambda item: item.get_closest_marker("after_the_ray_group") is not None)  # stable otherwise


def pytest_terminal_summary(terminalreporter):
    """Each tier's time in every log: the summed durations of `make test`'s tests and of the system
    tier's (`make test-all` adds it), beside pytest's own wall-clock line."""
    seconds = {"make test": 0.0, "system tier": 0.0}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                tier = "system tier" if "system" in report.keywords else "make test"
                seconds[tier] += report.duration
    spent = ", ".join(f"{tier} {value:.0f} s" for tier, value in seconds.items() if value)
    if spent:
        terminalreporter.write_line(f"test time by tier (summed over both workers): {spent}")
