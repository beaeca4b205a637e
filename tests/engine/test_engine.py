"""The training engine on a real Ray cluster, real MLflow (SQLite) and real data (digits); the
progress line on a terminal in Ray Train's local mode, which shows it the same. A worker restarted from
its checkpoint, and `ray job submit`: tests/system/test_engine.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import mlflow
import pytest


def runs_named(mlflow_uri, name):
    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("engine-test")
    return client, client.search_runs([experiment.experiment_id], f"tags.`mlflow.runName` = '{name}'")


def test_two_workers_train_on_one_subset_and_log_to_mlflow(reference_runs):
    """The reference AtteNT soft run: digits, 2 workers, 4 epochs, the ViT variant, trained as
    `attent train` trains it with its output to a file."""
    trained = reference_runs("digits-soft")
    # on screen a plain line per epoch seen (the last one always), nothing else (the workers' lines
    # Ray forwards to the driver go to the run's log: the job-submit test, where the driver's
    # Python output is not the test's)
    shown = [line for line in trained.screen.splitlines() if line.strip()]
    assert shown and shown[-1].startswith("digits-soft epoch 4/4: loss ") and len(shown) <= 4, shown
    assert all(line.startswith("digits-soft epoch ") for line in shown), shown
    client = mlflow.MlflowClient(trained.tracking_uri)
    run = client.get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id], f"tags.`mlflow.runName` = '{run.info.run_name}'")) == 1
    # The loop all-gathers a checksum of each epoch's subset and raises if ranks disagree;
    # reaching FINISHED with the checksum logged means both ranks trained on the same subset.
    checksums = client.get_metric_history(run.info.run_id, "subset_checksum")
    assert len(checksums) == 4
    ratios = [
        m.value for m in sorted(client.get_metric_history(run.info.run_id, "selected_ratio"), key=lambda m: m.step)
    ]
    # one definition of progress, e / E: re-selections at epochs 0, 1 and 3 (the interval grows
    # 1 -> 2) select r(0), r(1/4), r(3/4)
    assert ratios == pytest.approx([0.2, 0.35, 0.35, 0.65], abs=0.01)

    m = run.data.metrics
    n = int(m["num_train_samples"])
    # vit preset: 3 scoring passes over all data + training on 20%, 35%, 35%, 65% of it; the
    # samples that pad a subset to an even split over the 2 ranks are forwarded, not counted
    sizes = [round(r * n) for r in (0.2, 0.35, 0.35, 0.65)]
    assert m["samples_backpropagated"] == sum(sizes) and any(size % 2 for size in sizes)
    hardness = client.get_metric_history(run.info.run_id, "selection_hardness")
    assert len(hardness) == 4 and all(-1 <= h.value <= 1 for h in hardness)
    assert len(client.get_metric_history(run.info.run_id, "selection_overlap")) == 3  # none for the first pick
    assert m["samples_forwarded"] >= m["samples_backpropagated"] + 3 * n
    assert 0.6 < m["sample_saving"] < 0.62
    assert m["mean_selected_ratio"] == pytest.approx(0.3875, abs=0.01)
    assert m["max_selected_ratio"] == pytest.approx(0.65, abs=0.01)


def test_the_reference_run_logs_its_costs_tags_and_artifacts(reference_runs):
    """The same reference AtteNT soft run (trained once per session): its timings, their parts,
    the tags and params that name it, its artifacts and the subsets it selected."""
    trained = reference_runs("digits-soft")
    client = mlflow.MlflowClient(trained.tracking_uri)
    run = client.get_run(trained.run_id)
    m = run.data.metrics
    n = int(m["num_train_samples"])
    for key in (
        "time_total_s",
        "time_train_s",
        "time_scoring_s",
        "time_selection_s",
        "time_eval_s",
        "time_method_s",
        "eval_test_accuracy",
        "time_wallclock_s",
    ):
        assert key in m
    # the method's cost is training + scoring + selection; evaluation and checkpoints apart
    assert m["time_method_s"] == pytest.approx(m["time_train_s"] + m["time_scoring_s"] + m["time_selection_s"])
    assert m["time_total_s"] >= m["time_method_s"] + m["time_eval_s"] - 1e-6
    # the worker's set-up, split into its parts (MLflow, data, model, the rest)
    parts = [m[f"time_setup_{part}_s"] for part in ("tracking", "data", "model", "other")]
    assert sum(parts) == pytest.approx(m["time_setup_s"]) and min(parts[:3]) > 0

    tags, params = run.data.tags, run.data.params
    assert tags["attent.method"] == "attent" and tags["attent.strategy"] == "soft"
    assert tags["attent.ratio_schedule"] == "incremental(0.2→0.8)"
    assert tags["attent.label"] == "Soft · incremental(0.2→0.8, reached 0.65) · incremental(1→4)"
    assert tags["attent.ratio_reached"] == "0.65" and len(tags["attent.identity"]) == 12
    assert params["ray.num_workers"] == "2" and params["selection.preset"] == "vit"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "selection_history.json", "epoch_history.json", "figures"} <= artifacts
    figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert {"figures/loss.png", "figures/selected_ratio.png"} <= figures
    assert len(trained.subsets) == 3 and len(trained.subsets[0]) == round(0.2 * n)


def test_attent_train_on_a_terminal_shows_one_progress_line(tmp_path, mlflow_uri):
    """`attent train` on a terminal (a pseudo-terminal here): one line per run, rewritten in place
    (epochs, loss, metric, elapsed, ETA), then the result; what the libraries and the training
    function print goes to the run's log file, which is also on the run. No traceback for a run
    that succeeds. The line follows the run's MLflow metrics whatever trains it: in Ray Train's
    local mode here (the job-submit test checks that Ray's forwarded worker lines stay off the
    screen too)."""
    import fcntl
    import pty
    import struct
    import termios

    from tests.helpers.paths import BIN

    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "name: on-a-terminal\ntask: {name: vision, dataset: digits, train_limit: 200, test_limit: 100,"
        " model: {preset: vit_tiny_cpu}}\ntrain: {epochs: 3, batch_size: 64}\nselection: {method: full}\n"
        f"ray: {{num_workers: 0, storage_path: {tmp_path / 'ray_results'}}}\n"
        f"mlflow: {{tracking_uri: '{mlflow_uri}', experiment: engine-test}}\n"
    )
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120-column terminal
    proc = subprocess.Popen(
        [str(BIN / "attent"), "train", str(exp)], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower
    )
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        screen += chunk
    assert proc.wait(timeout=600) == 0, screen.decode(errors="replace")[-3000:]
    text = screen.decode(errors="replace")
    lines = [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    progress = [line for line in lines if "on-a-terminal" in line and "epochs |" in line]
    assert len(progress) == 1, lines  # one line, redrawn with carriage returns
    states = progress[0].split("\r")
    assert "3/3 epochs" in states[-1] and "test_accuracy" in states[-1]
    # an epoch seen before the last carries the ETA (the poll, once a second, may see only the last)
    assert all("ETA" in state for state in states if "loss" in state and "3/3 epochs" not in state)
    assert "\r" in progress[0]
    assert len(lines) <= 3, lines  # the progress line and the result
    # the training function's own lines and Train's local-mode notice are in this process: not shown
    assert "[attent] epoch" not in text and "local mode" not in text
    assert "setting up" in text and "Ray workers" not in text  # no worker starts in local mode
    assert "Traceback" not in text and "WARNING" not in text
    client, [run] = runs_named(mlflow_uri, "on-a-terminal")
    log = Path(run.data.tags["attent.run_key"]) / "attent.log"
    assert "[attent] on-a-terminal: 200 samples, Ray Train's local mode" in log.read_text()  # the run's lines, kept
    assert [a.path for a in client.list_artifacts(run.info.run_id, "logs")] == ["logs/attent.log"]
