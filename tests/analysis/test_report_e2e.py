"""End to end: the two small digits sweeps (``shared_runs``: Ray Tune + Train on the session's
Ray cluster, MLflow in SQLite), then ``attent.analysis.paper_tables.report.build_report`` on what they logged.

Fixed sample ratios 80 and 50 % plus full data (the paper's Table 7); and the ablation (Table 3):
full data, the incremental ratio schedule at two soft-selection temperatures (they share a label
and must not be averaged together) and the cosine schedule. What the tables need from the
engine is the MLflow contract (``attent.contract``): if the engine does not log one of its names,
the first test says which.
"""

from __future__ import annotations

import math

import pytest
from attent import contract
from attent.analysis.paper_tables.report import Report, build_report
from mlflow import MlflowClient

from tests.helpers.shared_runs import ABLATION_SWEEP, RATIO_SWEEP


@pytest.fixture(scope="module")
def store(digits_sweeps) -> tuple[str, dict[str, Report]]:
    """(tracking URI, report per sweep): each sweep's own MLflow experiment reported."""
    uri = digits_sweeps.tracking_uri
    return uri, {
        name: build_report(name, tracking_uri=uri, out_dir=digits_sweeps.root / "reports")
        for name in (RATIO_SWEEP, ABLATION_SWEEP)
    }


def test_engine_logs_what_the_report_reads(store):
    """Every finished trial carries the contract's tags, params and final metrics."""
    client = MlflowClient(store[0])
    experiment = client.get_experiment_by_name(ABLATION_SWEEP)
    runs = client.search_runs([experiment.experiment_id], f"tags.`{contract.TAG_ROLE}` = '{contract.ROLE_TRIAL}'")
    assert len(runs) == 4
    tags = (
        contract.TAG_IDENTITY,
        contract.TAG_RATIO_REACHED,
        contract.TAG_LABEL,
        contract.TAG_METHOD,
        contract.TAG_RATIO_SCHEDULE,
        contract.TAG_INTERVAL_SCHEDULE,
    )
    params = (contract.PARAM_SEED, contract.PARAM_RATIO_KIND, contract.PARAM_RATIO_START, contract.PARAM_TEMPERATURE)
    metrics = (
        contract.TIME_METHOD,
        contract.time_metric("eval"),
        contract.SAMPLES_BACKPROPAGATED,
        contract.MEAN_SELECTED_RATIO,
    )
    for run in runs:
        missing = (
            [f"tag {t}" for t in tags if t not in run.data.tags]
            + [f"param {p}" for p in params if p not in run.data.params]
            + [f"metric {m}" for m in metrics if m not in run.data.metrics]
        )
        label = run.data.tags.get(contract.TAG_LABEL)
        assert not missing, f"{label}: the engine does not log {missing}"
    assert len({run.data.tags[contract.TAG_IDENTITY] for run in runs}) == 4


def test_ratio_sweep_builds_the_sample_ratio_table(store):
    report = store[1][RATIO_SWEEP]
    assert [t.name for t in report.tables] == ["ratio"]
    table = report.tables[0]
    rows = dict(zip(table.labels["Sample ratio"], table.stats.index))
    n = table.stats["n"]
    assert {label: n[row] for label, row in rows.items()} == {
        "100% (full data)": 1,
        "90%": 0,
        "80%": 1,
        "70%": 0,
        "60%": 0,
        "50%": 1,
        "40%": 0,
    }
    ran = [rows[r] for r in ("100% (full data)", "80%", "50%")]
    assert table.stats.loc[ran, "ideal_saving"].tolist() == pytest.approx([0.0, 0.2, 0.5], abs=0.01)
    assert table.stats.loc[ran, "mean_selected_ratio_mean"].tolist() == pytest.approx([1.0, 0.8, 0.5], abs=0.01)
    assert table.stats.loc[ran, "time_method_s_mean"].gt(0).all()
    text = (report.out_dir / "ratio.md").read_text(encoding="utf-8")
    assert text.startswith("| Sample ratio | Strategy | Interval schedule | n | Method cost (s) |")
    # One seed, 2 epochs, no 4-epoch full-data run: no plateau shown and no verdicts.
    assert "Plateau: undetermined: no 2E control (no full-data run for 4 epochs beside the 2-epoch ones)." in text
    assert set(table.verdicts["vs full data"]) == {"reference", "one seed: not judged", "—"}


def test_ablation_sweep_builds_the_ablation_table_one_row_per_temperature(store):
    report = store[1][ABLATION_SWEEP]
    assert [t.name for t in report.tables] == ["ablation"]
    table = report.tables[0]
    ran = table.labels[table.stats["n"].gt(0)]
    assert table.stats.loc[ran.index, "n"].tolist() == [1] * 4
    assert ran.values.tolist() == [
        ["—", "—", "Full data", ""],
        ["incremental(0.2→0.8)", "incremental(1→4)", "Soft", "temperature=0.5"],
        ["incremental(0.2→0.8)", "incremental(1→4)", "Soft", "temperature=2.0"],
        ["cosine(0.2→0.8)", "incremental(1→4)", "Soft", ""],
    ]
    costs = table.stats.loc[ran.index, "time_method_s_mean"]
    assert all(cost > 0 and not math.isnan(cost) for cost in costs)
    assert table.stats.loc[ran.index[1:], "ideal_saving"].gt(0.2).all()  # ratios below 80 %
