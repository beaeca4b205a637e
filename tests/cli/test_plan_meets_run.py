"""`attent plan`'s budgets are what the run then trains and scores, for every method: the plan's
JSON (trained and scored sample-epochs) against the engine's recipe run on the same file (rank 0 of
1, the real digits data and a real timm ViT), whose Selector counts what it back-propagated and
what its scoring passes forwarded. InfoBatch's subsets are sized by its losses: its plan is an
estimate (drawn on random losses), and says so."""

from __future__ import annotations

import json

import pytest
import yaml
from attent import contract
from attent.cli.main import main
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.files import load_experiment

EPOCHS = 6
METHODS = {
    "vit": {"preset": "vit"},  # a scoring pass before every re-selection, Soft
    "llm": {"preset": "llm"},  # the training forwards' losses only
    "hard": {"strategy": "hard", "ratio": {"kind": "fixed", "start": 0.4}},
    "random": {"strategy": "random", "ratio": {"kind": "incremental", "start": 0.3, "end": 0.7}},
    "stale": {"preset": "vit", "rescore_stale": True},
    "fraction": {"preset": "vit", "rescore_fraction": 0.5},
    "cycles": {"preset": "vit", "interval": {"kind": "cycles", "cycles": 2, "start": 1}},
    "full": {"method": "full"},
    "class_weight": {"method": "class_weight", "ratio": {"kind": "fixed", "start": 0.5}},
    "group_weight": {"method": "group_weight", "group_weights": [1, 2] * 5, "ratio": {"kind": "fixed", "start": 0.5}},
    "gradnorm": {"method": "gradnorm", "ratio": {"kind": "fixed", "start": 0.6}},
    "infobatch": {"method": "infobatch"},
}


def experiment_file(tmp_path, selection: dict):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "plan-meets-run",
                "seed": 2,
                "task": {
                    "name": "vision",
                    "dataset": "digits",
                    "img_size": 8,
                    "train_limit": 160,
                    "model": {"preset": "vit_tiny_cpu", "patch_size": 4},
                },
                "train": {"epochs": EPOCHS, "batch_size": 32, "eval_every": EPOCHS},
                "selection": selection,
            }
        )
    )
    return path


@pytest.mark.parametrize("method", list(METHODS))
def test_the_plans_budget_is_what_the_run_trains_and_scores(method, tmp_path, capsys):
    path = experiment_file(tmp_path, METHODS[method])
    assert main(["plan", str(path), "--mfu", "0.5", "--json", str(tmp_path / "plan.json")]) == 0
    capsys.readouterr()
    (planned,) = json.loads((tmp_path / "plan.json").read_text())["runs"]

    recipe = TrainingRecipe(load_experiment(path), WorkerContext())
    recipe.setup()
    rows = [recipe.run_epoch(epoch) for epoch in range(EPOCHS)]
    trained = rows[-1][contract.SAMPLES_BACKPROPAGATED]
    scored = rows[-1][contract.SAMPLES_FORWARDED] - trained  # one rank: each trained sample forwarded once

    assert planned["work"]["samples"] == len(recipe.train_set) == 160
    if method == "infobatch":  # sized by its losses: the plan says it is an estimate
        assert planned["work"]["estimated"] and trained < EPOCHS * 160 and planned["work"]["scored"] == scored == 0
    else:
        assert (planned["work"]["trained"], planned["work"]["scored"]) == (trained, scored)
        assert not planned["work"]["estimated"]
