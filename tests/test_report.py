"""analysis.report against a real MLflow SQLite store holding a small, fully known sweep.

The sweep: one parent run (attent.role=sweep) with Hard and Soft AtteNT configs x 3 seeds as
children, a full-data baseline x 3 seeds as standalone runs, one child still RUNNING and one
KILLED (left out, counted). Every final metric is chosen so means and stds are exact: stds are
sample stds (ddof=1), e.g. method cost of the full runs [100, 110, 120] -> 110.0 ± 10.0.
Further experiments in the same store cover fixed sample ratios, configurations that differ in
more than the seed, and budgets.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from scipy import stats
from statsmodels.stats.multitest import multipletests

from attent.analysis.figures import time_to_reach_baseline
from attent.analysis.report import build_report, main
from attent.analysis.runs import HISTORY_KEYS, load_experiment_runs, load_histories
from attent.analysis.runs import config_names, downstream_metrics, primary_metric
from attent.contract import lower_is_better
from attent.analysis.render import to_csv, to_markdown
from attent.analysis.tables import comparison_table
from attent import contract
from attent.sweep import load_sweep
from conftest import REPO

EXPERIMENT = "vit-ablation"
SCHEDULE_TAGS = {contract.TAG_RATIO_SCHEDULE: "cosine(0.2→0.8)",
                 contract.TAG_INTERVAL_SCHEDULE: "incremental(1→4)"}
# config -> (tags, per-seed final method cost (time_method_s), eval_accuracy, eval_loss,
# eval_accuracy history for epochs 0..2; the final epoch 3 logs the final value)
CONFIGS = {
    "full": ({contract.TAG_METHOD: "full", contract.TAG_STRATEGY: "none",
              contract.TAG_LABEL: "Full data", contract.TAG_RATIO_SCHEDULE: "none",
              contract.TAG_INTERVAL_SCHEDULE: "fixed(1)"},
             [100.0, 110.0, 120.0], [0.80, 0.82, 0.84], [0.50, 0.52, 0.54], [0.60, 0.70, 0.75]),
    "hard": ({contract.TAG_METHOD: "attent", contract.TAG_STRATEGY: "hard",
              contract.TAG_LABEL: "Hard · cosine · incremental", **SCHEDULE_TAGS},
             [60.0, 66.0, 72.0], [0.79, 0.80, 0.81], [0.60, 0.61, 0.62], [0.70, 0.75, 0.78]),
    "soft": ({contract.TAG_METHOD: "attent", contract.TAG_STRATEGY: "soft",
              contract.TAG_LABEL: "Soft · cosine · incremental", **SCHEDULE_TAGS},
             [70.0, 77.0, 84.0], [0.83, 0.84, 0.85], [0.45, 0.46, 0.47], [0.70, 0.81, 0.825]),
}
EPOCHS = 4
# 1000 samples x 4 epochs on full data; Hard back-propagates half of that, Soft 55 %.
BACKPROPAGATED = {"full": 4000, "hard": 2000, "soft": 2200}
SELECTED_RATIOS = {"full": 1.0, "hard": 0.5, "soft": 0.55}
# Soft's runs come from an engine that predates time_method_s: its cost is the sum of the parts.
LOGS_METHOD_COST = {"full": True, "hard": True, "soft": False}


def time_metrics(config: str, cost: float, eval_seconds: float, step: int) -> list[Metric]:
    """Cumulative time split at ``step`` for a cumulative method cost ``cost``: training 3/4,
    scoring 3/16, selection 1/16 (exact in binary), evaluation apart, total = all of it."""
    parts = {"train": cost * 0.75, "scoring": cost * 0.1875, "selection": cost * 0.0625,
             "eval": eval_seconds}
    metrics = [Metric(contract.time_metric(part), value, 0, step) for part, value in parts.items()]
    metrics.append(Metric(contract.TIME_TOTAL, cost + eval_seconds, 0, step))
    if LOGS_METHOD_COST[config]:
        metrics.append(Metric(contract.TIME_METHOD, cost, 0, step))
    return metrics


def log_training_run(client: MlflowClient, experiment_id: str, config: str, seed: int,
                     parent_id: str | None, status: str = "FINISHED") -> str:
    tags, costs, accuracies, losses, accuracy_history = CONFIGS[config]
    role = {contract.TAG_ROLE: "trial", contract.TAG_PARENT_RUN_ID: parent_id} if parent_id \
        else {contract.TAG_ROLE: "run"}
    run_tags = {**tags, **role, contract.TAG_TASK: "vision"}  # no identity tag: older runs
    run_id = client.create_run(experiment_id, tags=run_tags).info.run_id
    cost, accuracy = costs[seed], accuracies[seed]
    metrics = [Metric("eval_loss", losses[seed], 0, EPOCHS - 1),
               Metric(contract.SAMPLE_SAVING, 1 - BACKPROPAGATED[config] / 4000, 0, EPOCHS - 1),
               Metric(contract.SAMPLES_BACKPROPAGATED, BACKPROPAGATED[config], 0, EPOCHS - 1),
               Metric(contract.MEAN_SELECTED_RATIO, SELECTED_RATIOS[config], 0, EPOCHS - 1)]
    for epoch, epoch_accuracy in enumerate([*accuracy_history, accuracy]):
        progress = (epoch + 1) / EPOCHS  # evaluation: 4, 5, 6 s per epoch for seeds 0, 1, 2
        metrics += [Metric("eval_accuracy", epoch_accuracy, 0, epoch),
                    *time_metrics(config, cost * progress, (4.0 + seed) * (epoch + 1), epoch),
                    Metric(contract.TRAIN_LOSS, 2.0 / (epoch + 1) + seed * 0.01, 0, epoch)]
    params = [Param(contract.PARAM_SEED, str(seed)),
              Param("selection.method", tags[contract.TAG_METHOD]),
              Param(contract.PARAM_RATIO_KIND, "none" if config == "full" else "cosine")]
    client.log_batch(run_id, metrics=metrics, params=params)
    client.set_terminated(run_id, status)
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[str, str, Path]:
    """(tracking URI, sweep parent run id, report folder) of the known sweep."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(EXPERIMENT, artifact_location=str(root / "artifacts"))
    parent_id = client.create_run(experiment_id, tags={
        "attent.role": "sweep", "attent.sweep": "ablation"}).info.run_id
    for seed in range(3):
        log_training_run(client, experiment_id, "full", seed, parent_id=None)
        log_training_run(client, experiment_id, "hard", seed, parent_id)
        log_training_run(client, experiment_id, "soft", seed, parent_id)
    log_training_run(client, experiment_id, "soft", 0, parent_id, status="RUNNING")
    log_training_run(client, experiment_id, "hard", 1, parent_id, status="KILLED")  # its driver died
    client.set_terminated(parent_id, "FINISHED")
    return uri, parent_id, root / "reports"


@pytest.fixture(scope="module")
def report(store):
    uri, _, out = store
    return build_report(EXPERIMENT, tracking_uri=uri, out_dir=out)


HEADERS = ("| Ratio schedule | Interval schedule | Strategy | n | Method cost (s) "
           "| Δ cost vs full "
           "| Ideal saving | Realized saving | Realized / ideal | Selected ratio | Eval (s) "
           "| accuracy | loss | accuracy 95% CI | vs full data |")
EXPECTED_ABLATION = HEADERS + """
|:---|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|
| — | — | Full data | 3 | 110.0 ± 10.0 | +0.0% | 0.0% | 0.0% | — | 1.000 | 20.0 ± 4.0 | 0.8200 ± 0.0200 | 0.5200 ± 0.0200 | [0.7703, 0.8697] | reference |
| cosine(0.2→0.8) | incremental(1→4) | Random | 0 | — | — | — | — | — | — | — | — | — | — | — |
| cosine(0.2→0.8) | incremental(1→4) | Hard | 3 | **66.0 ± 6.0** | -40.0% | 50.0% | 40.0% | 0.80 | 0.500 | 20.0 ± 4.0 | 0.8000 ± 0.0100 | 0.6100 ± 0.0100 | [0.7752, 0.8248] | inconclusive (-0.0200) |
| cosine(0.2→0.8) | incremental(1→4) | Soft | 3 | 77.0 ± 7.0 | -30.0% | 45.0% | 30.0% | 0.67 | 0.550 | 20.0 ± 4.0 | **0.8400 ± 0.0100** | **0.4600 ± 0.0100** | [0.8152, 0.8648] | inconclusive (+0.0200) |

Plateau: undetermined: no 2E control (no full-data run for 2E epochs beside the E-epoch ones).

Nothing shows that full data had plateaued at E epochs: the table may measure the training budget, not the selection.

Words (final accuracy, each row's against full data of its context, in brackets the mean paired difference): \
paired t-tests over seeds, Holm-adjusted across the table's 2 comparisons at 0.05, give "better" / "worse"; \
else "equivalent within ± 0.01" by a paired TOST, Holm-adjusted likewise; else "inconclusive". Rows with one \
seed are not judged. Interval column: the 95 % t-interval over seeds of the row's mean."""


def test_picks_the_ablation_layout_and_counts_runs(report):
    assert [t.name for t in report.tables] == ["ablation"]
    assert (report.runs, report.unfinished, report.killed) == (9, 1, 1)
    index = (report.out_dir / "report.md").read_text()
    assert "9 finished training runs; 1 unfinished and 1 killed runs (their driver died mid-run) left out." in index


def test_ablation_markdown_cells(report):
    """Means, sample stds, % time vs the full row, bold best (lowest time and loss, highest
    accuracy) and the Random row nobody ran rendered as — cells; the 95 % seed interval of the
    accuracy (t with 2 degrees of freedom: full data 0.82 ± 4.303 × 0.02 / √3), the words against
    full data (Hard and Soft differ by ∓0.02, p = 0.074 each, 0.148 after Holm: inconclusive), and
    the notes: no control (the runs logged no epochs), the rule of the words."""
    assert to_markdown(report.tables[0]) == EXPECTED_ABLATION
    assert (report.out_dir / "ablation.md").read_text(encoding="utf-8") == EXPECTED_ABLATION + "\n"


def test_ablation_csv_holds_numbers_and_best_marks(report):
    rows = list(csv.DictReader(io.StringIO((report.out_dir / "ablation.csv").read_text("utf-8"))))
    full, random, hard, soft = rows
    assert float(full["time_method_s_std"]) == pytest.approx(10.0)
    assert float(hard["cost_change_pct"]) == pytest.approx(-40.0)
    assert float(soft["time_method_s_mean"]) == pytest.approx(77.0)  # sum of its parts
    assert float(soft["time_eval_s_mean"]) == pytest.approx(20.0)  # apart from the cost
    savings = float(hard["ideal_saving"]), float(hard["realized_saving"])
    assert savings == pytest.approx((0.5, 0.4))
    assert float(hard["realized_over_ideal"]) == pytest.approx(0.8)
    assert (hard["time_method_s_best"], soft["time_method_s_best"]) == ("*", "")
    assert (soft["eval_accuracy_best"], full["eval_accuracy_best"]) == ("*", "")
    assert random["n"] == "0" and random["eval_accuracy_mean"] == ""  # missing stays empty


def test_ablation_latex(report):
    tex = (report.out_dir / "ablation.tex").read_text(encoding="utf-8")
    assert r"\textbf{66.0 $\pm$ 6.0}" in tex
    assert (r"cosine(0.2$\rightarrow$0.8) & incremental(1$\rightarrow$4) & Soft & 3 & "
            r"77.0 $\pm$ 7.0 & -30.0\% & 45.0\% & 30.0\% & 0.67 & 0.550") in tex
    assert r"\begin{tabular}{lllrrrrrrrrrrrl}" in tex  # the words left-aligned, as text
    assert r"[0.7752, 0.8248] & inconclusive (-0.0200) \\" in tex


def test_files_written_and_logged_to_the_sweep_parent(store, report):
    uri, parent_id, _ = store
    expected = {"ablation.md", "ablation.csv", "ablation.tex", "ablation_comparisons.csv", "report.md",
                "fig_training_time.png", "fig_loss_curves.png", "fig_time_to_baseline.png",
                "fig_sample_ratio.png"}
    assert {p.name for p in report.files} == expected
    assert all(p.stat().st_size > 0 for p in report.files)
    assert report.logged_to == [parent_id]
    logged = MlflowClient(uri).list_artifacts(parent_id, "report")
    assert {Path(f.path).name for f in logged} == expected


def test_time_to_reach_the_baseline_accuracy(store):
    """Target = full runs' mean final accuracy 0.82. Soft reaches 0.825 at epoch 2, at 3/4 of
    its final method cost (52.5, 57.75, 63 s, from the parts: its runs predate time_method_s;
    the wall time with evaluation would be more); Hard tops out at 0.81 and never reaches it."""
    client = MlflowClient(store[0])
    runs = load_experiment_runs(client, EXPERIMENT).runs
    histories = load_histories(client, runs["run_id"].tolist(), [*HISTORY_KEYS, "eval_accuracy"])
    reach = time_to_reach_baseline(runs, histories, "eval_accuracy").set_index("config")
    soft = reach.loc["Soft · cosine · incremental"]
    assert (soft["mean"], soft["std"]) == pytest.approx((57.75, 5.25))
    assert (soft["n"], soft["runs"]) == (3, 3)
    assert reach.loc["Hard · cosine · incremental", "n"] == 0


def test_comparison_layout_splits_attent_configs_and_keeps_missing_methods(store):
    runs = load_experiment_runs(MlflowClient(store[0]), EXPERIMENT).runs
    table = comparison_table(runs)
    assert table.labels["Method"].tolist() == [
        "AtteNT (Hard · cosine · incremental)", "AtteNT (Soft · cosine · incremental)",
        "Class weight", "Group weight", "GradNorm", "InfoBatch", "Random subset", "Full data"]
    assert table.stats["n"].tolist() == [3, 3, 0, 0, 0, 0, 0, 3]
    assert table.stats["cost_change_pct"].iloc[1] == pytest.approx(-30.0)


def test_missing_experiment_and_no_finished_runs_give_a_message(store, tmp_path, capsys):
    uri = store[0]
    assert main(["--experiment", "nope", "--tracking-uri", uri, "--out", str(tmp_path)]) == 1
    assert "experiment 'nope' does not exist" in capsys.readouterr().err

    client = MlflowClient(uri)
    running = client.create_experiment("running-only", artifact_location=str(tmp_path / "a"))
    client.create_run(running, tags={"attent.role": "run"})
    args = ["--experiment", "running-only", "--tracking-uri", uri, "--out", str(tmp_path)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "has no finished training runs (1 unfinished, 0 killed)" in err and "Traceback" not in err


# --- runs as the engine logs them: identity tag, flattened config as params ----------------
def log_run(client: MlflowClient, experiment_id: str, params: dict[str, object],
            metrics: dict[str, float], tags: dict[str, str] | None = None) -> str:
    """A finished run with ``params`` as its flattened config, the identity tag the engine
    derives from them, and ``metrics`` as final values."""
    flat = {"name": f"run-{len(params)}", "mlflow.experiment": "x", **params}
    run_tags = {contract.TAG_ROLE: "run", contract.TAG_TASK: "vision",
                contract.TAG_METHOD: str(flat["selection.method"]),
                contract.TAG_IDENTITY: contract.identity_hash(flat), **(tags or {})}
    run_id = client.create_run(experiment_id, tags=run_tags).info.run_id
    client.log_batch(run_id, metrics=[Metric(k, v, 0, EPOCHS) for k, v in metrics.items()],
                     params=[Param(k, str(v)) for k, v in flat.items()])
    client.set_terminated(run_id, "FINISHED")
    return run_id


def new_experiment(store, name: str) -> tuple[MlflowClient, str]:
    client = MlflowClient(store[0])
    return client, client.create_experiment(name)


def cost_metrics(cost: float, backpropagated: float, accuracy: float) -> dict[str, float]:
    return {contract.TIME_METHOD: cost, contract.time_metric("eval"): 3.0,
            contract.TIME_TOTAL: cost + 3.0, contract.SAMPLES_BACKPROPAGATED: backpropagated,
            "eval_accuracy": accuracy}


def test_fixed_ratio_runs_build_the_sample_ratio_table(store, tmp_path):
    """Table 5 from what the engine logs (params selection.ratio.kind/start)."""
    client, experiment_id = new_experiment(store, "fixed-ratios")
    log_run(client, experiment_id, {"selection.method": "full", contract.PARAM_RATIO_KIND: "fixed",
                                    contract.PARAM_RATIO_START: 1.0}, cost_metrics(100, 1000, 0.9))
    for ratio in (1.0, 0.8, 0.5):
        log_run(client, experiment_id,
                {"selection.method": "attent", contract.PARAM_RATIO_KIND: "fixed",
                 contract.PARAM_RATIO_START: ratio},
                cost_metrics(100 * ratio, 1000 * ratio, 0.9 * ratio),
                tags={contract.TAG_STRATEGY: "hard", contract.TAG_INTERVAL_SCHEDULE: "fixed(1)",
                      contract.TAG_LABEL: f"Hard · fixed({ratio:g}) · fixed(1)"})
    report = build_report("fixed-ratios", tracking_uri=store[0], out_dir=tmp_path,
                          log_to_parent=False)
    assert [t.name for t in report.tables] == ["ratio"]
    table = report.tables[0]
    n_of_ratio = dict(zip(table.labels["Sample ratio"], table.stats["n"]))
    assert n_of_ratio == {"100% (full data)": 1, "100%": 1, "90%": 0, "80%": 1, "70%": 0,
                          "60%": 0, "50%": 1, "40%": 0}
    half = table.labels["Sample ratio"].tolist().index("50%")
    assert table.stats.loc[half, ["ideal_saving", "realized_saving"]].tolist() == \
        pytest.approx([0.5, 0.5])


def test_configs_differing_in_more_than_the_seed_get_their_own_rows(store, tmp_path):
    """Two temperatures under one label: two rows, each averaging its own seeds, labelled by
    the one field that differs (seed, run name and the constant model are not shown)."""
    client, experiment_id = new_experiment(store, "temperatures")
    common = {"task.model": "vit_tiny_cpu", "selection.strategy": "soft"}
    soft = {contract.TAG_STRATEGY: "soft", contract.TAG_LABEL: "Soft · incremental(0.2→0.8)"}
    for seed in range(2):
        log_run(client, experiment_id, {**common, "seed": seed, "selection.method": "full"},
                cost_metrics(100, 1000, 0.80))
    for temperature, seeds, accuracy in ((0.5, 2, 0.70), (2.0, 3, 0.60)):
        for seed in range(seeds):
            params = {**common, "seed": seed, "name": f"t{temperature}-{seed}",
                      "selection.method": "attent", contract.PARAM_TEMPERATURE: temperature}
            log_run(client, experiment_id, params,
                    cost_metrics(50, 500, accuracy + 0.01 * seed), tags=soft)
    report = build_report("temperatures", tracking_uri=store[0], out_dir=tmp_path,
                          log_to_parent=False)
    table = report.tables[0]
    assert table.name == "with_without"
    assert table.labels.values.tolist() == [["w/o AtteNT", ""],
                                            ["w/ AtteNT", "temperature=0.5"],
                                            ["w/ AtteNT", "temperature=2.0"]]
    assert table.stats["n"].tolist() == [2, 2, 3]
    assert table.stats["eval_accuracy_mean"].tolist() == pytest.approx([0.80, 0.705, 0.61])
    assert "| w/ AtteNT | temperature=2.0 | 3 |" in to_markdown(table)
    runs = load_experiment_runs(client, "temperatures").runs
    assert set(config_names(runs)) == {"Full data",
                                       "Soft · incremental(0.2→0.8) (temperature=0.5)",
                                       "Soft · incremental(0.2→0.8) (temperature=2.0)"}


def test_each_config_is_compared_with_the_full_data_run_of_its_own_model(store, tmp_path):
    """Table 1 pattern (models x {w/, w/o}): never one model's cost against another's."""
    client, experiment_id = new_experiment(store, "models")
    for model, full_cost, attent_cost in (("a", 100.0, 60.0), ("b", 200.0, 150.0)):
        log_run(client, experiment_id, {"task.model": model, "selection.method": "full"},
                cost_metrics(full_cost, 1000, 0.8))
        log_run(client, experiment_id, {"task.model": model, "selection.method": "attent"},
                cost_metrics(attent_cost, 500, 0.8),
                tags={contract.TAG_STRATEGY: "soft", contract.TAG_LABEL: "Soft"})
    table = build_report("models", tracking_uri=store[0], out_dir=tmp_path,
                         log_to_parent=False).tables[0]
    assert table.labels.values.tolist() == [["w/o AtteNT", "task.model=a"],
                                            ["w/o AtteNT", "task.model=b"],
                                            ["w/ AtteNT", "task.model=a"],
                                            ["w/ AtteNT", "task.model=b"]]
    assert table.stats["cost_change_pct"].tolist() == pytest.approx([0.0, 0.0, -40.0, -25.0])
    assert table.stats["ideal_saving"].tolist() == pytest.approx([0.0, 0.0, 0.5, 0.5])


def test_rows_trained_on_another_budget_than_attent_are_flagged(store, tmp_path):
    """Each row shows its mean selected ratio; one more than 2 % (relative) away from AtteNT's
    0.457 gets a marker and a footnote. Full data is the reference, not a competitor."""
    client, experiment_id = new_experiment(store, "budgets")
    ratios = {"attent": 0.457, "random": 0.457, "class_weight": 0.465, "gradnorm": 0.5,
              "infobatch": 0.7, "full": 1.0}
    for method, ratio in ratios.items():
        log_run(client, experiment_id, {"selection.method": method},
                {**cost_metrics(100 * ratio, 1000 * ratio, 0.8),
                 contract.MEAN_SELECTED_RATIO: ratio})
    table = build_report("budgets", tracking_uri=store[0], out_dir=tmp_path,
                         log_to_parent=False).tables[0]
    assert table.name == "comparison"
    flagged = dict(zip(table.labels["Method"], table.stats["budget_differs"]))
    assert flagged == {"AtteNT": False, "Class weight": False, "Group weight": False,
                       "GradNorm": True, "InfoBatch": True, "Random subset": False,
                       "Full data": False}
    markdown = to_markdown(table)
    assert "| GradNorm | 1 |" in markdown and "| 0.500 † |" in markdown
    assert "| 0.465 |" in markdown  # within 2 %: the same budget
    assert markdown.endswith("† Budget differs: mean selected ratio more than 2% (relative) "
                             "away from AtteNT's (0.457); not a same-budget comparison.")
    rows = {r["Method"]: r for r in csv.DictReader(io.StringIO(to_csv(table)))}
    assert rows["InfoBatch"]["budget_differs"] == "*"
    assert rows["Random subset"]["budget_differs"] == ""
    assert float(rows["InfoBatch"]["mean_selected_ratio_mean"]) == pytest.approx(0.7)


def test_a_budget_is_compared_with_attents_on_the_same_dataset(store, tmp_path):
    """Random on dataset b matches AtteNT's budget on dataset a, not its own dataset's."""
    client, experiment_id = new_experiment(store, "budgets-by-dataset")
    for dataset, attent_ratio, random_ratio in (("a", 0.434, 0.434), ("b", 0.6, 0.434)):
        for method, ratio in (("full", 1.0), ("attent", attent_ratio), ("random", random_ratio)):
            log_run(client, experiment_id, {"task.dataset": dataset, "selection.method": method},
                    {**cost_metrics(100 * ratio, 1000 * ratio, 0.8), contract.MEAN_SELECTED_RATIO: ratio})
    table = build_report("budgets-by-dataset", tracking_uri=store[0], out_dir=tmp_path,
                         log_to_parent=False).tables[0]
    flagged = {(m, c): f for m, c, f in zip(table.labels["Method"], table.labels["Config"],
                                             table.stats["budget_differs"])}
    assert not flagged[("Random subset", "task.dataset=a")]
    assert flagged[("Random subset", "task.dataset=b")]


TIMED_SWEEPS = ("comparison_digits", "demo_fashion_mnist", "ratio_digits", "ablation_digits",
                "with_without_digits")


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
    selections = {"random" if cfg.selection.strategy == "random" else cfg.selection.method: cfg.selection
                  for _, cfg in sweep.trials}
    attent = selections.pop("attent")
    budget = (attent.ratio_schedule.describe(), attent.interval_schedule.describe(),
              attent.warmup_epochs)
    assert budget == ("incremental(0.2→0.8)", "incremental(1→4)", 0)
    for method in ("random", "class_weight", "group_weight", "gradnorm"):
        selection = selections[method]
        assert (selection.ratio_schedule.describe(), selection.interval_schedule.describe(),
                selection.warmup_epochs) == budget, method
    assert set(selections) == {"random", "class_weight", "group_weight", "gradnorm", "infobatch",
                               "full"}


def test_downstream_job_results_get_columns_before_eval_metrics(store, tmp_path):
    """A pretraining run carries its downstream jobs' final results as downstream.<job>.<metric>:
    they come first, in the paper's order (classification, segmentation, depth; δ1 before
    abs_rel), then the run's own eval_* metric. abs_rel is lower-is-better, so its best row is
    AtteNT's 0.1000, while full data's 0.8500 is the best δ1."""
    client, experiment_id = new_experiment(store, "pretraining-downstream")
    results = {"full": (0.80, 0.40, 0.85, 0.12, 0.90), "attent": (0.82, 0.41, 0.84, 0.10, 0.80)}
    names = [contract.downstream_metric(job, name) for job, name in (
        ("classification", "top1_accuracy"), ("semseg", "miou"), ("depth", "delta1"),
        ("depth", "abs_rel"))]
    for method, values in results.items():
        metrics = {**cost_metrics(100.0, 1000, values[-1]), **dict(zip(names, values))}
        log_run(client, experiment_id, {"selection.method": method}, metrics,
                tags={contract.TAG_LABEL: "Soft"} if method == "attent" else None)
    runs = load_experiment_runs(client, "pretraining-downstream").runs
    assert downstream_metrics(runs) == [*names, "eval_accuracy"]
    assert primary_metric(runs) == "downstream.classification.top1_accuracy"
    assert lower_is_better("downstream.depth.abs_rel") and lower_is_better("downstream.depth.rmse")
    assert not lower_is_better("downstream.depth.delta1")

    table = build_report("pretraining-downstream", tracking_uri=store[0], out_dir=tmp_path,
                         log_to_parent=False).tables[0]
    assert table.name == "with_without" and table.metrics == [*names, "eval_accuracy"]
    lines = to_markdown(table).splitlines()
    assert lines[0].endswith("| Eval (s) | classification top1_accuracy | semseg miou "
                             "| depth delta1 | depth abs_rel | accuracy "
                             "| classification top1_accuracy 95% CI | vs full data |")  # the first one judged
    assert lines[2].endswith("| 0.8000 | 0.4000 | **0.8500** | 0.1200 | **0.9000** | — | reference |")  # w/o
    assert lines[3].endswith("| **0.8200** | **0.4100** | 0.8400 | **0.1000** | 0.8000 | — "
                             "| one seed: not judged |")  # w/
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert [r["downstream.depth.abs_rel_best"] for r in rows] == ["", "*"]
    assert [r["downstream.depth.delta1_best"] for r in rows] == ["*", ""]


# --- the regime check and the words (analysis.table_verdicts) --------------------------------
FULL_30 = [0.90, 0.91, 0.92]  # full data's final accuracy per seed at E = 30 epochs; seed std 0.01


def log_seeds(client: MlflowClient, experiment_id: str, method: str, accuracies: list[float],
              epochs: int = 30, ratio: float = 0.5) -> None:
    """One finished run per seed (0, 1, ...) of ``method`` trained ``epochs`` epochs, as the
    shipped sweeps log them (``train.epochs`` and the seed among the params)."""
    budget = 1.0 if method == "full" else ratio
    for seed, accuracy in enumerate(accuracies):
        log_run(client, experiment_id, {"selection.method": method, contract.PARAM_EPOCHS: epochs,
                                        contract.PARAM_SEED: seed},
                {**cost_metrics(100 * budget, 1000 * budget, accuracy), contract.MEAN_SELECTED_RATIO: budget},
                tags={contract.TAG_LABEL: "Soft"} if method == "attent" else None)


def plus(values: list[float], deltas: list[float]) -> list[float]:
    return [v + d for v, d in zip(values, deltas)]


def with_without_report(store, tmp_path, name: str, control: list[float] | None):
    """Full data and AtteNT at 30 epochs over 3 seeds, and the 60-epoch control if given."""
    client, experiment_id = new_experiment(store, name)
    log_seeds(client, experiment_id, "full", FULL_30)
    log_seeds(client, experiment_id, "attent", plus(FULL_30, [-0.010, -0.011, -0.009]))
    if control is not None:
        log_seeds(client, experiment_id, "full", control, epochs=60)
    return build_report(name, tracking_uri=store[0], out_dir=tmp_path, log_to_parent=False)


def test_a_control_three_points_higher_on_every_seed_reads_still_improving(store, tmp_path):
    """The 60-epoch full runs end +0.029, +0.030, +0.031 above the 30-epoch ones: the 90 % paired
    interval [+0.0283, +0.0317] lies above the tolerance max(0.005, seed std 0.01): still
    improving, and the table says it measures the budget. The control is no row of the table."""
    report = with_without_report(store, tmp_path, "regime-rising", plus(FULL_30, [0.029, 0.030, 0.031]))
    [table] = report.tables
    assert table.labels.values.tolist() == [["w/o AtteNT"], ["w/ AtteNT"]]  # no Config column: control left out
    assert table.stats["n"].tolist() == [3, 3] and report.runs == 9
    expected = stats.ttest_1samp([0.029, 0.030, 0.031], 0.0).confidence_interval(0.90)
    markdown = to_markdown(table)
    assert (f"Plateau: full data for 60 epochs minus for 30, final accuracy, signed so that positive is an "
            f"improvement: +0.0300, 90% paired interval [{expected.low:+.4f}, {expected.high:+.4f}] over 3 seeds, "
            "against the tolerance 0.0100 (the larger of 0.005 absolute and the seed std of full data's final "
            "value, 0.0100): still improving.") in markdown
    assert expected.low > 0.01
    assert ("Full data was still improving at 30 epochs: this table measures the training budget, not the "
            "selection.") in markdown


def test_a_flat_control_reads_plateaued(store, tmp_path):
    """Control − full per seed: +0.001, −0.001, 0: the interval's upper end (+0.0029) lies below the
    tolerance 0.01: plateaued."""
    report = with_without_report(store, tmp_path, "regime-flat", plus(FULL_30, [0.001, -0.001, 0.0]))
    markdown = to_markdown(report.tables[0])
    assert "over 3 seeds, against the tolerance 0.0100" in markdown and "): plateaued." in markdown
    assert "at 30 epochs the rows compare selection, not training budgets." in markdown
    assert "measures the training budget" not in markdown and "may measure" not in markdown


def test_words_follow_holm_across_the_tables_comparisons(store, tmp_path):
    """Comparison table, 3 seeds: AtteNT, Random at AtteNT's budget and full data; 3 comparisons
    (AtteNT and Random against full data, Random against AtteNT), one Holm family. AtteNT − full
    (−0.026, −0.020, −0.014) is significant alone (p = 0.029) but not after Holm (× 3): inconclusive.
    Random − full (+0.001, −0.001, 0) passes the TOST within ± 0.01 after Holm: equivalent."""
    client, experiment_id = new_experiment(store, "regime-holm")
    attent, random = plus(FULL_30, [-0.026, -0.020, -0.014]), plus(FULL_30, [0.001, -0.001, 0.0])
    log_seeds(client, experiment_id, "full", FULL_30)
    log_seeds(client, experiment_id, "attent", attent)
    log_seeds(client, experiment_id, "random", random)
    table = build_report("regime-holm", tracking_uri=store[0], out_dir=tmp_path, log_to_parent=False).tables[0]
    assert table.name == "comparison"
    words = dict(zip(table.labels["Method"], table.words.to_dict("records")))
    assert words["AtteNT"] == {"vs full data": "inconclusive (-0.0200)", "vs AtteNT": "reference"}
    assert words["Random subset"] == {"vs full data": "equivalent within ± 0.01 (+0.0000)",
                                      "vs AtteNT": "inconclusive (+0.0200)"}
    assert words["Full data"] == {"vs full data": "reference", "vs AtteNT": "—"}
    assert words["GradNorm"] == {"vs full data": "—", "vs AtteNT": "—"}  # no run

    by = {(p.subject, p.method): p for p in table.comparisons}
    alone = stats.ttest_rel(attent, FULL_30).pvalue
    assert by["AtteNT", "Full data"].p == pytest.approx(alone) and alone < 0.05
    ps = [stats.ttest_rel(attent, FULL_30).pvalue, stats.ttest_rel(random, FULL_30).pvalue,
          stats.ttest_rel(random, attent).pvalue]
    holm = multipletests(ps, alpha=0.05, method="holm")[1]
    assert [by[k].p_holm for k in (("AtteNT", "Full data"), ("Random subset", "Full data"),
                                   ("Random subset", "AtteNT"))] == pytest.approx(list(holm))
    assert holm[0] > 0.05
    markdown = to_markdown(table)
    assert "Holm-adjusted across the table's 3 comparisons at 0.05" in markdown
    assert "| accuracy 95% CI | vs full data | vs AtteNT |" in markdown.splitlines()[0]
    rows = {r["Method"]: r for r in csv.DictReader(io.StringIO(to_csv(table)))}
    interval = stats.ttest_1samp(FULL_30, 0.0).confidence_interval(0.95)
    assert (float(rows["Full data"]["eval_accuracy_low_95"]), float(rows["Full data"]["eval_accuracy_high_95"])) \
        == pytest.approx((interval.low, interval.high))
    assert rows["AtteNT"]["vs full data"] == "inconclusive (-0.0200)"


def test_attents_random_strategy_is_the_comparisons_random_subset(store, tmp_path):
    """The comparison sweeps ask for Random as AtteNT's strategy (selection.strategy: random: tags
    method attent, strategy random). Beside other methods those runs are the Random subset row,
    as the runs recorded under the deprecated selection.method: random are (test above), with
    the same words against AtteNT, and no ablation table of Soft against Random appears."""
    client, experiment_id = new_experiment(store, "random-strategy")
    finals = {("full", "none"): FULL_30, ("attent", "soft"): plus(FULL_30, [-0.026, -0.020, -0.014]),
              ("attent", "random"): plus(FULL_30, [0.001, -0.001, 0.0]),
              ("class_weight", "none"): plus(FULL_30, [0.002, -0.001, 0.0])}
    for (method, strategy), accuracies in finals.items():
        budget = 1.0 if method == "full" else 0.5
        for seed, accuracy in enumerate(accuracies):
            log_run(client, experiment_id, {"selection.method": method, "selection.strategy": strategy,
                                            contract.PARAM_EPOCHS: 30, contract.PARAM_SEED: seed},
                    {**cost_metrics(100 * budget, 1000 * budget, accuracy), contract.MEAN_SELECTED_RATIO: budget},
                    tags={contract.TAG_STRATEGY: strategy, contract.TAG_LABEL: f"{strategy.capitalize()} · x"})
    tables = build_report("random-strategy", tracking_uri=store[0], out_dir=tmp_path, log_to_parent=False).tables
    assert [table.name for table in tables] == ["comparison"]
    table = tables[0]
    assert dict(zip(table.labels["Method"], table.stats["n"])) == {
        "AtteNT": 3, "Class weight": 3, "Group weight": 0, "GradNorm": 0, "InfoBatch": 0, "Random subset": 3,
        "Full data": 3}
    words = dict(zip(table.labels["Method"], table.words.to_dict("records")))
    assert words["Random subset"] == {"vs full data": "equivalent within ± 0.01 (+0.0000)",
                                      "vs AtteNT": "inconclusive (+0.0200)"}


def test_a_one_seed_table_gets_no_words(store, tmp_path):
    """One seed per row and no control (the test suite's own small sweeps): no interval, no
    words, and a plateau that nothing shows."""
    client, experiment_id = new_experiment(store, "regime-one-seed")
    log_seeds(client, experiment_id, "full", [0.90], epochs=2)
    log_seeds(client, experiment_id, "attent", [0.88], epochs=2)
    report = build_report("regime-one-seed", tracking_uri=store[0], out_dir=tmp_path, log_to_parent=False)
    [table] = report.tables
    assert table.words["vs full data"].tolist() == ["reference", "one seed: not judged"]
    assert not any(p.judged for p in table.comparisons)
    markdown = to_markdown(table)
    assert "| **0.9000** | — | reference |" in markdown
    assert ("Plateau: undetermined: no 2E control (no full-data run for 4 epochs beside the 2-epoch ones).\n\n"
            "Nothing shows that full data had plateaued at 2 epochs: the table may measure the training budget, "
            "not the selection.") in markdown
    assert "No words: no row has two seeds paired with its reference's" in markdown


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
