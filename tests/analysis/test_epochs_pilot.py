"""The epoch pilot's reading (analysis/paper_tables/epochs_pilot.py) on synthetic finals: the smallest plateaued E,
"still improving" for a count whose doubling gains clearly, and no test metric read."""

import pandas as pd
import pytest
from attent import contract
from attent.analysis import ReportError
from attent.analysis.mlflow_runs import EPOCHS, METHOD, SEED, metric
from attent.analysis.paper_tables.epochs_pilot import pilot_finals, pilot_rows
from attent.analysis.stats import PLATEAUED, STILL_RISING

# Final validation accuracy per (epochs, seed): +0.05 from 30 to 60 epochs, about 0 from 60 to 120.
FINALS = {30: [0.85, 0.86, 0.84], 60: [0.90, 0.912, 0.888], 120: [0.901, 0.911, 0.889]}


def runs(finals=FINALS, name="eval_val_accuracy") -> pd.DataFrame:
    rows = [
        {METHOD: contract.METHOD_FULL, EPOCHS: str(e), SEED: str(s), metric(name): v, metric("eval_test_accuracy"): 0.5}
        for e, values in finals.items()
        for s, v in enumerate(values)
    ]
    rows.append({METHOD: contract.METHOD_ATTENT, EPOCHS: "30", SEED: "0", metric(name): 0.99})  # not full data
    return pd.DataFrame(rows)


def test_the_pilot_picks_the_smallest_count_whose_doubling_gains_less_than_the_tolerance():
    table, chosen = pilot_rows(pilot_finals(runs(), "eval_val_accuracy"), lower=False)
    verdicts = dict(zip(table["epochs"], table["verdict"]))
    assert verdicts[30] == STILL_RISING and verdicts[60] == PLATEAUED and verdicts[120] == "no 2E run"
    assert chosen == 60
    assert table.set_index("epochs").loc[30, "gain"] == pytest.approx(0.05, abs=1e-9)


def test_no_count_is_chosen_while_every_doubling_still_gains():
    rising = {30: [0.80, 0.81, 0.79], 60: [0.85, 0.86, 0.84], 120: [0.90, 0.91, 0.89]}
    table, chosen = pilot_rows(pilot_finals(runs(rising), "eval_val_accuracy"), lower=False)
    assert chosen is None and table.set_index("epochs").loc[60, "verdict"] == STILL_RISING


def test_the_pilot_reads_no_test_metric():
    with pytest.raises(ReportError, match="validation metrics only"):
        pilot_finals(runs(), "eval_test_accuracy")
    with pytest.raises(ReportError, match="task.val_limit"):
        pilot_finals(runs(name="eval_val_loss"), "eval_val_accuracy")


def test_the_pilot_figure_draws_each_seed_the_mean_and_e():
    from attent.analysis.paper_tables.epochs_pilot import pilot_figure

    (ax,) = pilot_figure(pilot_finals(runs(), "eval_val_accuracy"), 60, "eval_val_accuracy").axes
    assert len(ax.lines) == 3 + 1 + 1  # three seeds, their mean, the chosen E
    assert list(ax.lines[3].get_ydata()) == pytest.approx([0.85, 0.90, 0.9003333], abs=1e-6)


def test_the_pilot_reads_a_real_store_and_logs_its_table_and_figure_to_the_sweep(tmp_path, capsys):
    from attent.analysis.paper_tables.epochs_pilot import main
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("pilot", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(experiment, tags={contract.TAG_ROLE: contract.ROLE_SWEEP}).info.run_id
    for epochs, values in FINALS.items():
        for seed, value in enumerate(values):
            run = client.create_run(
                experiment,
                tags={
                    contract.TAG_ROLE: contract.ROLE_TRIAL,
                    contract.TAG_PARENT_RUN_ID: parent,
                    contract.TAG_METHOD: contract.METHOD_FULL,
                },
            ).info.run_id
            client.log_param(run, contract.PARAM_SEED, seed)
            client.log_param(run, contract.PARAM_EPOCHS, epochs)
            client.log_metric(run, "eval_val_accuracy", value)
            client.set_terminated(run, "FINISHED")
    assert main(["--experiment", "pilot", "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 0
    assert "E = 60: the smallest count" in capsys.readouterr().out
    assert (tmp_path / "out" / "pilot" / "epochs_pilot.png").stat().st_size > 0
    logged = {f.path for f in client.list_artifacts(parent, "report")}
    assert logged == {"report/epochs_pilot.md", "report/epochs_pilot.png"}
