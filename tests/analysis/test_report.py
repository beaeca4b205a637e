"""The paper tables' report (analysis/paper_tables/) against a real MLflow SQLite store holding a small, fully known sweep.

The sweep: one parent run (attent.role=sweep) with Hard and Soft AtteNT configs x 3 seeds as
children, a full-data baseline x 3 seeds as standalone runs, one child still RUNNING and one
KILLED (left out, counted). Every final metric is chosen so means and stds are exact: stds are
sample stds (ddof=1), e.g. method cost of the full runs [100, 110, 120] -> 110.0 ± 10.0.
The store is built by tests/helpers/report_store.py; test_report_budgets.py (fixed sample ratios, configurations
differing in more than the seed, budgets) and test_report_verdicts.py (plateau control, verdicts) add
their own experiments to their own copy of it.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from attent.analysis.paper_tables.experiment_runs import HISTORY_KEYS, load_experiment_runs, load_histories
from attent.analysis.paper_tables.figures import time_to_reach_baseline
from attent.analysis.paper_tables.layouts import comparison_table
from attent.analysis.paper_tables.report import build_report
from attent.analysis.paper_tables.table_files import to_markdown
from attent.cli.main import main as attent_main
from mlflow import MlflowClient

from tests.helpers.report_store import EXPERIMENT


@pytest.fixture(scope="module")
def report(known_sweep_store):
    uri, _, out = known_sweep_store
    return build_report(EXPERIMENT, tracking_uri=uri, out_dir=out)


HEADERS = (
    "| Ratio schedule | Interval schedule | Strategy | n | Method cost (s) "
    "| Δ cost vs full "
    "| Ideal saving | Realized saving | Realized / ideal | Selected ratio | Eval (s) "
    "| accuracy | loss | accuracy 95% CI | vs full data |"
)
EXPECTED_ABLATION = (
    HEADERS
    + """
|:---|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|
| — | — | Full data | 3 | 110.0 ± 10.0 | +0.0% | 0.0% | 0.0% | — | 1.000 | 20.0 ± 4.0 | 0.8200 ± 0.0200 | 0.5200 ± 0.0200 | [0.7703, 0.8697] | reference |
| cosine(0.2→0.8) | incremental(1→4) | Random | 0 | — | — | — | — | — | — | — | — | — | — | — |
| cosine(0.2→0.8) | incremental(1→4) | Hard | 3 | **66.0 ± 6.0** | -40.0% | 50.0% | 40.0% | 0.80 | 0.500 | 20.0 ± 4.0 | 0.8000 ± 0.0100 | 0.6100 ± 0.0100 | [0.7752, 0.8248] | inconclusive (-0.0200) |
| cosine(0.2→0.8) | incremental(1→4) | Soft | 3 | 77.0 ± 7.0 | -30.0% | 45.0% | 30.0% | 0.67 | 0.550 | 20.0 ± 4.0 | **0.8400 ± 0.0100** | **0.4600 ± 0.0100** | [0.8152, 0.8648] | inconclusive (+0.0200) |

Plateau: undetermined: no 2E control (no full-data run for 2E epochs beside the E-epoch ones).

Nothing shows that full data had plateaued at E epochs: the table may measure the training budget, not the selection.

Verdicts (final accuracy, each row's against full data of its context, in brackets the mean paired difference): \
paired t-tests over seeds, Holm-adjusted across the table's 2 comparisons at 0.05, give "better" / "worse"; \
else "equivalent within ± 0.01" by a paired TOST, Holm-adjusted likewise; else "inconclusive". Rows with one \
seed are not judged. Interval column: the 95 % t-interval over seeds of the row's mean."""
)


def test_picks_the_ablation_layout_and_counts_runs(report):
    assert [t.name for t in report.tables] == ["ablation"]
    assert (report.runs, report.unfinished, report.killed) == (9, 1, 1)
    index = (report.out_dir / "report.md").read_text()
    assert "9 finished training runs; 1 unfinished and 1 killed runs (their driver died mid-run) left out." in index


def test_ablation_markdown_cells(report):
    """Means, sample stds, % time vs the full row, bold best (lowest time and loss, highest
    accuracy) and the Random row nobody ran rendered as — cells; the 95 % seed interval of the
    accuracy (t with 2 degrees of freedom: full data 0.82 ± 4.303 × 0.02 / √3), the verdicts against
    full data (Hard and Soft differ by ∓0.02, p = 0.074 each, 0.148 after Holm: inconclusive), and
    the notes: no control (the runs logged no epochs), the rule of the verdicts."""
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
    assert (
        r"cosine(0.2$\rightarrow$0.8) & incremental(1$\rightarrow$4) & Soft & 3 & "
        r"77.0 $\pm$ 7.0 & -30.0\% & 45.0\% & 30.0\% & 0.67 & 0.550"
    ) in tex
    assert r"\begin{tabular}{lllrrrrrrrrrrrl}" in tex  # the verdicts left-aligned, as text
    assert r"[0.7752, 0.8248] & inconclusive (-0.0200) \\" in tex


def test_files_written_and_logged_to_the_sweep_parent(known_sweep_store, report):
    uri, parent_id, _ = known_sweep_store
    expected = {
        "ablation.md",
        "ablation.csv",
        "ablation.tex",
        "ablation_comparisons.csv",
        "report.md",
        "fig_training_time.png",
        "fig_loss_curves.png",
        "fig_time_to_baseline.png",
        "fig_sample_ratio.png",
    }
    assert {p.name for p in report.files} == expected
    assert all(p.stat().st_size > 0 for p in report.files)
    assert report.logged_to == [parent_id]
    logged = MlflowClient(uri).list_artifacts(parent_id, "report")
    assert {Path(f.path).name for f in logged} == expected


def test_time_to_reach_the_baseline_accuracy(known_sweep_store):
    """Target = full runs' mean final accuracy 0.82. Soft reaches 0.825 at epoch 2, at 3/4 of
    its final method cost (52.5, 57.75, 63 s, from the parts: its runs predate time_method_s;
    the wall time with evaluation would be more); Hard tops out at 0.81 and never reaches it."""
    client = MlflowClient(known_sweep_store[0])
    runs = load_experiment_runs(client, EXPERIMENT).runs
    histories = load_histories(client, runs["run_id"].tolist(), [*HISTORY_KEYS, "eval_accuracy"])
    reach = time_to_reach_baseline(runs, histories, "eval_accuracy").set_index("config")
    soft = reach.loc["Soft · cosine · incremental"]
    assert (soft["mean"], soft["std"]) == pytest.approx((57.75, 5.25))
    assert (soft["n"], soft["runs"]) == (3, 3)
    assert reach.loc["Hard · cosine · incremental", "n"] == 0


def test_comparison_layout_splits_attent_configs_and_keeps_missing_methods(known_sweep_store):
    runs = load_experiment_runs(MlflowClient(known_sweep_store[0]), EXPERIMENT).runs
    table = comparison_table(runs)
    assert table.labels["Method"].tolist() == [
        "AtteNT (Hard · cosine · incremental)",
        "AtteNT (Soft · cosine · incremental)",
        "Class weight",
        "Group weight",
        "GradNorm",
        "InfoBatch",
        "Random subset",
        "Full data",
    ]
    assert table.stats["n"].tolist() == [3, 3, 0, 0, 0, 0, 0, 3]
    assert table.stats["cost_change_pct"].iloc[1] == pytest.approx(-30.0)


def test_missing_experiment_and_no_finished_runs_give_a_message(known_sweep_store, tmp_path, capsys):
    uri = known_sweep_store[0]
    assert attent_main(["report", "--experiment", "nope", "--tracking-uri", uri, "--out", str(tmp_path)]) == 1
    assert "experiment 'nope' does not exist" in capsys.readouterr().err

    client = MlflowClient(uri)
    running = client.create_experiment("running-only", artifact_location=str(tmp_path / "a"))
    client.create_run(running, tags={"attent.role": "run"})
    args = ["report", "--experiment", "running-only", "--tracking-uri", uri, "--out", str(tmp_path)]
    assert attent_main(args) == 1
    err = capsys.readouterr().err
    assert "has no finished training runs (1 unfinished, 0 killed)" in err and "Traceback" not in err
