"""The engine on a stream (``stream:``): the recipe's epochs on rows as Ray Data yields them (a
plain shard with ``iter_rows`` here, read in a fixed order). A run of two Ray Train workers on Ray
Data's own shards of an image folder, restarted from its checkpoint: tests/system/test_engine_stream.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attent.engine.preemption import INSIDE_EPOCH, rng_state
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import build_experiment
from attent.selection.stream import stream_pools
from PIL import Image
from sklearn.datasets import load_digits

B = 16


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    """sklearn's digits as PNGs in class subfolders: 240 to train on, 120 to test."""
    root = tmp_path_factory.mktemp("digits-folder")
    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))[:360]
    for position, i in enumerate(order):
        folder = root / ("train" if position < 240 else "test") / str(digits.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8)).save(folder / f"{i}.png")
    return root


def experiment(root, name: str = "stream", **sections):
    data = {
        "name": name,
        "seed": 3,
        "task": {
            "name": "vision",
            "dataset": "image_folder",
            "data_path": str(root),
            "img_size": 8,
            "color_mode": "grayscale",
            "model": {"preset": "vit_tiny_cpu", "patch_size": 2},
        },
        "stream": {"path": str(root / "train")},
        "train": {"epochs": 2, "batch_size": B, "lr": 5e-3},
        # Hard from the first pool, at r = 0.5: pools of 2 B
        "selection": {"method": "attent", "strategy": "hard", "warmup_epochs": 0, "ratio": {"start": 0.5}},
    }
    return build_experiment({**data, **sections})


class Shard:
    """Rows as Ray Data's ``read_images(..., include_paths=True)`` yields them, in a fixed order."""

    def __init__(self, root):
        self.files = sorted((root / "train").glob("*/*.png"), key=lambda path: path.stem)

    def iter_rows(self):
        for path in self.files:
            yield {"image": np.array(Image.open(path)), "path": str(path)}


def stream_recipe(root, cfg=None) -> TrainingRecipe:
    shard = Shard(root)
    recipe = TrainingRecipe(cfg or experiment(root), WorkerContext(), stream=(shard, len(shard.files)))
    recipe.setup()
    return recipe


def test_each_step_trains_on_the_highest_loss_half_of_a_pool_scored_after_the_step_before(digits_folder):
    recipe = stream_recipe(digits_folder)
    events, pools = [], []
    score = recipe.selector.pools.loss_fn

    def scored(model, batch):
        scores = score(model, batch)
        events.append("score")
        pools.append((batch, scores))
        return scores

    recipe.selector.pools.loss_fn = scored
    recipe.optimizer.register_step_pre_hook(lambda *_: events.append("step"))
    trained = []
    task_loss = recipe.task.per_sample_loss

    def training_loss(model, batch):
        if model.training:  # the step's forward (pools are scored, and the test set evaluated, in eval mode)
            trained.append(batch["label"].clone())
        return task_loss(model, batch)

    recipe.task.per_sample_loss = training_loss

    rows = [recipe.run_epoch(epoch) for epoch in range(2)]

    pools_per_epoch = [len(sizes) for sizes in stream_pools(recipe.cfg.selection, B, 240, 2)]
    assert pools_per_epoch == [7, 7]  # 240 rows: 7 pools of 32 a pass (the last 16 rows not drawn)
    assert events == ["score", "step"] * 14  # each pool scored by the weights of the step that trains it
    for (pool, scores), labels in zip(pools, trained):
        top = torch.sort(torch.topk(scores, B).indices).values
        assert torch.equal(pool["label"][top], labels)  # the B of highest loss, in the stream's order
    assert [row["selected_ratio"] for row in rows] == [0.5, 0.5]
    summary = recipe.selector.plan.summary()  # what the run logs as plan.json
    assert [(p["pools"], p["ratio"]) for p in summary["passes"]] == [(7, 0.5), (7, 0.5)]
    assert summary["label"].endswith("from a stream's pools")
    assert rows[-1]["samples_backpropagated"] == 14 * B
    assert rows[-1]["samples_forwarded"] == 14 * B + 14 * 2 * B  # trained + scored
    assert all(np.isfinite(row["train_loss"]) for row in rows)


def test_a_run_preempted_inside_a_pass_resumes_at_its_next_pool_to_the_same_weights(digits_folder):
    uninterrupted = stream_recipe(digits_folder)
    for epoch in range(2):
        uninterrupted.run_epoch(epoch)

    stopped = stream_recipe(digits_folder)
    stopped.run_epoch(0)
    saved = {}

    def after_step(epoch, step, steps):
        if epoch == 1 and step == 3:
            part = {"selector": stopped.selection_part(), "rng": rng_state(torch.device("cpu"))}
            saved.update(
                stopped.state_dict(), **{INSIDE_EPOCH: {"epoch": 1, "step": 3, "world_size": 1, "ranks": [part]}}
            )
            raise KeyboardInterrupt  # the node goes away

    stopped.after_step = after_step
    with pytest.raises(KeyboardInterrupt):
        stopped.run_epoch(1)

    resumed = stream_recipe(digits_folder)
    resumed.restore(saved)
    row = resumed.run_epoch(1)

    for a, b in zip(uninterrupted.raw_model.parameters(), resumed.raw_model.parameters()):
        assert torch.equal(a, b)
    assert row["samples_backpropagated"] == 14 * B


def test_a_stream_is_refused_for_what_it_cannot_follow(digits_folder):
    with pytest.raises(ValueError, match="needs a training set it can index"):
        experiment(digits_folder, selection={"method": "infobatch"})
    with pytest.raises(ValueError, match="task llm reads no image_folder stream"):
        build_experiment(
            {
                "name": "s",
                "task": {"name": "llm", "model": "smollm2-135m-instruct", "dataset": "gsm8k"},
                "train": {"epochs": 1},
                "stream": {"path": str(digits_folder)},
            }
        )


def test_attent_plan_prices_the_stream_run_it_then_trains_and_scores(digits_folder, tmp_path, capsys):
    import json

    import yaml
    from attent.cli.main import main
    from attent.experiment.files import load_experiment

    cfg = experiment(digits_folder, train={"epochs": 3, "batch_size": B}, selection={"preset": "llm"})
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True)))
    assert main(["plan", str(path), "--mfu", "0.5", "--json", str(tmp_path / "plan.json")]) == 0
    capsys.readouterr()
    (planned,) = json.loads((tmp_path / "plan.json").read_text())["runs"]

    recipe = stream_recipe(digits_folder, load_experiment(path))
    rows = [recipe.run_epoch(epoch) for epoch in range(3)]
    trained = rows[-1]["samples_backpropagated"]
    scored = rows[-1]["samples_forwarded"] - trained

    assert planned["work"]["samples"] == 240
    assert (planned["work"]["trained"], planned["work"]["scored"]) == (trained, scored)
    assert scored > 0 and rows[0]["selected_ratio"] == 1.0 > rows[1]["selected_ratio"]  # the warm-up pass unscored


def test_a_stream_with_no_images_is_refused_before_anything_starts(digits_folder, tmp_path):
    from attent.engine.preflight import check_experiment
    from attent.experiment.schema import PreflightError

    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        cfg = experiment(
            digits_folder, stream={"path": str(path)}, mlflow={"tracking_uri": f"sqlite:///{tmp_path}/m.db"}
        )
        with pytest.raises(PreflightError, match="holds no image"):
            check_experiment(cfg.resolved())


def test_a_nan_training_loss_stops_a_stream_epoch_before_its_step(digits_folder):
    recipe = stream_recipe(digits_folder)
    task_loss, calls = recipe.task.per_sample_loss, []

    def loss_with_a_nan(model, batch):
        losses = task_loss(model, batch)
        calls.append(model.training)
        return losses * float("nan") if sum(calls) == 3 and model.training else losses

    recipe.task.per_sample_loss = loss_with_a_nan
    before = [p.detach().clone() for p in recipe.raw_model.parameters()]
    steps = []
    recipe.optimizer.register_step_pre_hook(lambda *_: steps.append(1))
    with pytest.raises(ValueError, match="non-finite loss at the optimiser step after training batch 3"):
        recipe.run_epoch(0)
    assert len(steps) == 2 and any(not torch.equal(a, b) for a, b in zip(before, recipe.raw_model.parameters()))


def test_the_tasks_own_training_set_as_a_stream_reads_every_sample_once_a_pass_in_a_new_order(digits_folder):
    cfg = experiment(digits_folder, stream={"format": "task"}, train={"epochs": 2, "batch_size": B})
    recipe = TrainingRecipe(cfg, WorkerContext())
    recipe.setup()
    rows = recipe.train_set
    orders = []
    for epoch in range(2):
        rows.set_epoch(epoch)
        orders.append([item["index"] for item in rows])
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(len(recipe.task.train_dataset())))
    assert orders[0] != orders[1]
    row = recipe.run_epoch(0)
    assert row["selected_ratio"] == 0.5 and row["samples_backpropagated"] == B * (len(orders[0]) // (2 * B))
    with pytest.raises(ValueError, match="drop stream.path"):
        experiment(digits_folder, stream={"format": "task", "path": str(digits_folder)})
