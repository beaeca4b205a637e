"""Eight faults a user can meet (corrupt checkpoints, a corrupt image, a tracking server refusing
the API, an unreachable Ray, a second or a killed driver, an impossible request or a missing file,
a theory lab file given to `attent validate`, two runs creating one SQLite store), each provoked
through the CLI as a user would meet it, on the embedded default (a local Ray started by `attent
train`, a SQLite MLflow store): per fault, the seconds to the message, the message (the last line
on stderr) and the MLflow statuses after.

    python benchmarks/robustness/faults_report.py [--out FOLDER]

About 5 minutes on 2 cores. Everything runs in a fresh temporary folder. Writes ``README.md`` (the
table, the command, the machine) into ``--out``, by default a new folder
``benchmarks/results/faults_report/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlflow
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

REPO = harness.REPO
ATTENT = str(Path(sys.executable).with_name("attent"))


def attent(*args: str, cwd: Path, env: dict | None = None) -> tuple[float, int, str, str]:
    """Seconds, exit code, last stderr line and the whole output of one `attent` command."""
    start = time.monotonic()
    proc = subprocess.run(
        [ATTENT, *args], cwd=cwd, capture_output=True, text=True, timeout=900, env=dict(os.environ, **(env or {}))
    )
    lines = proc.stderr.strip().splitlines()
    return time.monotonic() - start, proc.returncode, lines[-1] if lines else "", proc.stdout + proc.stderr


def digits(work: Path, name: str, **extra) -> Path:
    cfg = {
        "name": name,
        "seed": 0,
        "task": {
            "name": "vision",
            "dataset": "digits",
            "train_limit": 300,
            "test_limit": 100,
            "model": {"preset": "vit_tiny_cpu"},
        },
        "train": {"epochs": 3, "batch_size": 64},
        "selection": {"preset": "vit"},
        "ray": {"num_workers": 1, "storage_path": str(work / "ray_results")},
        "mlflow": {"tracking_uri": f"sqlite:///{work}/mlflow.db", "experiment": "faults"},
    }
    for section, values in extra.items():  # merged into the section; a selection replaces it
        cfg[section] = values if section == "selection" else {**cfg.get(section, {}), **values}
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return path


def statuses(work: Path, name: str, db: str = "mlflow.db") -> str:
    client = mlflow.MlflowClient(f"sqlite:///{work}/{db}")
    found = client.get_experiment_by_name("faults")
    runs = client.search_runs([found.experiment_id], f"tags.`mlflow.runName` = '{name}'") if found else []
    return ", ".join(r.info.status for r in runs) or "no run"


def checkpoints(work: Path, name: str) -> list[Path]:
    return sorted(p for p in (work / "ray_results" / name).glob("checkpoint_*") if p.is_dir())


def corrupt_checkpoints(work: Path) -> list[tuple[str, str]]:
    rows = []
    path = digits(work, "newest", fault={"fail_once_after_epoch": 1}, ray={"max_failures": 0})
    attent("train", str(path), cwd=work)
    (checkpoints(work, "newest")[-1] / "state.pt").write_bytes(os.urandom(4096))
    seconds, code, _, output = attent("train", str(path), cwd=work)
    skipped = next((line.split("[attent] ")[-1] for line in output.splitlines() if "skipped checkpoint" in line), "")
    rows.append(
        (
            "1a. newest checkpoint overwritten; re-run",
            f"exit {code} after {seconds:.0f} s (a full run): `{skipped[:160]}…`; continues from the older one",
            statuses(work, "newest"),
        )
    )
    path = digits(work, "only", fault={"fail_once_after_epoch": 0}, ray={"max_failures": 0})
    attent("train", str(path), cwd=work)
    (checkpoints(work, "only")[-1] / "state.pt").write_bytes(b"not a checkpoint")
    path = digits(work, "only", fault={"fail_once_after_epoch": 0}, ray={"max_failures": 3})
    seconds, code, line, _ = attent("train", str(path), cwd=work)
    rows.append(
        (
            "1b. the only checkpoint overwritten; re-run with 3 restarts allowed",
            f"exit {code} after {seconds:.0f} s: `{line}`",
            statuses(work, "only"),
        )
    )
    return rows


def corrupt_image(work: Path) -> list[tuple[str, str]]:
    from attent.tasks.mae import scenes

    root = work / "scenes"
    scenes.write_dataset(root, train=30, test=10, size=16, seed=0, workers=1)
    sorted((root / "train" / "depth").rglob("*.png"))[3].write_bytes(os.urandom(300))
    path = work / "broken.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "broken",
                "task": {
                    "name": "multimae",
                    "data_path": str(root),
                    "img_size": 16,
                    "model": {"preset": "vit_tiny_cpu", "decoder_dim": 32},
                },
                "train": {"epochs": 1, "batch_size": 16},
                "selection": {"method": "full"},
                "ray": {"num_workers": 1, "max_failures": 2, "storage_path": str(work / "ray_results")},
                "mlflow": {"tracking_uri": f"sqlite:///{work}/mlflow.db", "experiment": "faults"},
            }
        )
    )
    seconds, code, line, _ = attent("validate", str(path), "--decode", cwd=work)
    rows = [
        (
            "2a. a PNG overwritten with random bytes: `attent validate --decode`",
            f"exit {code} after {seconds:.1f} s: `{line}`",
            "no run",
        )
    ]
    seconds, code, line, _ = attent("train", str(path), cwd=work)
    rows.append(
        (
            "2b. the same: `attent train` (2 restarts allowed)",
            f"exit {code} after {seconds:.0f} s: `{line}`",
            statuses(work, "broken"),
        )
    )
    return rows


def refusing_server(work: Path) -> list[tuple[str, str]]:
    from attent.server import app as server

    port = server_port()
    proc = subprocess.Popen(
        [
            ATTENT,
            "server",
            "--backend-store-uri",
            f"sqlite:///{work}/served.db",
            "--artifacts-destination",
            str(work / "art"),
            "--port",
            str(port),
            "--workers",
            "1",
            "--allowed-hosts",
            "tracking.example.org",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        server.wait_ready(f"http://127.0.0.1:{port}", proc)
        path = digits(work, "refused", mlflow={"tracking_uri": f"http://127.0.0.1:{port}"})
        seconds, code, line, _ = attent("train", str(path), cwd=work)
    finally:
        server.stop(proc)
    return [
        (
            "3. a server answering /health but refusing the API (Host check)",
            f"exit {code} after {seconds:.1f} s: `{line}`",
            "no run (refused before Ray starts)",
        )
    ]


def server_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unreachable_ray(work: Path) -> list[tuple[str, str]]:
    path = digits(work, "unreachable")
    seconds, code, line, _ = attent("train", str(path), "ray.address=127.0.0.1:9", cwd=work)
    return [
        ("4. `ray.address: 127.0.0.1:9`", f"exit {code} after {seconds:.1f} s: `{line}`", statuses(work, "unreachable"))
    ]


def killed_driver(work: Path) -> list[tuple[str, str]]:
    path = digits(
        work,
        "orphan",
        task={"train_limit": None, "test_limit": 100},
        train={"epochs": 200},
        selection={"method": "full"},
        ray={"checkpoint_every": 1000},
    )
    driver = subprocess.Popen(
        [ATTENT, "train", str(path)],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    client = mlflow.MlflowClient(f"sqlite:///{work}/mlflow.db")
    deadline = time.monotonic() + 300
    runs = []
    while time.monotonic() < deadline:  # until two epochs are logged
        found = client.get_experiment_by_name("faults")
        runs = client.search_runs([found.experiment_id], "tags.`mlflow.runName` = 'orphan'") if found else []
        if runs and len(client.get_metric_history(runs[0].info.run_id, "train_loss")) >= 2:
            break
        time.sleep(1)
    seconds, code, line, _ = attent("train", str(path), cwd=work)
    rows = [
        (
            "5a. a second `attent train` of a run being trained",
            f"exit {code} after {seconds:.1f} s: `{line}`",
            statuses(work, "orphan") + " (the first run's)",
        )
    ]
    descendants = psutil.Process(driver.pid).children(recursive=True)
    workers = [p for p in descendants if "RayTrainWorker" in " ".join(p.cmdline())]
    logged = len(client.get_metric_history(runs[0].info.run_id, "train_loss"))
    start = time.monotonic()
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    _, alive = psutil.wait_procs(workers, timeout=60)
    workers_gone = time.monotonic() - start
    _, rest = psutil.wait_procs(descendants, timeout=60)
    time.sleep(3)
    after = len(client.get_metric_history(runs[0].info.run_id, "train_loss")) - logged
    rows.append(
        (
            "5b. `attent train` SIGKILLed mid-run (local Ray)",
            f"{len(workers)} Ray Train worker(s) gone {workers_gone:.1f} s after the kill"
            f"{' (still alive: ' + str(len(alive)) + ')' if alive else ''}; {len(rest)} of the local Ray's "
            f"{len(descendants)} processes left after 60 s; epochs logged after the kill: {after}",
            statuses(work, "orphan"),
        )
    )
    for proc in rest:
        proc.kill()
    return rows


def other_errors(work: Path) -> list[tuple[str, str]]:
    path = digits(work, "impossible")
    seconds, code, line, _ = attent("train", str(path), "ray.num_workers=64", cwd=work)
    rows = [
        (
            "6a. an impossible resource request (64 workers on 2 CPUs)",
            f"exit {code} after {seconds:.1f} s: `{line}`",
            statuses(work, "impossible"),
        )
    ]
    seconds, code, line, _ = attent("train", str(work / "missing.yaml"), cwd=work)
    rows.append(("6b. a missing experiment file", f"exit {code} after {seconds:.1f} s: `{line}`", "no run"))
    return rows


def theory_file(work: Path) -> list[tuple[str, str]]:
    start = time.monotonic()
    proc = subprocess.run(
        [ATTENT, "validate", str(REPO / "experiments/theory_teaching.yaml")], cwd=work, capture_output=True, text=True
    )
    out = next((line for line in proc.stdout.splitlines() if ": OK —" in line), proc.stdout.strip()[-200:])
    return [
        (
            "7. `attent validate experiments/theory_teaching.yaml`",
            f"exit {proc.returncode} after {time.monotonic() - start:.1f} s: `{out}`",
            "—",
        )
    ]


def new_sqlite_store(work: Path) -> list[tuple[str, str]]:
    paths = [digits(work, f"twin{i}", mlflow={"tracking_uri": f"sqlite:///{work}/twins.db"}) for i in range(2)]
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [ATTENT, "train", str(p)], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for p in paths
    ]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    seconds = time.monotonic() - start
    tracebacks = sum(o.count("Found multiple active Ray instances") for o in outputs)
    return [
        (
            "8. two `attent train` at once into one new SQLite file (two local Rays)",
            f"exit {', '.join(str(p.returncode) for p in procs)} after {seconds:.0f} s; "
            f"'Found multiple active Ray instances' printed {tracebacks} time(s)",
            "; ".join(statuses(work, f"twin{i}", "twins.db") for i in range(2)),
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, help="results folder (default: a new stamped one under results/faults_report/)"
    )
    args = parser.parse_args()
    info, rows = harness.machine(), []
    with tempfile.TemporaryDirectory(prefix="attent-faults-") as tmp:
        for fault in (
            corrupt_checkpoints,
            corrupt_image,
            refusing_server,
            unreachable_ray,
            killed_driver,
            other_errors,
            theory_file,
            new_sqlite_store,
        ):
            work = Path(tmp) / fault.__name__
            work.mkdir()
            for row in fault(work):
                rows.append(row)
                print(" | ".join(row), flush=True)
    lines = [
        "Each fault as a user meets it, on the embedded default (a local Ray started by `attent train`, "
        "SQLite MLflow). Seconds are wall-clock to the exit.",
        "",
        "| fault | what happens now | MLflow after |",
        "|---|---|---|",
        *(f"| {fault} | {what.replace('|', '/')} | {after} |" for fault, what, after in rows),
    ]
    out = harness.results_folder(args.out, info)
    print(
        harness.write_readme(
            out, "Faults, provoked through the CLI", harness.command_line(), "\n".join(lines), info
        ).read_text()
    )


if __name__ == "__main__":
    main()
