"""AtteNT's Hugging Face Trainer under Ray Train: the LoRA job of examples/hf_trainer.py (SmolLM2-135M-Instruct
on GSM8K, the ``llm`` preset) on several Ray Train workers, logged to MLflow by Trainer's MLflow callback.

    python examples/ray_hf_trainer.py --limit 200    # a local Ray; MLflow: $MLFLOW_TRACKING_URI or ./mlflow.db
    export RAY_AUTH_MODE=token                             # a Ray started from this venv, as the README says
    ray job submit --working-dir . -- python examples/ray_hf_trainer.py --limit 200 \\
        --tracking-uri sqlite:////abs/path/mlflow.db --output-dir /abs/path/runs/ray_hf_trainer

Needs `pip install 'attent[platform]'` (Ray Train, MLflow, transformers, peft, datasets; from a clone,
`pip install '.[platform]'`).

Every worker builds the same AtteNTTrainer (same data, same seed): Ray's process group makes them one
DDP job, the ranks merge their per-sample losses, pick the same subset and each trains on its own shard
of it. Each rank writes what it chose and trained on to OUTPUT_DIR/rank<r>/selection.json (the test suite
reads them, with rank 0's MLflow run id); the driver prints Ray's result (its checkpoint, the metrics
reported with it) as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os

import attent
import datasets
import mlflow
import ray.train
import torch
from peft import LoraConfig, get_peft_model
from ray.train import RunConfig, ScalingConfig
from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from ray.train.torch import TorchTrainer
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, TrainerCallback, TrainingArguments


def load_gsm8k(path: str | None, limit: int) -> datasets.Dataset:
    """GSM8K's training problems: a local JSONL (question, answer) or the hub's ``openai/gsm8k``."""
    data = (
        datasets.load_dataset("json", data_files=path, split="train")
        if path
        else datasets.load_dataset("openai/gsm8k", "main", split="train")
    )
    return data.select(range(min(limit, len(data)))) if limit else data


def tokenize(example: dict, tokenizer, max_length: int) -> dict:
    """The chat prompt, then the answer; labels -100 on the prompt (no loss there)."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": example["question"]}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    answer_ids = tokenizer(example["answer"] + tokenizer.eos_token, add_special_tokens=False).input_ids
    input_ids = (prompt_ids + answer_ids)[:max_length]
    labels = ([-100] * len(prompt_ids) + answer_ids)[:max_length]
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


class SelectionRecord(TrainerCallback):
    """Each epoch's subset (the same on every rank) and the samples this rank trained on: the indices
    whose losses reached the Selector, one per row of every training batch."""

    def __init__(self, trainer: attent.AtteNTTrainer):
        self.trainer, self.epochs = trainer, []

    def on_epoch_end(self, args, state, control, **kwargs):
        selector = self.trainer.selector
        self.epochs.append(
            {
                "epoch": selector.epoch,
                "subset": selector.subset.tolist(),
                "trained": selector.sampler.order[: selector.sampler.cursor].tolist(),
            }
        )


def train_loop_per_worker(config: dict) -> None:
    """One Ray Train worker: Ray has set up torch.distributed (RANK, WORLD_SIZE, the process group),
    which TrainingArguments picks up; from here on it is examples/hf_trainer.py."""
    # Trainer's MLflow callback reads these; only rank 0 opens the run and logs
    os.environ.update(MLFLOW_TRACKING_URI=config["tracking_uri"], MLFLOW_EXPERIMENT_NAME=config["experiment"])
    tokenizer = AutoTokenizer.from_pretrained(config["model"])
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    # The whole training set on every worker (AtteNT shards each epoch's subset), as a list: any
    # map-style dataset does, and datasets.map would hash `tokenize` with dill, whose bytecode dump
    # Ray Train's print patch copies into the worker logs.
    train_set = [
        tokenize(example, tokenizer, config["max_length"]) for example in load_gsm8k(config["data"], config["limit"])
    ]
    model = AutoModelForCausalLM.from_pretrained(config["model"], dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))

    rank = ray.train.get_context().get_world_rank()
    output_dir = os.path.join(config["output_dir"], f"rank{rank}")  # this worker's checkpoints
    trainer = attent.AtteNTTrainer(
        model=model,
        train_dataset=train_set,
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True),  # pads the labels with -100
        selection=attent.SelectionConfig(preset=config["preset"]),  # who picks the samples, how many, how often
        args=TrainingArguments(
            output_dir=output_dir,
            num_train_epochs=config["epochs"],
            per_device_train_batch_size=config["batch_size"],  # per worker
            gradient_accumulation_steps=config["accumulation"],
            learning_rate=config["lr"],
            lr_scheduler_type="cosine",  # sized by the planned subsets: it ends with the run
            ddp_find_unused_parameters=False,  # every LoRA adapter takes part in each forward
            logging_steps=config["logging_steps"],
            save_strategy="epoch",
            save_total_limit=1,  # RayTrainReportCallback hands each save to Ray Train
            report_to="mlflow",
            run_name=config["run_name"],
            seed=config["seed"],
            use_cpu=not config["use_gpu"],
        ),
    )  # without it accelerate runs CPU workers as W separate jobs
    trainer.add_callback(RayTrainReportCallback())  # metrics and checkpoint (adapter, each rank's selection state)
    trainer = prepare_trainer(trainer)  # Ray Data hook-up; a map-style dataset keeps AtteNT's loader (README)
    record = SelectionRecord(trainer)
    trainer.add_callback(record)
    trainer.train()

    with open(os.path.join(output_dir, "selection.json"), "w") as f:
        json.dump(
            {
                "rank": trainer.args.process_index,
                "world_size": trainer.args.world_size,
                "trainer": type(trainer).__name__,  # prepare_trainer's subclass of AtteNTTrainer
                "steps": trainer.state.global_step,
                "planned_steps": trainer.state.max_steps,
                "mlflow_run_id": mlflow.last_active_run().info.run_id if rank == 0 else None,
                "epochs": record.epochs,
            },
            f,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)  # Ray Train workers (DDP ranks), one CPU each
    parser.add_argument("--use-gpu", action="store_true")  # one GPU per worker instead
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")  # hub name or local folder
    parser.add_argument("--data", default=None)  # GSM8K JSONL; None: the hub's openai/gsm8k
    parser.add_argument("--limit", type=int, default=0)  # training problems used (0: all 7,473)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)  # per worker
    parser.add_argument("--accumulation", type=int, default=1)  # batches per optimiser step
    parser.add_argument("--max-length", type=int, default=512)  # tokens per problem, prompt included
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--preset", default="llm", choices=["llm", "vit"])
    parser.add_argument("--logging-steps", type=int, default=5)  # optimiser steps between training-loss logs
    parser.add_argument("--seed", type=int, default=0)  # the same on every worker: the same subsets
    # Paths the workers use: on a cluster, absolute and shared (a job runs in a copy of --working-dir)
    parser.add_argument(
        "--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.abspath('mlflow.db')}"
    )
    parser.add_argument("--experiment", default="ray-hf-trainer")  # the MLflow experiment
    parser.add_argument("--run-name", default="smollm2-gsm8k-lora")
    parser.add_argument("--output-dir", default="runs/ray_hf_trainer")  # each rank's Trainer folder
    parser.add_argument("--storage-path", default=None)  # Ray Train's checkpoints; None: ~/ray_results
    args = parser.parse_args()

    config = {**vars(args), "output_dir": os.path.abspath(args.output_dir)}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=RunConfig(storage_path=args.storage_path and os.path.abspath(args.storage_path)),
    )
    result = trainer.fit()
    print(
        json.dumps(
            {
                "checkpoint": result.checkpoint.path if result.checkpoint else None,
                "metrics": result.metrics,  # rank 0's log at the last checkpoint: loss, selection, ...
                "output_dir": config["output_dir"],
                "tracking_uri": config["tracking_uri"],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
