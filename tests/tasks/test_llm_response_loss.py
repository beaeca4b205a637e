"""LLMTask's response-loss metrics on the tiny random Llama of tests/helpers/llm_tiny.py (its fixtures): the
``gsm8k_loss`` suite's token-weighted loss of the GSM8K test solutions, summed over ranks, and
``val_loss`` on validation problems held out of the training data."""

# ruff: noqa: F811 -- the tests' arguments name the fixtures imported from tests.helpers.llm_tiny
import json

import pytest
import torch
from attent.tasks.llm.config import LLMTaskConfig
from attent.tasks.llm.evaluation.response_loss import response_loss_totals
from attent.tasks.llm.loss import response_token_loss
from attent.tasks.llm.task import LLMTask

from tests.helpers.llm_tiny import EXAMPLES, checkpoint, make_task, model, task, train_file  # noqa: F401  (fixtures)
from tests.helpers.paths import DATASETS


def test_gsm8k_loss_is_the_token_weighted_loss_of_the_test_solutions_shared_over_ranks(checkpoint, train_file, model):
    if not (DATASETS / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"{DATASETS} not present")
    task = make_task(
        checkpoint,
        train_file,
        data_dir=str(DATASETS),
        loss_chunk_tokens=16,
        split_seed=0,
        eval={"suites": ["gsm8k_loss"], "response_loss_limit": 5, "eval_batch_size": 2},
    )  # a fixed split: the first 5 test solutions
    messages: list[str] = []
    with torch.no_grad():
        metrics = task.evaluate(model, rank=0, world_size=1, progress=messages.append)
    assert set(metrics) == {"gsm8k_test_response_loss"}
    assert messages[-1].startswith("gsm8k_loss: response loss") and "5 answers" in messages[-1]

    # the test split's solutions, prepared exactly like GSM8K training examples
    answers = task.gsm8k_test_answers()
    assert len(answers) == 5
    first = json.loads((DATASETS / "gsm8k" / "test.jsonl").read_text().splitlines()[0])
    item = answers[0]
    n_prompt = item["labels"].count(-100)
    assert item["input_ids"][:n_prompt] == task.encode_prompt([first["question"]])
    response = task.tokenizer.decode(item["input_ids"][n_prompt:])
    assert "<<" in first["answer"] and "<<" not in response and "####" in response

    # token-weighted: all response tokens' cross-entropy over the number of response tokens
    loss_sum, tokens = 0.0, 0
    with torch.no_grad():
        for index in range(len(answers)):
            batch = task.collate([answers[index]])
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            n = int((batch["labels"][:, 1:] != -100).sum())
            loss_sum += float(response_token_loss(logits, batch["labels"])[0]) * n
            tokens += n
    assert metrics["gsm8k_test_response_loss"] == pytest.approx(loss_sum / tokens, rel=1e-5)

    # each rank scores every world_size-th solution; summed, the shards give the whole
    shards = [
        response_loss_totals(model, answers, task.collate, batch_size=2, chunk_tokens=16, rank=rank, world_size=2)
        for rank in (0, 1)
    ]
    assert [shard[2] for shard in shards] == [3, 2]  # solutions scored per rank
    assert sum(shard[1] for shard in shards) == tokens
    assert sum(shard[0] for shard in shards) == pytest.approx(loss_sum, rel=1e-5)


def test_gsm8k_loss_solutions_are_drawn_by_the_seed_unless_split_seed_fixes_them(checkpoint, train_file):
    if not (DATASETS / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"{DATASETS} not present")

    def questions(seed: int, split_seed: int | None = None) -> list[str]:
        config = LLMTaskConfig(
            model=str(checkpoint),
            dataset=str(train_file),
            data_dir=str(DATASETS),
            split_seed=split_seed,
            eval={"suites": ["gsm8k_loss"], "response_loss_limit": 5},
        )
        return [example.prompt for example in LLMTask(config, seed=seed).gsm8k_test_answers().examples]

    first = [json.loads(line)["question"] for line in (DATASETS / "gsm8k" / "test.jsonl").read_text().splitlines()[:5]]
    assert questions(1, split_seed=0) == questions(2, split_seed=0) == first
    assert questions(1) == questions(1) != questions(2)
    assert len(set(questions(1))) == 5


def test_validation_problems_are_held_out_and_scored_as_gsm8k_loss_scores_test_solutions(checkpoint, train_file, model):
    task = make_task(
        checkpoint,
        train_file,
        val_limit=1,
        train_limit=2,
        loss_chunk_tokens=16,
        eval={"suites": [], "eval_batch_size": 2},
    )
    train, val = task.train_dataset().examples, task.validation_dataset().examples
    assert len(train) == 2 and len(val) == 1 and not set(train) & set(val)
    assert {e.prompt for e in train + val} <= {e["prompt"] for e in EXAMPLES}

    messages: list[str] = []
    with torch.no_grad():
        metrics = task.evaluate(model, rank=0, world_size=1, progress=messages.append)
    assert set(metrics) == {"val_loss"} and messages[-1].startswith("val_loss: response loss")
    loss_sum, tokens, answers = response_loss_totals(
        model, task.validation_dataset(), task.collate, batch_size=2, chunk_tokens=16
    )
    assert answers == 1 and metrics["val_loss"] == pytest.approx(loss_sum / tokens, rel=1e-6)
    described = {(d.name, d.context, d.num_samples) for d in task.describe_data()}
    assert described == {("train-train", "train", 2), ("train-val", "validation", 1)}
    assert make_task(checkpoint, train_file).validation_dataset() is None


def test_gsm8k_loss_covers_the_whole_test_split_by_default(checkpoint, train_file):
    if not (DATASETS / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"{DATASETS} not present")
    task = make_task(
        checkpoint, train_file, data_dir=str(DATASETS), eval={"suites": ["gsm8k", "gsm8k_loss"], "eval_limit": None}
    )
    assert task.config.eval.response_loss_limit is None and task.config.eval.eval_limit is None
    assert len(task.gsm8k_test_answers()) == 1319
    assert len(task._suite("gsm8k").problems[: task.config.eval.eval_limit]) == 1319
