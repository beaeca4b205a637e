"""analysis.report against a real MLflow SQLite store holding a small, fully known sweep.

The sweep: one parent run (attent.role=sweep) with Hard and Soft AtteNT configs x 3 seeds as
children, a full-data baseline x 3 seeds as standalone runs, and one child still RUNNING. Every
final metric is chosen so means and stds are exact: stds are sample stds (ddof=1), e.g. time of
the full runs [100, 110, 120] -> 110.0 ± 10.0.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from analysis.figures import time_to_reach_baseline
from analysis.report import build_report, main
from analysis.runs import HISTORY_KEYS, load_experiment_runs, load_histories
from analysis.tables import comparison_table, to_markdown

EXPERIMENT = "vit-ablation"
SCHEDULE_TAGS = {"attent.ratio_schedule": "cosine(0.2→0.8)",
                 "attent.interval_schedule": "incremental(1→4)"}
# config -> (tags, per-seed final time_total_s, eval_accuracy, eval_loss, eval_accuracy history
# for epochs 0..2; the final epoch 3 logs the final value)
CONFIGS = {
    "full": ({"attent.method": "full", "attent.strategy": "none", "attent.label": "Full data",
              "attent.ratio_schedule": "none", "attent.interval_schedule": "fixed(1)"},
             [100.0, 110.0, 120.0], [0.80, 0.82, 0.84], [0.50, 0.52, 0.54], [0.60, 0.70, 0.75]),
    "hard": ({"attent.method": "attent", "attent.strategy": "hard",
              "attent.label": "Hard · cosine · incremental", **SCHEDULE_TAGS},
             [60.0, 66.0, 72.0], [0.79, 0.80, 0.81], [0.60, 0.61, 0.62], [0.70, 0.75, 0.78]),
    "soft": ({"attent.method": "attent", "attent.strategy": "soft",
              "attent.label": "Soft · cosine · incremental", **SCHEDULE_TAGS},
             [70.0, 77.0, 84.0], [0.83, 0.84, 0.85], [0.45, 0.46, 0.47], [0.70, 0.81, 0.825]),
}
EPOCHS = 4


def log_training_run(client: MlflowClient, experiment_id: str, config: str, seed: int,
                     parent_id: str | None, status: str = "FINISHED") -> str:
    tags, times, accuracies, losses, accuracy_history = CONFIGS[config]
    role = {"attent.role": "trial", "mlflow.parentRunId": parent_id} if parent_id else {
        "attent.role": "run"}
    run_tags = {**tags, **role, "attent.task": "vision"}
    run_id = client.create_run(experiment_id, tags=run_tags).info.run_id
    time, accuracy = times[seed], accuracies[seed]
    metrics = [Metric("eval_loss", losses[seed], 0, EPOCHS - 1),
               Metric("sample_saving", 0.0 if config == "full" else 0.5, 0, EPOCHS - 1),
               Metric("mean_selected_ratio", {"full": 1.0, "hard": 0.5, "soft": 0.55}[config], 0,
                      EPOCHS - 1)]
    for epoch, epoch_accuracy in enumerate([*accuracy_history, accuracy]):
        metrics += [Metric("eval_accuracy", epoch_accuracy, 0, epoch),
                    Metric("time_total_s", time * (epoch + 1) / EPOCHS, 0, epoch),
                    Metric("train_loss", 2.0 / (epoch + 1) + seed * 0.01, 0, epoch)]
    params = [Param("seed", str(seed)), Param("selection.method", tags["attent.method"]),
              Param("selection.ratio.kind", "none" if config == "full" else "cosine")]
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
    client.set_terminated(parent_id, "FINISHED")
    return uri, parent_id, root / "reports"


@pytest.fixture(scope="module")
def report(store):
    uri, _, out = store
    return build_report(EXPERIMENT, tracking_uri=uri, out_dir=out)


EXPECTED_ABLATION = """\
| Ratio schedule | Interval schedule | Strategy | n | Time (s) | ΔTime vs full | accuracy | loss |
|:---|:---|:---|---:|---:|---:|---:|---:|
| — | — | Full data | 3 | 110.0 ± 10.0 | +0.0% | 0.8200 ± 0.0200 | 0.5200 ± 0.0200 |
| cosine(0.2→0.8) | incremental(1→4) | Random | 0 | — | — | — | — |
| cosine(0.2→0.8) | incremental(1→4) | Hard | 3 | **66.0 ± 6.0** | -40.0% | 0.8000 ± 0.0100 | 0.6100 ± 0.0100 |
| cosine(0.2→0.8) | incremental(1→4) | Soft | 3 | 77.0 ± 7.0 | -30.0% | **0.8400 ± 0.0100** | **0.4600 ± 0.0100** |"""


def test_picks_the_ablation_layout_and_counts_runs(report):
    assert [t.name for t in report.tables] == ["ablation"]
    assert (report.runs, report.unfinished) == (9, 1)


def test_ablation_markdown_cells(report):
    """Means, sample stds, % time vs the full row, bold best (lowest time and loss, highest
    accuracy) and the Random row nobody ran rendered as — cells."""
    assert to_markdown(report.tables[0]) == EXPECTED_ABLATION
    assert (report.out_dir / "ablation.md").read_text(encoding="utf-8") == EXPECTED_ABLATION + "\n"


def test_ablation_csv_holds_numbers_and_best_marks(report):
    rows = list(csv.DictReader(io.StringIO((report.out_dir / "ablation.csv").read_text("utf-8"))))
    full, random, hard, soft = rows
    assert float(full["time_total_s_std"]) == pytest.approx(10.0)
    assert float(hard["time_change_pct"]) == pytest.approx(-40.0)
    assert (hard["time_total_s_best"], soft["time_total_s_best"]) == ("*", "")
    assert (soft["eval_accuracy_best"], full["eval_accuracy_best"]) == ("*", "")
    assert random["n"] == "0" and random["eval_accuracy_mean"] == ""  # missing stays empty


def test_ablation_latex(report):
    tex = (report.out_dir / "ablation.tex").read_text(encoding="utf-8")
    assert r"\textbf{66.0 $\pm$ 6.0}" in tex
    assert (r"cosine(0.2$\rightarrow$0.8) & incremental(1$\rightarrow$4) & Soft & 3 & "
            r"77.0 $\pm$ 7.0 & -30.0\%") in tex
    assert r"\begin{tabular}{lllrrrrr}" in tex


def test_files_written_and_logged_to_the_sweep_parent(store, report):
    uri, parent_id, _ = store
    expected = {"ablation.md", "ablation.csv", "ablation.tex", "report.md",
                "fig_training_time.png", "fig_loss_curves.png", "fig_time_to_baseline.png",
                "fig_sample_ratio.png"}
    assert {p.name for p in report.files} == expected
    assert all(p.stat().st_size > 0 for p in report.files)
    assert report.logged_to == [parent_id]
    logged = MlflowClient(uri).list_artifacts(parent_id, "report")
    assert {Path(f.path).name for f in logged} == expected


def test_time_to_reach_the_baseline_accuracy(store):
    """Target = full runs' mean final accuracy 0.82. Soft reaches 0.825 at epoch 2 (3/4 of its
    final time: 52.5, 57.75, 63 s); Hard tops out at 0.81 and never reaches it."""
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
    assert table.stats["time_change_pct"].iloc[1] == pytest.approx(-30.0)


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
    assert "has no finished training runs (1 unfinished)" in err and "Traceback" not in err
