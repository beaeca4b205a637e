"""Ray Tune sweeps through the Train engine, with MLflow parent/child runs (an interrupted sweep resumed:
tests/system/test_sweep.py)."""

from __future__ import annotations

import mlflow
import pytest
from attent.sweep.spec import load_sweep
from attent.sweep.tune import TRIAL_DRIVER_RESOURCES, concurrency, run_sweep, trial_resources

from tests.helpers import shared_runs
from tests.helpers.paths import REPO


def write_sweep(tmp_path, mlflow_uri, name, seeds, max_concurrent, epochs=1):
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""
sweep:
  name: {name}
  base: {REPO / "experiments/digits_vit.yaml"}
  overrides:
    train.epochs: {epochs}
    task.train_limit: 300
    task.test_limit: 100
    ray.storage_path: {tmp_path / "ray_results"}
    mlflow.tracking_uri: '{mlflow_uri}'
    mlflow.experiment: sweep-test
  grid:
    selection.strategy: [hard, soft]
  seeds: {seeds}
  max_concurrent: {max_concurrent}
""")
    return path


def test_sweep_file_expands_grid_times_seeds(tmp_path, mlflow_uri):
    sweep = load_sweep(write_sweep(tmp_path, mlflow_uri, "expand", [0, 1, 2], 2))
    assert len(sweep.trials) == 6
    assert sorted({(c.selection.strategy, c.seed) for _, c in sweep.trials}) == [
        (s, k) for s in ("hard", "soft") for k in (0, 1, 2)
    ]
    assert all(c.train.epochs == 1 and c.selection.preset == "vit" for _, c in sweep.trials)
    assert {c.mlflow.experiment for _, c in sweep.trials} == {"sweep-test"}  # the sweep's override wins


def test_a_grid_over_the_workers_sizes_each_trials_resources_and_the_concurrency(tmp_path, mlflow_uri):
    """Tune's resources and concurrency follow each trial's own ``ray:`` section, not the base's
    (on 9171ffd both came from the base config: a grid over ray.num_workers or ray.cpus_per_worker
    got the base's resources, 8 trials at once on 8 CPUs)."""
    path = write_sweep(tmp_path, mlflow_uri, "workers", [0], None)
    path.write_text(
        path.read_text()
        .replace("selection.strategy: [hard, soft]", "ray.num_workers: [0, 2]\n    ray.cpus_per_worker: [1, 2]")
        .replace("max_concurrent: None", "")
    )
    trials = [cfg for _, cfg in load_sweep(path).trials]
    shapes = sorted((c.ray.num_workers, c.ray.cpus_per_worker) for c in trials)
    assert shapes == [(0, 1), (0, 2), (2, 1), (2, 2)]
    for cfg in trials:  # local mode trains in the trial's own process: it asks for its worker's CPUs
        wanted = (
            {"CPU": cfg.ray.cpus_per_worker, **TRIAL_DRIVER_RESOURCES}
            if cfg.ray.num_workers == 0
            else TRIAL_DRIVER_RESOURCES
        )
        assert trial_resources(cfg) == wanted
    # the largest trial, 2 workers x 2 CPUs, fits twice in 8 CPUs; a GPU trial by the GPUs
    assert concurrency(None, trials, {"CPU": 8.0}) == 2
    assert concurrency(3, trials, {"CPU": 8.0}) == 3
    gpu = trials[-1].model_copy(update={"ray": trials[-1].ray.model_copy(update={"use_gpu": True})})
    assert concurrency(None, [*trials, gpu], {"CPU": 64.0, "GPU": 4.0}) == 2


def test_a_sweep_is_its_own_mlflow_experiment():
    sweep = load_sweep(REPO / "experiments/sweeps/ablation_digits.yaml")
    assert len(sweep.trials) == 42  # (12 grid + full + its 2E plateau control) x 3 seeds
    assert {c.mlflow.experiment for _, c in sweep.trials} == {"ablation-digits"}  # not the base's digits-vit


def test_four_trial_sweep_logs_parent_and_children(digits_sweeps):
    """The ablation sweep (``shared_runs``): a grid of two temperatures plus two extra trials,
    two at a time on the session's Ray."""
    results = digits_sweeps.results[shared_runs.ABLATION_SWEEP]
    assert len(results) == 4 and all(r.error is None for r in results)
    assert all(r.metrics["epoch"] == 2 for r in results)  # Train's reports reached Tune

    client = mlflow.MlflowClient(digits_sweeps.tracking_uri)
    experiment = client.get_experiment_by_name(shared_runs.ABLATION_SWEEP)  # a sweep is its own experiment
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`attent.role` = 'sweep'")
    kids = client.search_runs([experiment.experiment_id], "tags.`attent.role` = 'trial'")
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials_failed"] == 0
    assert len(kids) == 4 and {k.info.status for k in kids} == {"FINISHED"}
    assert {k.data.tags["mlflow.parentRunId"] for k in kids} == {parent.info.run_id}
    assert sorted(
        (
            k.data.tags["attent.trial"],
            k.data.tags["attent.method"],
            k.data.params["selection.temperature"],
            k.data.params["selection.ratio.kind"],
        )
        for k in kids
    ) == [
        ("t00-s0", "attent", "0.5", "incremental"),
        ("t01-s0", "attent", "2.0", "incremental"),
        ("t02-s0", "full", "1.0", "fixed"),
        ("t03-s0", "attent", "4.0", "cosine"),
    ]
    assert all("eval_test_accuracy" in k.data.metrics for k in kids)


def test_a_trial_finished_before_tune_saved_it_is_not_trained_again(digits_sweeps):
    """The driver can die after a trial's MLflow run FINISHED but before Tune persisted that; the
    rerun trial reports the recorded metrics instead of training into a second MLflow run. The
    ratio sweep (``shared_runs``) again, with Tune's state gone and MLflow's kept."""
    import shutil

    name = shared_runs.RATIO_SWEEP
    first = {r.config["trial"]["id"]: r.metrics for r in digits_sweeps.results[name]}
    client = mlflow.MlflowClient(digits_sweeps.tracking_uri)
    experiment = client.get_experiment_by_name(name)
    trials = "tags.`attent.role` = 'trial'"
    ended = {k.info.run_id: k.info.end_time for k in client.search_runs([experiment.experiment_id], trials)}
    assert len(ended) == 3

    shutil.rmtree(digits_sweeps.root / "ray_results" / name)  # Tune's state lost; MLflow's kept
    second = {r.config["trial"]["id"]: r.metrics for r in run_sweep(digits_sweeps.root / f"{name}.yaml")}
    kids = client.search_runs([experiment.experiment_id], trials)
    assert {k.info.run_id: k.info.end_time for k in kids} == ended  # no new run, none re-ended
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`attent.role` = 'sweep'")
    assert parent.info.status == "FINISHED"
    assert set(second) == set(first)
    for trial, metrics in first.items():
        assert second[trial]["eval_test_accuracy"] == pytest.approx(metrics["eval_test_accuracy"])


def test_storage_uris_keep_their_scheme(tmp_path):
    from attent.sweep.tune import _exists, sweep_location

    assert sweep_location("s3://bucket/ray_results/", "abl") == "s3://bucket/ray_results/abl"
    assert sweep_location(str(tmp_path), "abl") == f"{tmp_path}/abl"
    (tmp_path / "abl").mkdir()
    assert _exists(f"file://{tmp_path}/abl") and _exists(str(tmp_path / "abl"))
    assert not _exists(f"file://{tmp_path}/other") and not _exists(str(tmp_path / "other"))
