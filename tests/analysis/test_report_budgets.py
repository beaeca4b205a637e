"""The paper tables' rows and budgets: the ratio table, rows per config and model, budget flags, downstream columns."""

from __future__ import annotations

import csv
import io

import pytest
from attent import contract
from attent.analysis.paper_tables.experiment_runs import (
    config_names,
    downstream_metrics,
    load_experiment_runs,
    primary_metric,
)
from attent.analysis.paper_tables.report import build_report
from attent.analysis.paper_tables.table_files import to_csv, to_markdown
from attent.contract import lower_is_better
from attent.sweep.spec import load_sweep

from tests.helpers.paths import REPO
from tests.helpers.report_store import cost_metrics, log_run, new_experiment


def test_fixed_ratio_runs_build_the_sample_ratio_table(known_sweep_store, tmp_path):
    """Table 7 (sample ratios) from what the engine logs (params selection.ratio.kind/start)."""
    client, experiment_id = new_experiment(known_sweep_store, "fixed-ratios")
    log_run(
        client,
        experiment_id,
        {"selection.method": "full", contract.PARAM_RATIO_KIND: "fixed", contract.PARAM_RATIO_START: 1.0},
        cost_metrics(100, 1000, 0.9),
    )
    for ratio in (1.0, 0.8, 0.5):
        log_run(
            client,
            experiment_id,
            {"selection.method": "attent", contract.PARAM_RATIO_KIND: "fixed", contract.PARAM_RATIO_START: ratio},
            cost_metrics(100 * ratio, 1000 * ratio, 0.9 * ratio),
            tags={
                contract.TAG_STRATEGY: "hard",
                contract.TAG_INTERVAL_SCHEDULE: "fixed(1)",
                contract.TAG_LABEL: f"Hard · fixed({ratio:g}) · fixed(1)",
            },
        )
    report = build_report("fixed-ratios", tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False)
    assert [t.name for t in report.tables] == ["ratio"]
    table = report.tables[0]
    n_of_ratio = dict(zip(table.labels["Sample ratio"], table.stats["n"]))
    assert n_of_ratio == {"100% (full data)": 1, "100%": 1, "90%": 0, "80%": 1, "70%": 0, "60%": 0, "50%": 1, "40%": 0}
    half = table.labels["Sample ratio"].tolist().index("50%")
    assert table.stats.loc[half, ["ideal_saving", "realized_saving"]].tolist() == pytest.approx([0.5, 0.5])


def test_configs_differing_in_more_than_the_seed_get_their_own_rows(known_sweep_store, tmp_path):
    """Two temperatures under one label: two rows, each averaging its own seeds, labelled by
    the one field that differs (seed, run name and the constant model are not shown)."""
    client, experiment_id = new_experiment(known_sweep_store, "temperatures")
    common = {"task.model": "vit_tiny_cpu", "selection.strategy": "soft"}
    soft = {contract.TAG_STRATEGY: "soft", contract.TAG_LABEL: "Soft · incremental(0.2→0.8)"}
    for seed in range(2):
        log_run(
            client, experiment_id, {**common, "seed": seed, "selection.method": "full"}, cost_metrics(100, 1000, 0.80)
        )
    for temperature, seeds, accuracy in ((0.5, 2, 0.70), (2.0, 3, 0.60)):
        for seed in range(seeds):
            params = {
                **common,
                "seed": seed,
                "name": f"t{temperature}-{seed}",
                "selection.method": "attent",
                contract.PARAM_TEMPERATURE: temperature,
            }
            log_run(client, experiment_id, params, cost_metrics(50, 500, accuracy + 0.01 * seed), tags=soft)
    report = build_report("temperatures", tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False)
    table = report.tables[0]
    assert table.name == "with_without"
    assert table.labels.values.tolist() == [
        ["w/o AtteNT", ""],
        ["w/ AtteNT", "temperature=0.5"],
        ["w/ AtteNT", "temperature=2.0"],
    ]
    assert table.stats["n"].tolist() == [2, 2, 3]
    assert table.stats["eval_accuracy_mean"].tolist() == pytest.approx([0.80, 0.705, 0.61])
    assert "| w/ AtteNT | temperature=2.0 | 3 |" in to_markdown(table)
    runs = load_experiment_runs(client, "temperatures").runs
    assert set(config_names(runs)) == {
        "Full data",
        "Soft · incremental(0.2→0.8) (temperature=0.5)",
        "Soft · incremental(0.2→0.8) (temperature=2.0)",
    }


def test_each_config_is_compared_with_the_full_data_run_of_its_own_model(known_sweep_store, tmp_path):
    """Table 1 pattern (models x {w/, w/o}): never one model's cost against another's."""
    client, experiment_id = new_experiment(known_sweep_store, "models")
    for model, full_cost, attent_cost in (("a", 100.0, 60.0), ("b", 200.0, 150.0)):
        log_run(
            client, experiment_id, {"task.model": model, "selection.method": "full"}, cost_metrics(full_cost, 1000, 0.8)
        )
        log_run(
            client,
            experiment_id,
            {"task.model": model, "selection.method": "attent"},
            cost_metrics(attent_cost, 500, 0.8),
            tags={contract.TAG_STRATEGY: "soft", contract.TAG_LABEL: "Soft"},
        )
    table = build_report("models", tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False).tables[0]
    assert table.labels.values.tolist() == [
        ["w/o AtteNT", "task.model=a"],
        ["w/o AtteNT", "task.model=b"],
        ["w/ AtteNT", "task.model=a"],
        ["w/ AtteNT", "task.model=b"],
    ]
    assert table.stats["cost_change_pct"].tolist() == pytest.approx([0.0, 0.0, -40.0, -25.0])
    assert table.stats["ideal_saving"].tolist() == pytest.approx([0.0, 0.0, 0.5, 0.5])


def selection_params(arm: str) -> dict[str, str]:
    """The selection params of a comparison arm as the engine logs them: Random is AtteNT's
    Random strategy (selection.method attent, selection.strategy random)."""
    if arm == "random":
        return {"selection.method": contract.METHOD_ATTENT, "selection.strategy": "random"}
    return {"selection.method": arm}


def selection_tags(arm: str) -> dict[str, str] | None:
    return {contract.TAG_STRATEGY: "random"} if arm == "random" else None


def test_rows_trained_on_another_budget_than_attent_are_flagged(known_sweep_store, tmp_path):
    """Each row shows its mean selected ratio; one more than 2 % (relative) away from AtteNT's
    0.457 gets a marker and a footnote. Full data is the reference, not a competitor."""
    client, experiment_id = new_experiment(known_sweep_store, "budgets")
    ratios = {"attent": 0.457, "random": 0.457, "class_weight": 0.465, "gradnorm": 0.5, "infobatch": 0.7, "full": 1.0}
    for arm, ratio in ratios.items():
        log_run(
            client,
            experiment_id,
            selection_params(arm),
            {**cost_metrics(100 * ratio, 1000 * ratio, 0.8), contract.MEAN_SELECTED_RATIO: ratio},
            tags=selection_tags(arm),
        )
    table = build_report("budgets", tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False).tables[0]
    assert table.name == "comparison"
    flagged = dict(zip(table.labels["Method"], table.stats["budget_differs"]))
    assert flagged == {
        "AtteNT": False,
        "Class weight": False,
        "Group weight": False,
        "GradNorm": True,
        "InfoBatch": True,
        "Random subset": False,
        "Full data": False,
    }
    markdown = to_markdown(table)
    assert "| GradNorm | 1 |" in markdown and "| 0.500 † |" in markdown
    assert "| 0.465 |" in markdown  # within 2 %: the same budget
    assert markdown.endswith(
        "† Budget differs: mean selected ratio more than 2% (relative) "
        "away from AtteNT's (0.457); not a same-budget comparison."
    )
    rows = {r["Method"]: r for r in csv.DictReader(io.StringIO(to_csv(table)))}
    assert rows["InfoBatch"]["budget_differs"] == "*"
    assert rows["Random subset"]["budget_differs"] == ""
    assert float(rows["InfoBatch"]["mean_selected_ratio_mean"]) == pytest.approx(0.7)


def test_a_budget_is_compared_with_attents_on_the_same_dataset(known_sweep_store, tmp_path):
    """Random on dataset b matches AtteNT's budget on dataset a, not its own dataset's (class
    weight at AtteNT's budget beside them: the comparison table)."""
    client, experiment_id = new_experiment(known_sweep_store, "budgets-by-dataset")
    for dataset, attent_ratio, random_ratio in (("a", 0.434, 0.434), ("b", 0.6, 0.434)):
        arms = (("full", 1.0), ("attent", attent_ratio), ("random", random_ratio), ("class_weight", attent_ratio))
        for arm, ratio in arms:
            log_run(
                client,
                experiment_id,
                {"task.dataset": dataset, **selection_params(arm)},
                {**cost_metrics(100 * ratio, 1000 * ratio, 0.8), contract.MEAN_SELECTED_RATIO: ratio},
                tags=selection_tags(arm),
            )
    table = build_report(
        "budgets-by-dataset", tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False
    ).tables[0]
    flagged = {
        (m, c): f for m, c, f in zip(table.labels["Method"], table.labels["Config"], table.stats["budget_differs"])
    }
    assert not flagged[("Random subset", "task.dataset=a")]
    assert flagged[("Random subset", "task.dataset=b")]


TIMED_SWEEPS = ("comparison_digits", "demo_fashion_mnist", "ratio_digits", "ablation_digits", "with_without_digits")


@pytest.mark.parametrize("sweep", TIMED_SWEEPS)
def test_timed_sweeps_run_one_trial_at_a_time(sweep):
    """Two trials sharing two cores slow each other down: their times would not compare."""
    path = REPO / "experiments" / "sweeps" / f"{sweep}.yaml"
    assert load_sweep(path, name="check").spec.max_concurrent == 1


def test_comparison_sweep_gives_every_budgeted_method_attents_budget():
    """Same ratio and interval schedule (so the same selected ratio per epoch) for every
    baseline that takes a budget; InfoBatch prunes by its own rule."""
    sweep = load_sweep(REPO / "experiments" / "sweeps" / "comparison_digits.yaml")
    # Random: AtteNT's Random strategy (selection.strategy: random)
    selections = {
        "random" if cfg.selection.strategy == "random" else cfg.selection.method: cfg.selection
        for _, cfg in sweep.trials
    }
    attent = selections.pop("attent")
    budget = (attent.ratio_schedule.describe(), attent.interval_schedule.describe(), attent.warmup_epochs)
    assert budget == ("incremental(0.2→0.8)", "incremental(1→4)", 0)
    for method in ("random", "class_weight", "group_weight", "gradnorm"):
        selection = selections[method]
        assert (
            selection.ratio_schedule.describe(),
            selection.interval_schedule.describe(),
            selection.warmup_epochs,
        ) == budget, method
    assert set(selections) == {"random", "class_weight", "group_weight", "gradnorm", "infobatch", "full"}


def test_downstream_job_results_get_columns_before_eval_metrics(known_sweep_store, tmp_path):
    """A pretraining run carries its downstream jobs' final results as downstream.<job>.<metric>:
    they come first, in the paper's order (classification, segmentation, depth; δ1 before
    abs_rel), then the run's own eval_* metric. abs_rel is lower-is-better, so its best row is
    AtteNT's 0.1000, while full data's 0.8500 is the best δ1."""
    client, experiment_id = new_experiment(known_sweep_store, "pretraining-downstream")
    results = {"full": (0.80, 0.40, 0.85, 0.12, 0.90), "attent": (0.82, 0.41, 0.84, 0.10, 0.80)}
    names = [
        contract.downstream_metric(job, name)
        for job, name in (
            ("classification", "top1_accuracy"),
            ("semseg", "miou"),
            ("depth", "delta1"),
            ("depth", "abs_rel"),
        )
    ]
    for method, values in results.items():
        metrics = {**cost_metrics(100.0, 1000, values[-1]), **dict(zip(names, values))}
        log_run(
            client,
            experiment_id,
            {"selection.method": method},
            metrics,
            tags={contract.TAG_LABEL: "Soft"} if method == "attent" else None,
        )
    runs = load_experiment_runs(client, "pretraining-downstream").runs
    assert downstream_metrics(runs) == [*names, "eval_accuracy"]
    assert primary_metric(runs) == "downstream.classification.top1_accuracy"
    assert lower_is_better("downstream.depth.abs_rel") and lower_is_better("downstream.depth.rmse")
    assert not lower_is_better("downstream.depth.delta1")

    table = build_report(
        "pretraining-downstream", tracking_uri=known_sweep_store[0], out_dir=tmp_path, log_to_parent=False
    ).tables[0]
    assert table.name == "with_without" and table.metrics == [*names, "eval_accuracy"]
    lines = to_markdown(table).splitlines()
    assert lines[0].endswith(
        "| Eval (s) | classification top1_accuracy | semseg miou "
        "| depth delta1 | depth abs_rel | accuracy "
        "| classification top1_accuracy 95% CI | vs full data |"
    )  # the first one judged
    assert lines[2].endswith("| 0.8000 | 0.4000 | **0.8500** | 0.1200 | **0.9000** | — | reference |")  # w/o
    assert lines[3].endswith(
        "| **0.8200** | **0.4100** | 0.8400 | **0.1000** | 0.8000 | — | one seed: not judged |"
    )  # w/
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert [r["downstream.depth.abs_rel_best"] for r in rows] == ["", "*"]
    assert [r["downstream.depth.delta1_best"] for r in rows] == ["*", ""]
