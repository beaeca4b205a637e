"""The LLM task on a stream of GSM8K records: Ray Data's JSONL rows become the task's own items,
and the recipe trains on the picks of each pool (the real SmolLM2-135M with LoRA)."""

from __future__ import annotations

import json

import pytest
import torch
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import build_experiment
from attent.selection.config import deep_merge

from tests.helpers.paths import SHARED
from tests.helpers.shared_runs import REFERENCE_RUNS

ROWS, B = 8, 2


@pytest.fixture(scope="module")
def gsm8k_rows(tmp_path_factory):
    """The first ROWS records of the GSM8K training mirror, as a JSONL stream."""
    path = tmp_path_factory.mktemp("gsm8k-stream") / "train.jsonl"
    with (SHARED / "datasets" / "gsm8k" / "train.jsonl").open(encoding="utf-8") as source:
        records = [json.loads(next(source)) for _ in range(ROWS)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path, records


def experiment(path):
    """The reference LLM run's model and data (``shared_runs``), its first ROWS problems read as a
    JSONL stream, Hard on each pool of 2 B."""
    task = deep_merge(
        REFERENCE_RUNS["llm"]["task"],  # split_seed 0: the set's first train_limit problems, the stream's
        {"train_limit": ROWS, "max_length": 96, "eval": {"suites": ["gsm8k_loss"], "response_loss_limit": 2}},
    )
    return build_experiment(
        {
            "name": "llm-stream",
            "seed": 0,
            "task": task,
            "stream": {"format": "jsonl", "path": str(path)},
            "train": {"epochs": 1, "batch_size": B, "lr": 2e-4},
            "selection": {"method": "attent", "strategy": "hard", "warmup_epochs": 0, "ratio": {"start": 0.5}},
        }
    )


class Shard:
    def __init__(self, records):
        self.records = records

    def iter_rows(self):
        yield from self.records


def test_ray_datas_jsonl_rows_are_the_tasks_items_and_the_recipe_trains_on_each_pools_top_half(gsm8k_rows, ray_cluster):
    from attent.engine.stream_data import stream_datasets

    path, records = gsm8k_rows
    cfg = experiment(path).resolved()
    payload = {}
    dataset = stream_datasets(cfg, payload)["train"]
    rows = list(dataset.iter_rows())
    assert payload["stream_rows"] == ROWS and cfg.stream.local_rows() == ROWS
    assert [row["question"] for row in rows] == [record["question"] for record in records]

    recipe = TrainingRecipe(cfg, WorkerContext(), stream=(Shard(rows), ROWS))
    recipe.setup()
    indexed = recipe.task.train_dataset()
    for index, row in enumerate(rows):  # the map-style item of the same problem, token for token
        assert recipe.task.stream_item(row, index) == indexed[index]

    pools, trained = [], []
    score = recipe.selector.pools.loss_fn
    recipe.selector.pools.loss_fn = lambda model, batch: pools.append((batch, score(model, batch))) or pools[-1][1]
    task_loss = recipe.task.per_sample_loss

    def training_loss(model, batch):
        if model.training:
            trained.append(batch["input_ids"].clone())
        return task_loss(model, batch)

    recipe.task.per_sample_loss = training_loss
    row = recipe.run_epoch(0)

    assert len(pools) == len(trained) == ROWS // (2 * B)
    for (pool, scores), ids in zip(pools, trained):
        top = torch.sort(torch.topk(scores, B).indices).values
        picked = pool["input_ids"][top][:, : ids.shape[1]]  # the pool pads to its longest, a batch to its own
        assert torch.equal(picked, ids)
    assert row["samples_backpropagated"] == ROWS // 2 and torch.isfinite(torch.tensor(row["train_loss"]))
