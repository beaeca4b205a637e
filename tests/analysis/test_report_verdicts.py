"""The paper tables' regime check and verdicts (analysis/paper_tables/verdicts.py): the plateau control, Holm, TOST, one seed."""

from __future__ import annotations

import csv
import io

import pytest
from attent import contract
from attent.analysis.paper_tables.report import build_report
from attent.analysis.paper_tables.table_files import to_csv, to_markdown
from attent.sweep.spec import load_sweep
from mlflow import MlflowClient
from scipy import stats
from statsmodels.stats.multitest import multipletests

from tests.helpers.paths import REPO
from tests.helpers.report_store import cost_metrics, log_run, new_experiment

# --- the regime check and the verdicts (paper_tables.verdicts) -----------------------------
FULL_30 = [0.90, 0.91, 0.92]  # full data's final accuracy per seed at E = 30 epochs; seed std 0.01


def log_seeds(
    client: MlflowClient,
    experiment_id: str,
    method: str,
    accuracies: list[float],
    epochs: int = 30,
    ratio: float = 0.5,
    strategy: str = "soft",
) -> None:
    """One finished run per seed (0, 1, ...) of ``method`` (AtteNT's: by ``strategy``) trained
    ``epochs`` epochs, as the shipped sweeps log them (``train.epochs`` and the seed among the params)."""
    budget = 1.0 if method == "full" else ratio
    attent = method == "attent"
    for seed, accuracy in enumerate(accuracies):
        log_run(
            client,
            experiment_id,
            {
                "selection.method": method,
                **({"selection.strategy": strategy} if attent else {}),
                contract.PARAM_EPOCHS: epochs,
                contract.PARAM_SEED: seed,
            },
            {**cost_metrics(100 * budget, 1000 * budget, accuracy), contract.MEAN_SELECTED_RATIO: budget},
            tags={contract.TAG_STRATEGY: strategy, contract.TAG_LABEL: strategy.capitalize()} if attent else None,
        )


def plus(values: list[float], deltas: list[float]) -> list[float]:
    return [v + d for v, d in zip(values, deltas)]


def with_without_report(known_sweep_store, tmp_path, name: str, control: list[float] | None):
    """Full data and AtteNT at 30 epochs over 3 seeds, and the 60-epoch control if given."""
    client, experiment_id = new_experiment(known_sweep_store, name)
    log_seeds(client, experiment_id, "full", FULL_30)
    log_seeds(client, experiment_id, "attent", plus(FULL_30, [-0.010, -0.011, -0.009]))
    if control is not None:
        log_seeds(client, experiment_id, "full", control, epochs=60)
    return build_report(name, tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False)


def test_a_control_three_points_higher_on_every_seed_reads_still_improving(known_sweep_store, tmp_path):
    """The 60-epoch full runs end +0.029, +0.030, +0.031 above the 30-epoch ones: the 90 % paired
    interval [+0.0283, +0.0317] lies above the tolerance max(0.005, seed std 0.01): still
    improving, and the table says it measures the budget. The control is no row of the table."""
    report = with_without_report(known_sweep_store, tmp_path, "regime-rising", plus(FULL_30, [0.029, 0.030, 0.031]))
    [table] = report.tables
    assert table.labels.values.tolist() == [["w/o AtteNT"], ["w/ AtteNT"]]  # no Config column: control left out
    assert table.stats["n"].tolist() == [3, 3] and report.runs == 9
    expected = stats.ttest_1samp([0.029, 0.030, 0.031], 0.0).confidence_interval(0.90)
    markdown = to_markdown(table)
    assert (
        f"Plateau: full data for 60 epochs minus for 30, final accuracy, signed so that positive is an "
        f"improvement: +0.0300, 90% paired interval [{expected.low:+.4f}, {expected.high:+.4f}] over 3 seeds, "
        "against the tolerance 0.0100 (the larger of 0.005 absolute and the seed std of full data's final "
        "value, 0.0100): still improving."
    ) in markdown
    assert expected.low > 0.01
    assert (
        "Full data was still improving at 30 epochs: this table measures the training budget, not the selection."
    ) in markdown


def test_a_flat_control_reads_plateaued(known_sweep_store, tmp_path):
    """Control − full per seed: +0.001, −0.001, 0: the interval's upper end (+0.0029) lies below the
    tolerance 0.01: plateaued."""
    report = with_without_report(known_sweep_store, tmp_path, "regime-flat", plus(FULL_30, [0.001, -0.001, 0.0]))
    markdown = to_markdown(report.tables[0])
    assert "over 3 seeds, against the tolerance 0.0100" in markdown and "): plateaued." in markdown
    assert "at 30 epochs the rows compare selection, not training budgets." in markdown
    assert "measures the training budget" not in markdown and "may measure" not in markdown


def test_verdicts_follow_holm_across_the_tables_comparisons(known_sweep_store, tmp_path):
    """Comparison table, 3 seeds: AtteNT, class weight and Random (AtteNT's Random strategy) at
    AtteNT's budget, and full data; 5 comparisons (each against full data, class weight and Random
    also against AtteNT), one Holm family. AtteNT − full (−0.026, −0.020, −0.014) is significant
    alone (p = 0.029) but not after Holm: inconclusive. Random − full (+0.001, −0.001, 0) passes the
    TOST within ± 0.01 after Holm: equivalent."""
    client, experiment_id = new_experiment(known_sweep_store, "regime-holm")
    attent, random = plus(FULL_30, [-0.026, -0.020, -0.014]), plus(FULL_30, [0.001, -0.001, 0.0])
    class_weight = plus(FULL_30, [0.002, -0.001, 0.0])
    log_seeds(client, experiment_id, "full", FULL_30)
    log_seeds(client, experiment_id, "attent", attent)
    log_seeds(client, experiment_id, "attent", random, strategy="random")
    log_seeds(client, experiment_id, "class_weight", class_weight)
    table = build_report(
        "regime-holm", tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False
    ).tables[0]
    assert table.name == "comparison"
    verdicts = dict(zip(table.labels["Method"], table.verdicts.to_dict("records")))
    assert verdicts["AtteNT"] == {"vs full data": "inconclusive (-0.0200)", "vs AtteNT": "reference"}
    assert verdicts["Random subset"] == {
        "vs full data": "equivalent within ± 0.01 (+0.0000)",
        "vs AtteNT": "inconclusive (+0.0200)",
    }
    assert verdicts["Full data"] == {"vs full data": "reference", "vs AtteNT": "—"}
    assert verdicts["GradNorm"] == {"vs full data": "—", "vs AtteNT": "—"}  # no run

    by = {(p.subject, p.method): p for p in table.comparisons}
    alone = stats.ttest_rel(attent, FULL_30).pvalue
    assert by["AtteNT", "Full data"].p == pytest.approx(alone) and alone < 0.05
    family = {
        ("AtteNT", "Full data"): (attent, FULL_30),
        ("Class weight", "Full data"): (class_weight, FULL_30),
        ("Class weight", "AtteNT"): (class_weight, attent),
        ("Random subset", "Full data"): (random, FULL_30),
        ("Random subset", "AtteNT"): (random, attent),
    }
    holm = multipletests([stats.ttest_rel(*pair).pvalue for pair in family.values()], alpha=0.05, method="holm")[1]
    assert set(by) == set(family)
    assert [by[k].p_holm for k in family] == pytest.approx(list(holm))
    assert holm[0] > 0.05
    markdown = to_markdown(table)
    assert "Holm-adjusted across the table's 5 comparisons at 0.05" in markdown
    assert "| accuracy 95% CI | vs full data | vs AtteNT |" in markdown.splitlines()[0]
    rows = {r["Method"]: r for r in csv.DictReader(io.StringIO(to_csv(table)))}
    interval = stats.ttest_1samp(FULL_30, 0.0).confidence_interval(0.95)
    assert (
        float(rows["Full data"]["eval_accuracy_low_95"]),
        float(rows["Full data"]["eval_accuracy_high_95"]),
    ) == pytest.approx((interval.low, interval.high))
    assert rows["AtteNT"]["vs full data"] == "inconclusive (-0.0200)"


def test_attents_random_strategy_is_the_comparisons_random_subset(known_sweep_store, tmp_path):
    """The comparison sweeps ask for Random as AtteNT's strategy (selection.strategy: random: tags
    method attent, strategy random). Beside other methods those runs are the Random subset row,
    with its verdicts (test above), and no ablation table of Soft against Random appears."""
    client, experiment_id = new_experiment(known_sweep_store, "random-strategy")
    finals = {
        ("full", "none"): FULL_30,
        ("attent", "soft"): plus(FULL_30, [-0.026, -0.020, -0.014]),
        ("attent", "random"): plus(FULL_30, [0.001, -0.001, 0.0]),
        ("class_weight", "none"): plus(FULL_30, [0.002, -0.001, 0.0]),
    }
    for (method, strategy), accuracies in finals.items():
        budget = 1.0 if method == "full" else 0.5
        for seed, accuracy in enumerate(accuracies):
            log_run(
                client,
                experiment_id,
                {
                    "selection.method": method,
                    "selection.strategy": strategy,
                    contract.PARAM_EPOCHS: 30,
                    contract.PARAM_SEED: seed,
                },
                {**cost_metrics(100 * budget, 1000 * budget, accuracy), contract.MEAN_SELECTED_RATIO: budget},
                tags={contract.TAG_STRATEGY: strategy, contract.TAG_LABEL: f"{strategy.capitalize()} · x"},
            )
    tables = build_report(
        "random-strategy", tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False
    ).tables
    assert [table.name for table in tables] == ["comparison"]
    table = tables[0]
    assert dict(zip(table.labels["Method"], table.stats["n"])) == {
        "AtteNT": 3,
        "Class weight": 3,
        "Group weight": 0,
        "GradNorm": 0,
        "InfoBatch": 0,
        "Random subset": 3,
        "Full data": 3,
    }
    verdicts = dict(zip(table.labels["Method"], table.verdicts.to_dict("records")))
    assert verdicts["Random subset"] == {
        "vs full data": "equivalent within ± 0.01 (+0.0000)",
        "vs AtteNT": "inconclusive (+0.0200)",
    }


def test_a_one_seed_table_gets_no_verdicts(known_sweep_store, tmp_path):
    """One seed per row and no control (the test suite's own small sweeps): no interval, no
    verdicts, and a plateau that nothing shows."""
    client, experiment_id = new_experiment(known_sweep_store, "regime-one-seed")
    log_seeds(client, experiment_id, "full", [0.90], epochs=2)
    log_seeds(client, experiment_id, "attent", [0.88], epochs=2)
    report = build_report("regime-one-seed", tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False)
    [table] = report.tables
    assert table.verdicts["vs full data"].tolist() == ["reference", "one seed: not judged"]
    assert not any(p.judged for p in table.comparisons)
    markdown = to_markdown(table)
    assert "| **0.9000** | — | reference |" in markdown
    assert (
        "Plateau: undetermined: no 2E control (no full-data run for 4 epochs beside the 2-epoch ones).\n\n"
        "Nothing shows that full data had plateaued at 2 epochs: the table may measure the training budget, "
        "not the selection."
    ) in markdown
    assert "No verdicts: no row has two seeds paired with its reference's" in markdown


PLATEAU_SWEEPS = ("ablation_digits", "ratio_digits", "comparison_digits", "with_without_digits")


@pytest.mark.parametrize("sweep", PLATEAU_SWEEPS)
def test_shipped_digits_sweeps_train_the_pilots_epochs_over_3_seeds_with_a_2e_control(sweep):
    """Every trial trains the epoch pilot's E (``epochs_pilot_digits.yaml``: one of its counts, on
    the same validation hold-out) but the plateau control, full data for 2E; seeds 0-2."""
    pilot = load_sweep(REPO / "experiments" / "sweeps" / "epochs_pilot_digits.yaml")
    loaded = load_sweep(REPO / "experiments" / "sweeps" / f"{sweep}.yaml")
    assert loaded.spec.seeds == pilot.spec.seeds == [0, 1, 2]
    epochs = {(cfg.selection.method, cfg.train.epochs) for _, cfg in loaded.trials}
    e = min(e for _, e in epochs)
    assert {e for _, e in epochs} == {e, 2 * e} and ("full", e) in epochs
    assert e in {cfg.train.epochs for _, cfg in pilot.trials}
    assert [m for m, epochs_ in epochs if epochs_ == 2 * e] == ["full"]
    assert sum(cfg.train.epochs == 2 * e for _, cfg in loaded.trials) == 3
    assert {cfg.task.val_limit for _, cfg in loaded.trials} == {cfg.task.val_limit for _, cfg in pilot.trials} == {300}
