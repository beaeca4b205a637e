"""A price is a prediction: `attent plan --measure` of a small CPU run (the digits ViT in Ray
Train's local mode) predicts the method time that the run then records in MLflow
(``time_method_s``: training, scoring and selection).

The tolerance: on a quiet machine the plan predicts the run within 20 % (measured on AMD EPYC Zen 4,
2 cores: 1.04, 0.95, 1.01 over three runs; the pricing page's "A price is a prediction"). But the
two measurements are minutes apart and a test shares its machine with the rest of the suite (two
pytest workers, the system tier's clusters): under that load the same test measured 0.69 (3.15 s
predicted, 4.60 s run). So the test holds the prediction within a factor of two, which a wrong
price (a scoring pass not counted, a step counted twice, a unit slip: 2-4x) breaks and load does
not, and the 20 % stands on the study, measured on a quiet machine."""

from __future__ import annotations

import json

import mlflow
from attent.cli.main import main
from attent.contract import TIME_METHOD
from attent.engine.driver import train
from attent.experiment.files import load_experiment

from tests.helpers.paths import REPO

EXPERIMENT = REPO / "experiments/digits_vit.yaml"


def test_plan_measure_predicts_the_method_time_the_run_then_records(tmp_path, mlflow_uri, capsys):
    overrides = [
        "ray.num_workers=0",  # local mode: the run in this process, timed as the plan times its steps
        f"ray.storage_path={tmp_path / 'ray'}",
        f"mlflow.tracking_uri={mlflow_uri}",
        "mlflow.experiment=prediction",
    ]
    out = tmp_path / "plan.json"
    assert main(["plan", str(EXPERIMENT), *overrides, "--measure", "--json", str(out)]) == 0
    (planned,) = json.loads(out.read_text())["runs"]
    assert planned["utilisation"] is None and planned["work"]["scored"] > 0  # this CPU's seconds; scoring passes
    predicted = planned["method_gpu_hours"] * 3600 / planned["workers"]

    result = train(load_experiment(EXPERIMENT, overrides))
    measured = mlflow.MlflowClient(mlflow_uri).get_run(result.run_id).data.metrics[TIME_METHOD]
    capsys.readouterr()
    assert 0.5 <= predicted / measured <= 2.0, f"predicted {predicted:.2f} s, the run measured {measured:.2f} s"
