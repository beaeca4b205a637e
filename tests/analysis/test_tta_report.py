"""The time-to-accuracy report on a synthetic benchmark logged to a real MLflow SQLite store: the
plateau control, the target, sustained time to target, matched and unmatched budgets, the
Holm-adjusted verdicts, the selection stage's runs left out and its choices listed, temperatures,
CSVs and figures (variants: test_tta_variants.py). No Ray: runs are logged the way the engine and
``attent bench`` log them."""

from __future__ import annotations

import math
import warnings

import pandas as pd
import pytest
from attent import contract
from attent.analysis.time_to_accuracy.judge import analyse
from attent.analysis.time_to_accuracy.report import build_time_to_accuracy_report
from attent.analysis.time_to_accuracy.verdict import STILL_IMPROVING
from mlflow import MlflowClient
from scipy import stats

from tests.helpers.tta_benchmark import CHOICES, SEED_OFFSETS, log_benchmark, log_run, log_selection_stage, method_specs


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("tta")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    parent = log_benchmark(uri, "tta-synthetic", method_specs)
    selection = log_selection_stage(uri, "tta-synthetic", parent)

    def rising(seed: int) -> dict[str, dict]:  # 2E epochs end 3 points above E's, a little noise
        shift = SEED_OFFSETS[seed] / 2
        return {
            "full": dict(
                epochs=8, curve=[0.5 + 0.05 * e + shift for e in range(8)], seconds=10.0, ratio=1.0, hardness=None
            ),
            contract.METHOD_FULL_LONG: dict(
                epochs=16,
                curve=[0.5 + 0.05 * e + shift for e in range(8)]
                + [0.85 + 0.03 * e / 8 + shift + (0.002, -0.001, 0.0)[seed] for e in range(1, 9)],
                seconds=10.0,
                ratio=1.0,
                hardness=None,
            ),
            "attent": dict(
                epochs=8, curve=[0.5 + 0.04 * e + shift for e in range(8)], seconds=5.0, ratio=0.5, hardness=1.0
            ),
        }

    log_benchmark(uri, "tta-rising", rising)

    def one_seed(seed: int) -> dict[str, dict]:
        return {m: s for m, s in method_specs(seed).items() if m in ("full", "attent", "random")}

    one = log_benchmark(uri, "tta-one-seed", one_seed, seeds=(0,), stage=None)  # an older benchmark: no stage tags
    stale = dict(one_seed(0)["random"], curve=[0.1] * 8)  # an older finished run of the same seed: left out
    client = MlflowClient(uri)
    log_run(
        client,
        client.get_experiment_by_name("tta-one-seed").experiment_id,
        one,
        "vit",
        "random",
        0,
        stale,
        start_time=1,
        stage=None,
    )
    return {"uri": uri, "root": root, "parent": parent, "selection": selection}


@pytest.fixture(scope="module")
def report(store):
    """The report of the synthetic benchmark, built with pandas' PerformanceWarning (and
    FutureWarning, and every warning of pandas, matplotlib, scipy and statsmodels) as errors."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        warnings.simplefilter("error", FutureWarning)
        out = build_time_to_accuracy_report(
            "tta-synthetic", tracking_uri=store["uri"], out_dir=store["root"] / "report"
        )
        results, _ = analyse(MlflowClient(store["uri"]), "tta-synthetic")
    ours = [
        w
        for w in caught
        if any(lib in (w.filename or "") for lib in ("pandas", "matplotlib", "scipy", "statsmodels", "analysis"))
    ]
    assert not ours, [f"{w.category.__name__}: {w.message} ({w.filename})" for w in ours]
    [result] = results
    return {"out": out, "text": (out / "time_to_accuracy.md").read_text(), "result": result}


def test_plateau_control_and_target(report):
    """full_long (16 epochs, flat after 8) minus full data, per seed: +0.001, -0.002, +0.0015; its
    90 % interval [-0.0030, +0.0034] lies below the tolerance 0.005: plateaued. Target: full data's
    final 0.861 (mean over seeds) less max(0.005, its seed std 0.0045)."""
    result, text = report["result"], report["text"]
    plateau = result.plateau
    assert plateau.control and plateau.seeds == 3 and plateau.verdict == "plateaued" and plateau.reached is True
    assert plateau.mean == pytest.approx(0.0005 / 3)
    expected = stats.ttest_1samp([0.001, -0.002, 0.0015], 0.0).confidence_interval(0.90)
    assert (plateau.low, plateau.high) == pytest.approx((expected.low, expected.high), abs=1e-9)
    assert plateau.high < plateau.tolerance == pytest.approx(0.005)
    assert result.target.reference == pytest.approx(0.861) and result.target.seed_std == pytest.approx(0.0045)
    assert result.target.tolerance == pytest.approx(0.005) and result.target.value == pytest.approx(0.856)
    assert "90% paired interval [-0.0030, +0.0034] over 3 seeds, against the tolerance 0.0050: plateaued" in text
    assert STILL_IMPROVING not in text.lower()
    assert "≥ 0.8560" in text and "the larger of 0.005 absolute and the seed std" in text


def test_the_plateau_control_calls_a_rising_curve_still_improving(store):
    """full_long ends 3 points above full data in every seed (+0.032, +0.029, +0.030): its
    interval lies above the tolerance: still improving, said plainly."""
    [result], _ = analyse(MlflowClient(store["uri"]), "tta-rising")
    assert result.plateau.verdict == "still improving" and result.plateau.reached is False
    assert result.plateau.low > result.plateau.tolerance and result.plateau.mean == pytest.approx(0.0303, abs=1e-4)
    out = build_time_to_accuracy_report("tta-rising", tracking_uri=store["uri"], out_dir=store["root"] / "rising")
    text = (out / "time_to_accuracy.md").read_text()
    assert STILL_IMPROVING in text.lower() and "**still improving**" in text


def test_the_terminal_shows_the_verdict_and_a_table_that_fits(report):
    """What `attent bench` / `attent demo` print: the verdict sentences and one table row per
    method with its optimiser steps, every line within the terminal's width (the Markdown file
    keeps every column)."""
    from attent.analysis.time_to_accuracy.workload_tables import terminal

    result = report["result"]
    text = terminal(result, width=100)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100, "\n".join(lines)
    assert any(line.startswith("- ") and "AtteNT" in line for line in lines)  # the verdict
    methods = list(result.summary["method"])
    assert all(any(line.split()[:1] == [m] for line in lines) for m in methods)  # one row per method
    assert "steps" in text and next(line for line in lines if line.startswith("full_long ")).split()[9] == "160"
    assert "|" not in text  # no Markdown pipes in the terminal
    assert "better" in text and "inconclusive" in text
    for stronger in ("no better than", "meets the goal", "indistinguishable", "best first", "cheapest first"):
        assert stronger not in text and stronger not in report["text"]


def test_budgets_matched_and_apart(report):
    """AtteNT, random, the soft temperatures and full data at equal samples back-propagate half
    of full data's samples: matched; full data at equal cost (62.5 %) is matched by construction;
    full_long is the plateau control. InfoBatch back-propagates 70 %: apart, labelled, not judged."""
    result, text = report["result"], report["text"]
    by = result.summary.set_index("method")
    assert by.loc["full", "budget_match"] == "reference" and by.loc["full_long", "budget_match"] == "control"
    assert set(by.index[by["budget_match"].eq("matched")]) == {
        "attent",
        "full_equal_cost",
        "full_equal_samples",
        "random",
        "soft+T0.1",
        "soft+T1",
    }
    assert list(by.index[by["budget_match"].eq("apart")]) == ["infobatch"]
    assert list(result.summary["method"])[:2] == ["full", "full_long"]
    assert list(result.summary["method"])[-1] == "infobatch"  # apart rows come last
    assert by.loc["attent", "budget"] == pytest.approx(0.5) and by.loc["infobatch", "budget"] == pytest.approx(0.7)
    assert by.loc["attent", "ideal_saving"] == pytest.approx(0.5)
    assert by.loc["attent", "realized_saving"] == pytest.approx(1 - 44.8 / 80.8, abs=0.01)
    assert by.loc["attent", "hardness"] == pytest.approx(0.9) and math.isnan(by.loc["full", "hardness"])
    assert by.loc["attent", "optimizer_steps"] == 40 and by.loc["full", "optimizer_steps"] == 80
    assert by.loc["attent", "reached"] == 3 and by.loc["full_equal_samples", "reached"] == 0
    assert "| infobatch | infobatch | apart (budget 70.0%) |" in text
    assert "| full_equal_cost | full data at equal cost (measured) | matched |" in text
    assert "| full_equal_samples | full data at equal samples | matched |" in text
    assert (
        "infobatch trained on another budget (70.0% of full data's samples, AtteNT 50.0%): shown apart, not judged."
        in text
    )
    order = next(line for line in text.splitlines() if "At AtteNT's budget, mean final" in line)
    assert "infobatch" not in order and "full_long" not in order


def test_savings_have_intervals_over_seeds(report):
    """Realized saving and realized / ideal per seed, then a 95 % t-interval over the seeds."""
    result = report["result"]
    attent = result.per_run[result.per_run["method"].eq("attent")]
    row = result.summary.set_index("method").loc["attent"]
    for column in ("realized_saving", "realized_over_ideal"):
        expected = stats.ttest_1samp(attent[column], 0.0).confidence_interval(0.95)
        assert row[column] == pytest.approx(attent[column].mean())
        assert (row[f"{column}_low"], row[f"{column}_high"]) == pytest.approx((expected.low, expected.high))
    assert "| 44.6% [43.5%, 45.7%] | 0.89 [0.87, 0.91] |" in report["text"]


def test_sustained_time_to_target_ignores_a_crossing_that_falls_back(report):
    """soft+T1's seed 2 is past the target (0.856) at epochs 5 and 6, then back at 0.8475: not
    reached. Seed 0 stays past it from epoch 6 (6 x 5.5 s of method cost)."""
    from attent.analysis.time_to_accuracy.results import time_to_target

    runs = report["result"].per_run.set_index(["method", "seed"])
    assert math.isnan(runs.loc[("soft+T1", 2), "cost_to_target_s"]) and not runs.loc[("soft+T1", 2), "reached"]
    assert runs.loc[("soft+T1", 0), "cost_to_target_s"] == pytest.approx(33.0)
    assert report["result"].summary.set_index("method").loc["soft+T1", "reached"] == 1
    curve = pd.DataFrame({"cost": [1.0, 2.0, 3.0, 4.0, 5.0], "value": [0.5, 0.9, 0.7, 0.88, 0.91]})
    assert time_to_target(curve, 0.85, lower=False) == 4.0  # not 2.0: it fell back at 3.0
    assert math.isnan(time_to_target(curve.iloc[:3], 0.85, lower=False))  # ends below
    gap = pd.DataFrame({"cost": [1.0, 2.0, 3.0], "value": [0.9, float("nan"), 0.95]})
    assert time_to_target(gap, 0.85, lower=False) == 1.0  # epochs without an evaluation break nothing


def test_paired_verdicts(report):
    """The final-metric family: AtteNT against full data, full data at equal cost and at equal
    samples, the two soft temperatures and random (m = 6; infobatch is apart, full_long is the
    control). Equal cost (-0.026) and equal samples (-0.066) end below AtteNT in every seed:
    better; random differs by 0.0007 with seed noise of ±0.01: inconclusive. The cost family:
    AtteNT stays past the target ~34 s sooner than full data: better."""
    result = report["result"]
    paired = {(p.method, p.quantity): p for p in result.paired}
    assert ("full_long", "final metric") not in paired
    finals = [p for p in result.paired if p.quantity == "final metric" and p.judged]
    assert {p.method for p in finals} == {
        "full",
        "full_equal_cost",
        "full_equal_samples",
        "soft+T0.1",
        "soft+T1",
        "random",
    }
    # Holm's steps: the r rejected at 1 - 0.05 / 6, 1 - 0.05 / 5, ...; the rest at the stopping step's
    rejected = sum(p.p_holm < 0.05 for p in finals)
    assert 0 < rejected < 6
    expected = [1 - 0.05 / (6 - k) for k in range(rejected)] + [1 - 0.05 / (6 - rejected)] * (6 - rejected)
    assert sorted(p.level for p in finals) == pytest.approx(sorted(expected))
    assert paired["full_equal_cost", "final metric"].verdict == "better"
    equal_samples = paired["full_equal_samples", "final metric"]
    assert equal_samples.seeds == 3 and equal_samples.low > 0 and equal_samples.verdict == "better"
    noisy = paired["random", "final metric"]
    assert noisy.seeds == 3 and noisy.low < 0 < noisy.high and noisy.verdict == "inconclusive"
    assert paired["infobatch", "final metric"].verdict.startswith("not judged: budget 70.0%")
    cost = paired["full", "cost to target (s)"]  # AtteNT reaches the target sooner than full data
    assert cost.seeds == 3 and cost.high < 0 and cost.verdict == "better"
    assert paired["soft+T1", "cost to target (s)"].verdict.startswith("no interval: 1 paired seed")
    text = report["text"]
    assert "| full_equal_samples | matched | final metric | 3 | +0.0660 |" in text
    assert (
        "AtteNT against full data at equal samples, final metric: better (difference +0.0660, 99.17% Holm-step "
        "interval [+0.0629, +0.0691]"
    ) in text
    assert "Final metric, inconclusive: AtteNT against full data, soft+T0.1, soft+T1, random." in text
    assert "Holm across its 6 comparisons of the final metric" in text


def test_selection_stage_runs_are_left_out_and_their_choices_listed(report, store):
    """The selection stage's AtteNT run at seed 0 is the newest of its method and seed and ends
    at 0.50: read, it would make AtteNT worse than every comparator. It is not read, nor is its
    temperature candidate; the choices on the parent run are listed."""
    result, text = report["result"], report["text"]
    assert not set(store["selection"]) & set(result.per_run["run_id"])
    assert "attent+temperature=1" not in set(result.summary["method"])
    assert result.summary.set_index("method").loc["attent", "final_metric"] == pytest.approx(0.866)
    assert result.selection_runs == 2 and "2 selection-stage run(s) left out" in text
    assert {p.verdict for p in result.paired if p.method == "full_equal_samples"} == {
        "better",
        "no paired seeds; reached the target: AtteNT 3/3, full_equal_samples 0/3",
    }
    assert result.choices == CHOICES
    assert (
        "selection.temperature = 0.5 for attent, by the mean final eval_val_accuracy over the selection runs, "
        "seeds [0] (per value: 0.1: 0.6100, 0.5: 0.6400, 1: 0.6200)."
    ) in text


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
    """An older benchmark (no stage tags, no choices, no full_long): its runs count as verdict
    runs; one seed gives no std, no interval, no plateau verdict."""
    out = build_time_to_accuracy_report("tta-one-seed", tracking_uri=store["uri"], out_dir=store["root"] / "one")
    text = (out / "time_to_accuracy.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows and not any("±" in line for line in rows)
    assert "Plateau: undetermined: no full_long control" in text
    assert "No choices recorded on the parent run" in text
    assert "no interval: 1 paired seed" in text
    assert "1 older finished run(s) of the same method and seed left out" in text
    summary = pd.read_csv(out / "summary.csv").set_index("method")
    assert summary.loc["random", "seeds"] == 1 and summary.loc["random", "final_metric"] == pytest.approx(0.876)
    paired = pd.read_csv(out / "paired.csv")
    assert paired["low_95"].isna().all() and paired["holm_low"].isna().all()


# the columns each of the report's CSVs has at least
CURVES_COLUMNS = {
    "workload",
    "method",
    "seed",
    "epoch",
    "metric",
    "value",
    "method_cost_s",
    "selected_ratio",
    "hardness",
}
PER_RUN_COLUMNS = {
    "workload",
    "method",
    "seed",
    "final_metric",
    "cost_to_target_s",
    "method_cost_s",
    "ideal_saving",
    "realized_saving",
    "realized_over_ideal",
    "optimizer_steps",
    "budget",
    "hardness",
    "target",
}
SUMMARY_COLUMNS = {
    "workload",
    "method",
    "budget_match",
    "seeds",
    "reached",
    "final_metric",
    "final_metric_std",
    "cost_to_target_s",
    "budget",
    "hardness",
    "target",
    "tolerance",
    "margin",
    "plateau_verdict",
    "plateau_low_90",
    "plateau_high_90",
    "realized_saving_low",
    "realized_over_ideal_high",
    "optimizer_steps",
}
PAIRED_COLUMNS = {
    "workload",
    "family",
    "subject",
    "method",
    "quantity",
    "paired_seeds",
    "difference",
    "low_95",
    "high_95",
    "p",
    "p_holm",
    "holm_level",
    "holm_low",
    "holm_high",
    "margin",
    "p_tost",
    "p_tost_holm",
    "verdict",
}


def test_csvs_figures_and_artifacts(report, store):
    out = report["out"]
    columns = {
        name: set(pd.read_csv(out / f"{name}.csv").columns) for name in ("per_run", "summary", "paired", "curves")
    }
    assert CURVES_COLUMNS <= columns["curves"]
    assert PER_RUN_COLUMNS <= columns["per_run"]
    assert SUMMARY_COLUMNS <= columns["summary"]
    assert PAIRED_COLUMNS <= columns["paired"]
    curves = pd.read_csv(out / "curves.csv")
    assert len(curves) == 3 * (6 * 8 + 16 + 5 + 4)  # per-epoch rows only: the end-of-run step is not an epoch
    assert curves["epoch"].min() == 1 and curves.loc[curves["method"].eq("full"), "hardness"].isna().all()
    assert len(pd.read_csv(out / "per_run.csv")) == 27
    paired = pd.read_csv(out / "paired.csv")
    assert set(paired["family"]) == {"attent", "variants"}
    assert {"plateaued"} == set(pd.read_csv(out / "summary.csv")["plateau_verdict"])
    assert {p.name for p in (out / "figures").glob("*.png")} == {
        "vit_curves.png",
        "vit_final_vs_cost.png",
        "vit_hardness.png",
    }
    client = MlflowClient(store["uri"])
    logged = {a.path for a in client.list_artifacts(store["parent"], "report")}
    assert {"report/time_to_accuracy.md", "report/summary.csv", "report/curves.csv", "report/figures"} <= logged
    assert client.get_run(store["parent"]).info.status == "FINISHED"
