"""The benchmark's two stages (choices on validation, verdict on test) and its comparators that
depend on other runs: full data for 2E epochs, at equal samples, at equal measured cost. Real
MLflow stores; no Ray (the end-to-end run is tests/analysis/test_time_to_accuracy.py's)."""

from __future__ import annotations

import pytest
from attent import contract
from attent.benchmark import TuneSpec, calibrate_equal_cost, choose, load_benchmark, selection_runs, validation_finals
from attent.experiment.schema import ConfigError
from attent.selection.plan import build_plan
from mlflow import MlflowClient
from mlflow.entities import Metric

from tests.helpers.paths import REPO

TEMPERATURES = [0.5, 4.0, 16.0]


def write_spec(
    tmp_path,
    uri: str,
    arms: str = "{full: {}, full_long: {}, full_equal_cost: {}, "
    "full_equal_samples: {}, attent: {}, attent+hard: {selection.strategy: hard}, random: {}}",
) -> object:
    path = tmp_path / "bench.yaml"
    path.write_text(f"""# attent bench {path}
benchmark:
  name: stages
  seeds: [0, 1]
  workloads:
    - name: w
      base: {REPO}/experiments/digits_vit.yaml
      overrides: {{train.epochs: 8, task.train_limit: 300, task.val_limit: 100, mlflow.tracking_uri: "{uri}", ray.storage_path: "{tmp_path}/ray"}}
      metric: eval_test_accuracy
      tune:
        - {{arm: full, key: train.epochs, values: [4, 8]}}
        - {{arm: attent, key: selection.temperature, values: {TEMPERATURES}}}
      tune_seeds: [100, 101]
      arms: {arms}
""")
    return path


def log_finished(uri: str, cfg, metrics: dict[str, float]) -> None:
    """A finished run where ``latest_run(cfg)`` finds it, as the engine would leave it."""
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(cfg.mlflow.experiment)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(cfg.mlflow.experiment)
    run = client.create_run(experiment_id, tags={contract.TAG_RUN_KEY: f"{cfg.ray.storage_path}/{cfg.name}"})
    client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()])
    client.set_terminated(run.info.run_id)


def test_choices_apply_where_they_belong_and_full_data_comparators_follow_e(tmp_path):
    path = write_spec(tmp_path, f"sqlite:///{tmp_path}/m.db")
    spec, _ = load_benchmark(path)
    [workload] = spec.workloads
    epochs, temperature = workload.tune
    chosen = [(epochs, 4), (temperature, 16.0)]
    _, runs = load_benchmark(path, choices={"w": chosen})
    by = {run.arm: run.experiment for run in runs if run.experiment.seed == 0}
    assert {m: c.train.epochs for m, c in by.items() if m != "full_equal_samples"} == {
        "full": 4,
        "full_long": 8,
        "full_equal_cost": 4,
        "attent": 4,
        "attent+hard": 4,
        "random": 4,
    }
    # the temperature is AtteNT's choice: its variants take it, the other arms keep their own
    assert by["attent"].selection.temperature == by["attent+hard"].selection.temperature == 16.0
    assert by["random"].selection.temperature != 16.0
    planned = build_plan(by["attent"].selection, 4).mean_ratio() * 4
    assert by["full_equal_samples"].train.epochs == max(1, round(planned))
    # calibrated arms run after the runs they read, in every seed
    order = [(run.experiment.seed, run.arm) for run in runs]
    for seed in (0, 1):
        assert order.index((seed, "full_equal_cost")) > max(order.index((seed, "full")), order.index((seed, "attent")))
    assert all(run.stage == contract.BENCH_STAGE_VERDICT for run in runs)


def test_selection_runs_try_each_value_on_the_selection_seeds_with_earlier_choices(tmp_path):
    path = write_spec(tmp_path, f"sqlite:///{tmp_path}/m.db")
    spec, verdict_runs = load_benchmark(path)
    [workload] = spec.workloads
    epochs, temperature = workload.tune
    runs = selection_runs(path, workload, temperature, [(epochs, 4)])
    assert [(r.experiment.seed, r.candidate) for r in runs] == [
        (seed, ("selection.temperature", t)) for seed in (100, 101) for t in TEMPERATURES
    ]
    assert all(r.stage == contract.BENCH_STAGE_SELECTION and r.experiment.train.epochs == 4 for r in runs)
    assert [r.experiment.selection.temperature for r in runs[:3]] == TEMPERATURES
    names = {r.experiment.name for r in runs}
    assert len(names) == 6 and not names & {r.experiment.name for r in verdict_runs}
    assert all(r.experiment.task.val_limit == 100 for r in runs)


def test_the_temperature_is_chosen_on_validation_and_no_test_metric_sways_it(tmp_path):
    """Validation favours T = 4; the test metric, logged on the same runs, favours T = 0.5 by far.
    A chooser that read the test split (or mixed it in) would pick 0.5."""
    uri = f"sqlite:///{tmp_path}/m.db"
    path = write_spec(tmp_path, uri)
    spec, _ = load_benchmark(path)
    [workload] = spec.workloads
    temperature = workload.tune[1]
    runs = [
        r.model_copy(update={"experiment": r.experiment.resolved()})
        for r in selection_runs(path, workload, temperature, [])
    ]
    validation = {0.5: 0.80, 4.0: 0.86, 16.0: 0.84}
    test = {0.5: 0.99, 4.0: 0.10, 16.0: 0.10}
    for run in runs:
        value = run.candidate[1]
        log_finished(
            uri,
            run.experiment,
            {"eval_val_accuracy": validation[value] + run.experiment.seed * 1e-4, "eval_test_accuracy": test[value]},
        )
    finals = validation_finals(runs, workload.selection_metric())
    assert finals[4.0] == [pytest.approx(0.86 + 100e-4), pytest.approx(0.86 + 101e-4)]
    value, scores = choose(temperature, finals, lower_is_better=False)
    assert value == 4.0 and scores["4.0"] == pytest.approx(0.86 + 100.5e-4)
    assert choose(temperature, {0.5: [0.2], 4.0: [0.3], 16.0: [0.1]}, lower_is_better=True)[0] == 16.0
    with pytest.raises(ConfigError, match="validation metrics only"):
        validation_finals(runs, "eval_test_accuracy")
    with pytest.raises(ConfigError, match="no finished run with a validation metric for \\[16.0\\]"):
        choose(temperature, {0.5: [0.2], 4.0: [0.3]}, lower_is_better=False)


def test_full_data_at_equal_cost_is_calibrated_from_the_measured_costs(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    _, runs = load_benchmark(write_spec(tmp_path, uri))
    by = {run.arm: run for run in runs if run.experiment.seed == 0}
    log_finished(uri, by["full"].experiment, {contract.TIME_METHOD: 40.0})
    log_finished(uri, by["attent"].experiment, {contract.TIME_METHOD: 26.0})  # 65 % of full data's cost
    cfg = calibrate_equal_cost(by["full_equal_cost"], by["full"].experiment, by["attent"].experiment)
    assert cfg.train.epochs == round(8 * 26 / 40) == 5 and cfg.selection.method == "full"
    with pytest.raises(ConfigError, match="did not finish"):
        seed1 = {run.arm: run for run in runs if run.experiment.seed == 1}
        calibrate_equal_cost(seed1["full_equal_cost"], seed1["full"].experiment, seed1["attent"].experiment)


def test_random_at_equal_cost_runs_after_its_sources_for_attents_measured_cost(tmp_path, capsys):
    """Random scores nothing, so at AtteNT's samples it costs less: its equal-cost run gets the
    epochs that bring its measured cost to AtteNT's, under AtteNT's schedules and Random's strategy,
    read by the runner from the same seed's finished `random` and `attent` runs."""
    from attent.analysis.stats import MATCHED
    from attent.analysis.time_to_accuracy.results import budget_matches
    from attent.benchmark.runner import calibrated

    uri = f"sqlite:///{tmp_path}/m.db"
    _, runs = load_benchmark(write_spec(tmp_path, uri, arms="{attent: {}, random: {}, random_equal_cost: {}}"))
    seed0 = [run for run in runs if run.experiment.seed == 0]
    assert [run.arm for run in seed0][-1] == "random_equal_cost"  # after the runs it reads
    by = {run.arm: run for run in seed0}
    log_finished(uri, by["random"].experiment, {contract.TIME_METHOD: 20.0})
    log_finished(uri, by["attent"].experiment, {contract.TIME_METHOD: 26.0})
    cfg = calibrated(by["random_equal_cost"], runs)
    assert cfg.train.epochs == round(8 * 26 / 20) == 10
    assert (cfg.selection.strategy, cfg.selection.ratio, cfg.selection.interval) == (
        "random",
        by["attent"].experiment.selection.ratio,
        by["attent"].experiment.selection.interval,
    )
    assert "10 epochs of Random for AtteNT's measured method cost" in capsys.readouterr().out
    import pandas as pd  # matched by construction, whatever its sample budget

    summary = pd.DataFrame({"method": ["attent", "random", "random_equal_cost"], "budget": [0.5, 0.5, 0.62]})
    assert budget_matches(summary) == [MATCHED, MATCHED, MATCHED]
    with pytest.raises(ConfigError, match="random_equal_cost is calibrated from the `random` run"):
        load_benchmark(write_spec(tmp_path, uri, arms="{attent: {}, random_equal_cost: {}}"))


def test_a_workload_missing_what_an_arm_is_calibrated_from_is_refused(tmp_path):
    path = write_spec(tmp_path, f"sqlite:///{tmp_path}/m.db", arms="{attent: {}, full_equal_cost: {}}")
    with pytest.raises(ConfigError, match="full_equal_cost is calibrated from the `full` run"):
        load_benchmark(path)


def test_the_selection_stage_needs_a_validation_metric(tmp_path):
    path = write_spec(tmp_path, f"sqlite:///{tmp_path}/m.db")
    text = path.read_text().replace("metric: eval_test_accuracy", "metric: eval_accuracy")
    path.write_text(text)
    with pytest.raises(ConfigError, match="not a test metric; name its validation counterpart"):
        load_benchmark(path)
    assert TuneSpec(key="train.epochs", values=[1, 2], arm="full").targets("random")
    assert not TuneSpec(key="selection.temperature", values=[1, 2]).targets("random")


def test_a_benchmark_runs_only_the_workloads_named_and_refuses_an_unknown_one(tmp_path):
    from attent.experiment.schema import ConfigError

    spec, runs = load_benchmark(REPO / "benchmarks" / "specs" / "data_size.yaml", workloads=["fmnist-20000"])
    assert [w.name for w in spec.workloads] == ["fmnist-20000"]
    assert {run.workload.name for run in runs} == {"fmnist-20000"}
    # six arms (full data at equal samples left out at this size) on each of three seeds
    assert len(runs) == 6 * 3 and len({run.arm for run in runs}) == 6
    with pytest.raises(ConfigError, match="no workload 'fmnist-60000'; its workloads: fmnist-600, fmnist-2000"):
        load_benchmark(REPO / "benchmarks" / "specs" / "data_size.yaml", workloads=["fmnist-60000"])
