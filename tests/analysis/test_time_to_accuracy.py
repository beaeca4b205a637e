"""The time-to-accuracy benchmark: its specs, its report on a known MLflow store, and one real
run of `attent bench` end to end."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from attent import contract
from attent.analysis.time_to_accuracy.judge import analyse
from attent.analysis.time_to_accuracy.report import build_time_to_accuracy_report
from attent.analysis.time_to_accuracy.results import time_to_target
from attent.benchmark import ARMS, load_benchmark
from attent.cli.main import main as attent_main
from attent.selection.plan import build_plan
from attent.selection.schedules import CycleSchedule
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from tests.helpers.paths import REPO

SPECS = sorted((REPO / "benchmarks" / "specs").glob("*.yaml"))


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_benchmark_specs_parse_and_match_budgets(path):
    """Every spec expands into valid experiments (one torch thread per worker, named per
    workload/arm/seed); every budgeted baseline shares AtteNT's ratio and interval schedules,
    and a run of each seed of each arm exists."""
    spec, runs = load_benchmark(path)
    assert len(spec.seeds) >= 1 and path.read_text().startswith("# ")  # headed by its command
    names = [run.experiment.name for run in runs]
    assert len(set(names)) == len(names)
    for workload in spec.workloads:
        mine = [run for run in runs if run.workload.name == workload.name]
        assert len(mine) == len(workload.seeds or spec.seeds) * len(workload.arms)
        by_arm = {run.arm: run.experiment.selection for run in mine}
        attent = by_arm.get("attent")
        for arm, selection in by_arm.items():
            assert all(run.experiment.ray.cpus_per_worker == spec.threads for run in mine)
            if attent is not None and selection.uses_ratio_schedule:
                assert (
                    selection.ratio_schedule,
                    same_cycles(selection.interval_schedule),
                    selection.warmup_epochs,
                ) == (attent.ratio_schedule, same_cycles(attent.interval_schedule), attent.warmup_epochs), arm
        assert by_arm["full"].method == "full"


def same_cycles(schedule):
    """A cycles schedule less whether it re-draws at each subset epoch, which follows the strategy
    (Soft re-draws, Hard and Random keep the cycle's pick, as the released code does)."""
    return dataclasses.replace(schedule, redraw=False) if isinstance(schedule, CycleSchedule) else schedule


def test_small_spec_runs_the_regime_seeds_and_comparators():
    spec, runs = load_benchmark(REPO / "benchmarks" / "specs" / "time_to_accuracy_small.yaml")
    seeds = {w.name: len(w.seeds or spec.seeds) for w in spec.workloads}
    assert seeds["fmnist-vit"] >= 5 and seeds["multimae"] >= 3 and seeds["llm-gsm8k"] >= 3
    arms = {run.arm for run in runs if run.workload.name == "fmnist-vit"}
    assert {
        "full",
        "full_long",
        "full_equal_cost",
        "full_equal_samples",
        "attent",
        "hard",
        "random",
        "infobatch",
        "infobatch_budget",
    } <= arms


def test_full_data_at_equal_samples_trains_attent_mean_ratio_times_the_epochs():
    spec, runs = load_benchmark(REPO / "benchmarks" / "specs" / "time_to_accuracy_small.yaml")
    for workload in spec.workloads:
        mine = {run.arm: run for run in runs if run.workload is workload and run.experiment.seed == 0}
        attent, equal = mine["attent"].experiment, mine["full_equal_samples"].experiment
        planned = build_plan(attent.selection, attent.train.epochs).mean_ratio()
        assert equal.selection.method == "full"
        assert equal.train.epochs == round(planned * attent.train.epochs) < attent.train.epochs
        assert mine["full_equal_samples"].attent_budget == pytest.approx(planned)
        assert mine["full_long"].experiment.train.epochs == 2 * attent.train.epochs
    # the ViT variant at 60 epochs: re-selections from 0.2 to 0.78, mean 0.488 -> 29 epochs
    assert next(r for r in runs if r.arm == "full_equal_samples").experiment.train.epochs == 29


def test_infobatch_at_attent_budget_runs_after_the_run_it_calibrates_from(tmp_path):
    spec, runs = load_benchmark(REPO / "benchmarks" / "specs" / "time_to_accuracy_small.yaml")
    order = [(r.workload.name, r.experiment.seed, r.arm) for r in runs]
    for workload, seed, arm in order:
        if arm == "infobatch_budget":
            assert order.index((workload, seed, "infobatch")) < order.index((workload, seed, arm))
    from attent.experiment.schema import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"benchmark:\n  name: b\n  workloads:\n    - name: w\n      base: {REPO}/experiments/digits_vit.yaml\n"
        "      metric: eval_test_accuracy\n      arms: {attent: {}, infobatch_budget: {}}\n"
    )
    with pytest.raises(ConfigError, match="calibrated from the `infobatch` run"):
        load_benchmark(bad)


def test_unknown_arm_is_refused(tmp_path):
    from attent.experiment.schema import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"benchmark:\n  name: b\n  workloads:\n    - name: w\n      base: {REPO}/experiments/digits_vit.yaml\n"
        "      metric: eval_test_accuracy\n      arms: {full: {}, magic: {}}\n"
    )
    with pytest.raises(ConfigError, match="unknown arm.*magic"):
        load_benchmark(bad)
    assert set(ARMS) >= {"full", "attent", "hard", "random", "infobatch", "class_weight", "gradnorm"}


def test_a_named_variant_of_an_arm_adds_its_overrides():
    spec, runs = load_benchmark(REPO / "benchmarks" / "specs" / "mae_saving.yaml")
    by_arm = {run.arm: run.experiment for run in runs}
    stale, attent = by_arm["attent+stale"], by_arm["attent"]
    assert stale.selection.rescore_stale and not attent.selection.rescore_stale
    assert stale.selection.model_copy(update={"rescore_stale": False}) == attent.selection
    assert stale.name == "mae-saving-multimae-attent-stale-s0"


# --- the report on a known store ----------------------------------------------------------
# method -> per seed: per-epoch (cumulative method cost, accuracy), samples back-propagated
CURVES = {
    "full": [([(10, 0.50), (20, 0.70), (30, 0.80)], 3000), ([(12, 0.55), (24, 0.72), (36, 0.78)], 3000)],
    "attent": [([(5, 0.60), (10, 0.80), (15, 0.82)], 1500), ([(6, 0.50), (12, 0.70), (18, 0.75)], 1500)],
    "random": [([(4, 0.40), (8, 0.50), (12, 0.60)], 1500), ([(4, 0.45), (8, 0.55), (12, 0.65)], 1500)],
}


def log_benchmark(uri: str) -> str:
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("tta-known")
    parent = client.create_run(experiment_id, tags={contract.TAG_ROLE: contract.ROLE_BENCHMARK}).info.run_id
    for method, seeds in CURVES.items():
        for seed, (curve, backpropagated) in enumerate(seeds):
            run_id = client.create_run(
                experiment_id,
                tags={
                    contract.TAG_ROLE: contract.ROLE_TRIAL,
                    contract.TAG_PARENT_RUN_ID: parent,
                    contract.TAG_BENCH_WORKLOAD: "vit",
                    contract.TAG_BENCH_METHOD: method,
                    contract.TAG_BENCH_METRIC: "eval_test_accuracy",
                    contract.TAG_LABEL: method,
                },
            ).info.run_id
            metrics = [
                Metric(contract.SAMPLES_BACKPROPAGATED, backpropagated, 0, 3),
                Metric(contract.TIME_WALLCLOCK, 100 + curve[-1][0], 0, 3),
                Metric(contract.time_metric("scoring"), 2.0 if method == "attent" else 0.0, 0, 3),
            ]
            for step, (cost, accuracy) in enumerate(curve):
                metrics += [
                    Metric(contract.TIME_METHOD, cost, 0, step),
                    Metric("eval_test_accuracy", accuracy, 0, step),
                ]
            client.log_batch(run_id, metrics=metrics, params=[Param(contract.PARAM_SEED, str(seed))])
            client.set_terminated(run_id)
    return parent


def test_report_reads_the_target_off_full_datas_plateau_and_says_not_reached(tmp_path):
    """Full data ends at 0.80 and 0.78 (seed std 0.0141); no full_long run, so the plateau is
    undetermined. Target 0.79 - 0.0141 = 0.7759: AtteNT stays past it in seed 0 from 10 s, not in
    seed 1 (0.75); random never; full data from 30 s and 36 s. Ideal saving 50 %; realized
    1 - 15/30 = 50 % and 1 - 18/36 = 50 %."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = log_benchmark(uri)
    [result], found_parent = analyse(MlflowClient(uri), "tta-known")
    assert found_parent == parent and not result.lower
    assert result.target.value == pytest.approx(0.79 - 0.02 / math.sqrt(2))
    by = result.summary.set_index("method")
    assert list(by.index) == ["full", "attent", "random"]
    assert by.loc["attent", "reached"] == 1 and by.loc["attent", "cost_to_target_s"] == 10
    assert by.loc["random", "reached"] == 0 and math.isnan(by.loc["random", "cost_to_target_s"])
    assert by.loc["full", "reached"] == 2 and by.loc["full", "cost_to_target_s"] == 33
    assert by.loc["attent", "ideal_saving"] == pytest.approx(0.5)
    assert by.loc["attent", "realized_saving"] == pytest.approx(0.5)
    assert by.loc["attent", "realized_over_ideal"] == pytest.approx(1.0)
    assert by.loc["attent", "final_metric"] == pytest.approx(0.785) and by.loc["attent", "scoring_s"] == 2.0
    assert result.verdict[0].startswith("Plateau: undetermined: no full_long control")
    assert result.verdict[3].endswith("attent 0.7850, random 0.6250.")

    out = build_time_to_accuracy_report("tta-known", tracking_uri=uri, out_dir=tmp_path / "report")
    text = (out / "time_to_accuracy.md").read_text()
    assert "| random | random | matched | 50.0% ± 0.0% | 0.6250 ± 0.0354 | not reached |" in text
    assert "| 10.0 (1/2 seeds; rest not reached) |" in text  # one seed reached: no std
    assert (out / "summary.csv").exists() and len(list((out / "figures").glob("*.png"))) == 2
    client = MlflowClient(uri)
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert "report/time_to_accuracy.md" in logged and client.get_run(parent).info.status == "FINISHED"


def test_time_to_target_reads_lower_is_better_curves():
    import pandas as pd

    curve = pd.DataFrame({"cost": [1.0, 2.0, 3.0], "value": [3.0, 2.0, 1.5]})
    assert time_to_target(curve, 2.0, lower=True) == 2.0
    assert math.isnan(time_to_target(curve, 1.0, lower=True))
    assert math.isnan(time_to_target(curve, 2.5, lower=False))  # past it at 1.0, then fell back: not reached
    assert time_to_target(curve.iloc[::-1].assign(cost=[1.0, 2.0, 3.0]), 2.5, lower=False) == 3.0


# --- one real benchmark ------------------------------------------------------------------
def write_bench_spec(tmp_path: Path) -> Path:
    """A benchmark spec on digits: full data and AtteNT, one seed, 3 epochs, AtteNT's temperature tuned over two values."""
    spec = tmp_path / "bench.yaml"
    spec.write_text(f"""# attent bench bench.yaml
benchmark:
  name: tta-test
  seeds: [0]
  workloads:
    - name: digits
      base: {REPO}/experiments/digits_vit.yaml
      overrides: {{train.epochs: 3, ray.num_workers: 0, ray.checkpoint_every: 3, train.eval_every: 1,
                   task.train_limit: 400, task.val_limit: 100, task.test_limit: 100,
                   ray.storage_path: {tmp_path}/ray_results}}
      metric: eval_test_accuracy
      tune:
        - {{arm: attent, key: selection.temperature, values: [0.25, 4.0]}}
      arms: {{full: {{}}, attent: {{}}}}
""")
    return spec


def bench_command(spec: Path, uri: str, out: Path) -> list[str]:
    """The `attent bench` command line for ``spec``, into the MLflow store at ``uri``, its reports in ``out``."""
    return [sys.executable, "-m", "attent.cli", "bench", str(spec), f"mlflow.tracking_uri={uri}", "--out", str(out)]


def test_attent_bench_runs_one_at_a_time_into_mlflow_and_reports(ray_cluster, tmp_path, monkeypatch, capsys):
    """`attent bench` on digits: full data and AtteNT, one seed, real Ray and MLflow. Every run
    is a child of the benchmark's parent run, logs its start-up and teardown apart, checkpoints
    only every 3rd epoch; the report and its figures land on disk and on the parent; a second
    invocation keeps the finished runs."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = bench_command(write_bench_spec(tmp_path), uri, tmp_path / "reports")
    first = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    report = tmp_path / "reports" / "tta-test" / "time_to_accuracy.md"
    assert "## digits: eval_test_accuracy" in report.read_text()
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tta-test")
    trials = client.search_runs([experiment.experiment_id], f"tags.`{contract.TAG_ROLE}` = 'trial'")
    # the selection stage: AtteNT at each temperature on seed 0, judged on validation, then frozen
    tried = [r for r in trials if r.data.tags[contract.TAG_BENCH_STAGE] == contract.BENCH_STAGE_SELECTION]
    assert sorted(r.data.params["selection.temperature"] for r in tried) == ["0.25", "4.0"]
    parent_id = tried[0].data.tags[contract.TAG_PARENT_RUN_ID]
    [choice] = json.loads(
        Path(client.download_artifacts(parent_id, contract.BENCH_CHOICES_FILE, str(tmp_path))).read_text()
    )
    finals = {r.data.params["selection.temperature"]: r.data.metrics["eval_val_accuracy"] for r in tried}
    assert str(choice["value"]) == max(finals, key=finals.get) and choice["metric"] == "eval_val_accuracy"
    runs = [r for r in trials if r.data.tags[contract.TAG_BENCH_STAGE] == contract.BENCH_STAGE_VERDICT]
    assert sorted(r.data.tags[contract.TAG_BENCH_METHOD] for r in runs) == ["attent", "full"]
    attent = next(r for r in runs if r.data.tags[contract.TAG_BENCH_METHOD] == "attent")
    assert float(attent.data.params["selection.temperature"]) == float(choice["value"])
    assert f"selection.temperature = {choice['value']} for attent" in report.read_text()
    for run in runs:
        m = run.data.metrics
        assert m[contract.TIME_STARTUP] >= m[contract.TIME_SETUP] > 0 and m[contract.TIME_TEARDOWN] > 0
        assert m[contract.TIME_WORKER_START] > 0
        checkpoints = list(Path(run.data.tags[contract.TAG_RUN_KEY]).glob("checkpoint_20*"))
        assert len(checkpoints) == 1  # epochs 1 and 2 reported without one
        # named by what tells it apart (the experiment names the benchmark); its log beside its metrics
        method = run.data.tags[contract.TAG_BENCH_METHOD]
        assert run.info.run_name == f"{method} s0 digits"
        assert [a.path for a in client.list_artifacts(run.info.run_id, "logs")] == ["logs/attent.log"]
        # a plain line per epoch (the output is no terminal), Ray's and the libraries' output in the log
        assert f"{method} s0 digits epoch 3/3: loss " in first.stdout + first.stderr
    assert "TrainController" not in first.stdout + first.stderr and "[attent]" not in first.stdout + first.stderr
    parent = {r.data.tags[contract.TAG_PARENT_RUN_ID] for r in runs}.pop()
    assert client.get_run(parent).data.tags[contract.TAG_ROLE] == contract.ROLE_BENCHMARK
    assert any(a.path.endswith("figures") for a in client.list_artifacts(parent, "report"))
    # the same command again, here in this process (as the command's ``main``)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert attent_main(command[3:]) == 0 and capsys.readouterr().out.count("finished earlier, kept") == 4
