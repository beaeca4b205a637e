"""The time-to-accuracy report on a synthetic benchmark logged to a real MLflow SQLite store: the
plateau check, the target, matched and unmatched budgets, paired verdicts, temperatures, CSVs
and figures. No Ray: runs are logged the way the engine and ``attent bench`` log them."""
from __future__ import annotations

import math
import warnings

import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from analysis.time_to_accuracy import STILL_IMPROVING, analyse, build_time_to_accuracy_report
from attent import contract

N = 1000           # training samples
METRIC = "eval_test_accuracy"
FULL_CURVE = [0.50, 0.65, 0.75, 0.80, 0.84, 0.86, 0.862, 0.861]   # plateaus over its last quarter
ATTENT_CURVE = [0.55, 0.70, 0.80, 0.85, 0.86, 0.865, 0.866, 0.866]
SEED_OFFSETS = (0.0, 0.004, -0.004)                                 # full data's final: std 0.004


def method_specs(seed: int) -> dict[str, dict]:
    """method -> epochs, per-epoch accuracies, seconds per epoch, selected ratio, hardness, temperature."""
    shift = SEED_OFFSETS[seed]
    noisy = (0.01, -0.012, 0.004)[seed]  # random's seed noise: dominates its 0.0007 mean difference
    return {
        "full": dict(epochs=8, curve=[v + shift for v in FULL_CURVE], seconds=10.0, ratio=1.0, hardness=None),
        # AtteNT's mean ratio 0.5 x 8 epochs: 4 epochs of full data; ends far below AtteNT
        contract.METHOD_FULL_EQUAL_COST: dict(epochs=4, curve=[v + shift for v in FULL_CURVE[:4]], seconds=10.0,
                                              ratio=1.0, hardness=None),
        "attent": dict(epochs=8, curve=[v + shift for v in ATTENT_CURVE], seconds=5.5, ratio=0.5, hardness=0.9,
                       temperature=0.5),
        "random": dict(epochs=8, curve=[v + shift + noisy for v in ATTENT_CURVE], seconds=5.0, ratio=0.5,
                       hardness=0.0),
        "infobatch": dict(epochs=8, curve=[v + shift for v in ATTENT_CURVE], seconds=7.0, ratio=0.7, hardness=None),
        "soft+T0.1": dict(epochs=8, curve=[v + shift - 0.003 for v in ATTENT_CURVE], seconds=5.5, ratio=0.5,
                          hardness=0.8, temperature=0.1),
        # reaches the target (0.8565) in seed 0 only
        "soft+T1": dict(epochs=8, curve=[v - 0.009 + (0.0 if seed == 0 else -0.01) for v in ATTENT_CURVE],
                        seconds=5.5, ratio=0.5, hardness=0.3, temperature=1.0),
    }


def log_run(client: MlflowClient, experiment_id: str, parent: str, workload: str, method: str, seed: int,
            spec: dict, start_time: int | None = None) -> str:
    """One benchmark child run as the engine logs it: per-epoch rows at step = epoch (0-based),
    end-of-run metrics at step = epochs, the flattened config as params (many of them)."""
    tags = {contract.TAG_ROLE: contract.ROLE_TRIAL, contract.TAG_PARENT_RUN_ID: parent,
            contract.TAG_BENCH_WORKLOAD: workload, contract.TAG_BENCH_METHOD: method,
            contract.TAG_BENCH_METRIC: METRIC, contract.TAG_LABEL: method}
    run_id = client.create_run(experiment_id, tags=tags, start_time=start_time).info.run_id
    epochs, ratio = spec["epochs"], spec["ratio"]
    metrics, cost, samples = [], 0.0, 0
    for step, accuracy in enumerate(spec["curve"]):
        cost += spec["seconds"] + 0.1 * seed
        samples += int(ratio * N)
        row = {"epoch": step + 1, METRIC: accuracy, contract.TIME_METHOD: cost, contract.SELECTED_RATIO: ratio,
               contract.SAMPLES_BACKPROPAGATED: samples, contract.TRAIN_LOSS: 1 - accuracy,
               **{contract.time_metric(part): 0.1 for part in contract.TIME_PARTS}}
        if spec["hardness"] is not None:
            row |= {contract.SELECTION_HARDNESS: spec["hardness"], contract.SELECTION_OVERLAP: 0.7}
        metrics += [Metric(k, float(v), 0, step) for k, v in row.items()]
    finals = {METRIC: spec["curve"][-1], contract.TIME_METHOD: cost, contract.SAMPLES_BACKPROPAGATED: samples,
              contract.SAMPLE_SAVING: 1 - samples / (N * epochs), contract.MEAN_SELECTED_RATIO: ratio,
              contract.TIME_WALLCLOCK: cost + 20, contract.TIME_STARTUP: 15.0, contract.TIME_TEARDOWN: 2.0,
              contract.time_metric("scoring"): 0.4 * epochs if spec["hardness"] is not None else 0.0}
    metrics += [Metric(k, float(v), 0, epochs) for k, v in finals.items()]
    params = {contract.PARAM_SEED: seed, "train.epochs": epochs,
              "selection.temperature": spec.get("temperature", 1.0),
              **{f"config.field{i}": i for i in range(120)}}  # the engine's wide config: >100 columns
    params = [Param(k, str(v)) for k, v in params.items()]
    client.log_batch(run_id, metrics=metrics[:900])
    client.log_batch(run_id, metrics=metrics[900:])
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i:i + 100])
    client.set_terminated(run_id)
    return run_id


def log_benchmark(uri: str, name: str, specs, seeds=(0, 1, 2), workload: str = "vit") -> str:
    """A decoy older benchmark parent, then the real one and its children; returns the real one."""
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(name)
    client.create_run(experiment_id, tags={contract.TAG_ROLE: contract.ROLE_BENCHMARK})
    parent = client.create_run(experiment_id, tags={contract.TAG_ROLE: contract.ROLE_BENCHMARK}).info.run_id
    for seed in seeds:
        for method, spec in specs(seed).items():
            log_run(client, experiment_id, parent, workload, method, seed, spec)
    return parent


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("tta")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    parent = log_benchmark(uri, "tta-synthetic", method_specs)

    def rising(seed: int) -> dict[str, dict]:  # full data gains 0.05 an epoch to the end
        shift = SEED_OFFSETS[seed] / 2
        return {"full": dict(epochs=8, curve=[0.5 + 0.05 * e + shift for e in range(8)], seconds=10.0, ratio=1.0,
                             hardness=None),
                "attent": dict(epochs=8, curve=[0.5 + 0.04 * e + shift for e in range(8)], seconds=5.0, ratio=0.5,
                               hardness=1.0)}
    log_benchmark(uri, "tta-rising", rising)

    def one_seed(seed: int) -> dict[str, dict]:
        return {m: s for m, s in method_specs(seed).items() if m in ("full", "attent", "random")}
    one = log_benchmark(uri, "tta-one-seed", one_seed, seeds=(0,))
    stale = dict(one_seed(0)["random"], curve=[0.1] * 8)  # an older finished run of the same seed: left out
    client = MlflowClient(uri)
    log_run(client, client.get_experiment_by_name("tta-one-seed").experiment_id, one, "vit", "random", 0, stale,
            start_time=1)
    return {"uri": uri, "root": root, "parent": parent}


@pytest.fixture(scope="module")
def report(store):
    """The report of the synthetic benchmark, built with pandas' PerformanceWarning (and
    FutureWarning, and every warning of pandas, matplotlib and scipy) as errors."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        warnings.simplefilter("error", FutureWarning)
        out = build_time_to_accuracy_report("tta-synthetic", tracking_uri=store["uri"], out_dir=store["root"] / "report")
        results, _ = analyse(MlflowClient(store["uri"]), "tta-synthetic")
    ours = [w for w in caught if any(lib in (w.filename or "") for lib in ("pandas", "matplotlib", "scipy", "analysis"))]
    assert not ours, [f"{w.category.__name__}: {w.message} ({w.filename})" for w in ours]
    [result] = results
    return {"out": out, "text": (out / "time_to_accuracy.md").read_text(), "result": result}


def test_plateau_and_target(report):
    """Full data moves +0.001 over its last quarter (epoch 6 to 8) against a seed std of 0.004:
    plateaued. Target: its plateau 0.8615 less max(0.005, 0.004)."""
    result, text = report["result"], report["text"]
    assert result.plateau.reached is True and result.plateau.epochs == (7, 8) and result.plateau.since == 6
    assert result.plateau.movement == pytest.approx(0.001)
    assert result.plateau.seed_std == pytest.approx(0.004)
    assert result.plateau.value == pytest.approx(0.8615)
    assert result.target.tolerance == pytest.approx(0.005) and result.target.value == pytest.approx(0.8565)
    assert "Full data had plateaued" in text and STILL_IMPROVING not in text.lower()
    assert "≥ 0.8565" in text and "the larger of 0.005 absolute and the seed std" in text


def test_the_terminal_shows_the_verdict_and_a_table_that_fits(report):
    """What `attent bench` / `attent demo` print: the verdict sentences and one table row per
    method, every line within the terminal's width (the Markdown file keeps every column)."""
    from analysis.time_to_accuracy import terminal
    result = report["result"]
    text = terminal(result, width=100)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100, "\n".join(lines)
    assert any(line.startswith("- ") and "AtteNT" in line for line in lines)  # the verdict
    methods = list(result.summary["method"])
    assert all(any(line.split()[:1] == [m] for line in lines) for m in methods)  # one row per method
    assert "|" not in text  # no Markdown pipes in the terminal


def test_still_improving_is_said_plainly(store):
    [result], _ = analyse(MlflowClient(store["uri"]), "tta-rising")
    assert result.plateau.reached is False and result.plateau.movement == pytest.approx(0.1)
    out = build_time_to_accuracy_report("tta-rising", tracking_uri=store["uri"], out_dir=store["root"] / "rising")
    assert STILL_IMPROVING in (out / "time_to_accuracy.md").read_text().lower()


def test_budgets_matched_and_apart(report):
    """AtteNT, full data at equal cost, random and the soft temperatures back-propagate half of
    full data's samples: matched. InfoBatch back-propagates 70 %: apart, labelled, not ranked."""
    result, text = report["result"], report["text"]
    by = result.summary.set_index("method")
    assert by.loc["full", "standing"] == "reference"
    assert set(by.index[by["standing"].eq("matched")]) == {"attent", "full_equal_cost", "random", "soft+T0.1", "soft+T1"}
    assert list(by.index[by["standing"].eq("apart")]) == ["infobatch"]
    assert list(result.summary["method"])[-1] == "infobatch"  # apart rows come last
    assert by.loc["attent", "budget"] == pytest.approx(0.5) and by.loc["infobatch", "budget"] == pytest.approx(0.7)
    assert by.loc["attent", "ideal_saving"] == pytest.approx(0.5)
    assert by.loc["attent", "realized_saving"] == pytest.approx(1 - 44.8 / 80.8, abs=0.01)
    assert by.loc["attent", "hardness"] == pytest.approx(0.9) and math.isnan(by.loc["full", "hardness"])
    assert by.loc["attent", "reached"] == 3 and by.loc["soft+T1", "reached"] == 1
    assert by.loc["full_equal_cost", "reached"] == 0
    assert "| infobatch | infobatch | apart (budget 70.0%) |" in text
    assert "infobatch trained on another budget (70.0% of full data's samples, AtteNT 50.0%): shown apart, not ranked." in text
    ranking = next(line for line in text.splitlines() if "At AtteNT's budget, final" in line)
    assert "infobatch" not in ranking and ranking.index("attent") < ranking.index("full_equal_cost")


def test_paired_verdicts(report):
    """Full data at equal cost ends ~0.07 below AtteNT in every seed: AtteNT better. Random differs
    by 0.0007 on average with seed noise of ±0.01: indistinguishable. InfoBatch: not judged."""
    paired = {(p.method, p.quantity): p for p in report["result"].paired}
    equal_cost = paired["full_equal_cost", "final metric"]
    assert equal_cost.seeds == 3 and equal_cost.low > 0 and equal_cost.verdict == "AtteNT better"
    noisy = paired["random", "final metric"]
    assert noisy.seeds == 3 and noisy.low < 0 < noisy.high and noisy.verdict == "indistinguishable at 95 %"
    assert paired["infobatch", "final metric"].verdict.startswith("not judged: budget 70.0%")
    cost = paired["full", "cost to target (s)"]  # AtteNT reaches the target sooner than full data
    assert cost.seeds == 3 and cost.high < 0 and cost.verdict == "AtteNT better"
    assert paired["soft+T1", "cost to target (s)"].verdict.startswith("no interval: 1 paired seed")
    assert "| full_equal_cost | matched | final metric | 3 |" in report["text"]


def test_temperatures_and_std_only_from_two_seeds(report):
    temperatures = report["result"].temperatures
    assert list(temperatures["method"]) == ["soft+T0.1", "attent", "soft+T1"]
    assert list(temperatures["temperature"]) == [0.1, 0.5, 1.0]
    assert list(temperatures["hardness"]) == pytest.approx([0.8, 0.9, 0.3])
    text = report["text"]
    assert "| soft+T0.1 | 0.1 | 0.80 ± 0.00 |" in text
    soft_t1 = next(line for line in text.splitlines() if line.startswith("| soft+T1 | soft+T1 |"))
    reach = soft_t1.split("|")[6]
    assert "(1/3 seeds; rest not reached)" in reach and "±" not in reach  # one seed reached: no std


def test_one_seed_shows_no_std_and_no_interval(store):
    out = build_time_to_accuracy_report("tta-one-seed", tracking_uri=store["uri"], out_dir=store["root"] / "one")
    text = (out / "time_to_accuracy.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows and not any("±" in line for line in rows)
    assert "one seed, so no seed spread to judge a plateau by" in text
    assert "no interval: 1 paired seed" in text
    assert "1 older finished run(s) of the same method and seed left out" in text
    summary = pd.read_csv(out / "summary.csv").set_index("method")
    assert summary.loc["random", "seeds"] == 1 and summary.loc["random", "final_metric"] == pytest.approx(0.876)
    paired = pd.read_csv(out / "paired.csv")
    assert paired["low_95"].isna().all()


def test_csvs_figures_and_artifacts(report, store):
    out = report["out"]
    columns = {name: set(pd.read_csv(out / f"{name}.csv").columns) for name in ("per_run", "summary", "paired", "curves")}
    assert {"workload", "method", "seed", "epoch", "metric", "value", "method_cost_s", "selected_ratio",
            "hardness"} <= columns["curves"]
    assert {"workload", "method", "seed", "final_metric", "cost_to_target_s", "method_cost_s", "ideal_saving",
            "realized_saving", "budget", "hardness", "target"} <= columns["per_run"]
    assert {"workload", "method", "standing", "seeds", "reached", "final_metric", "final_metric_std",
            "cost_to_target_s", "budget", "hardness", "target", "tolerance", "plateaued"} <= columns["summary"]
    assert {"workload", "method", "quantity", "paired_seeds", "attent_minus_method", "low_95", "high_95",
            "verdict"} <= columns["paired"]
    curves = pd.read_csv(out / "curves.csv")
    assert len(curves) == 3 * (6 * 8 + 4)  # per-epoch rows only: the end-of-run step is not an epoch
    assert curves["epoch"].min() == 1 and curves.loc[curves["method"].eq("full"), "hardness"].isna().all()
    assert len(pd.read_csv(out / "per_run.csv")) == 21
    assert {p.name for p in (out / "figures").glob("*.png")} == {"vit_curves.png", "vit_final_vs_cost.png",
                                                                 "vit_hardness.png"}
    client = MlflowClient(store["uri"])
    logged = {a.path for a in client.list_artifacts(store["parent"], "report")}
    assert {"report/time_to_accuracy.md", "report/summary.csv", "report/curves.csv", "report/figures"} <= logged
    assert client.get_run(store["parent"]).info.status == "FINISHED"


def test_lower_is_better_target_and_time_to_target():
    """A loss: the target is full data's plateau plus the larger of 1 % of it and the seed std;
    the cost to it is read where the curve first falls to it."""
    from analysis.tta_results import plateau_of, target_of, time_to_target
    curves = pd.DataFrame({"run_id": ["a"] * 4 + ["b"] * 4, "epoch": [1, 2, 3, 4] * 2,
                           "value": [3.0, 2.0, 1.01, 1.0, 3.1, 2.1, 1.03, 1.02]})
    plateau = plateau_of(curves, lower=True)  # falls by 0.01 over its last epoch; seed std 0.0141
    assert plateau.epochs == (4, 4) and plateau.since == 3 and plateau.movement == pytest.approx(0.01)
    assert plateau.reached is True and plateau.value == pytest.approx(1.01)
    assert plateau.seed_std == pytest.approx(0.02 / math.sqrt(2))
    target = target_of(plateau, lower=True)  # the seed std beats 1 % of 1.01
    assert target.tolerance == pytest.approx(0.02 / math.sqrt(2)) and target.value == pytest.approx(1.01 + target.tolerance)
    assert "the larger of 1% of the plateau, 0.0101 and the seed std" in target.rule
    assert target_of(plateau, lower=True, tolerance=0.05).value == pytest.approx(1.06)
    curve = pd.DataFrame({"method_cost_s": [1.0, 2.0, 3.0, 4.0], "value": [3.0, float("nan"), 1.005, 0.9]})
    assert time_to_target(curve, target.value, lower=True) == 3.0
    assert math.isnan(time_to_target(curve, 0.5, lower=True))


def test_variants_are_paired_against_full_data_equal_cost_and_their_method(tmp_path):
    """A variant that ends as AtteNT does (0.866 +- 0.002): indistinguishable from AtteNT, better
    than full data (0.862) and than full data at equal cost (0.80); its scoring share and
    agreement shown."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def specs(seed: int) -> dict[str, dict]:
        base = method_specs(seed)
        wobble = (0.002, -0.001, -0.001)[seed]  # AtteNT +- a little: no significant difference
        return {m: base[m] for m in ("full", contract.METHOD_FULL_EQUAL_COST, "attent")} | {
            "attent+stale": dict(base["attent"], curve=[v + wobble for v in base["attent"]["curve"]], seconds=5.1)}
    log_benchmark(uri, "tta-variants", specs)
    client = MlflowClient(uri)
    for run in client.search_runs([client.get_experiment_by_name("tta-variants").experiment_id]):
        if run.data.tags.get(contract.TAG_BENCH_METHOD, "").startswith("attent"):
            client.log_metric(run.info.run_id, contract.SCORE_AGREEMENT, 0.8, step=3)
    [result], _ = analyse(client, "tta-variants")
    variant, = result.variants.to_dict("records")
    assert variant["method"] == "attent+stale"
    assert variant["vs_full_verdict"] == "better"
    assert variant["vs_full_equal_cost_verdict"] == "better"
    assert variant["vs_base_verdict"] == "indistinguishable" and variant["vs_base_n"] == 3
    assert variant["agreement"] == pytest.approx(0.8)
    assert 0 < variant["scoring_share"] < 1
    text = build_time_to_accuracy_report("tta-variants", tracking_uri=uri, out_dir=tmp_path / "r").joinpath(
        "time_to_accuracy.md").read_text()
    assert "| attent+stale |" in text and "indistinguishable" in text
