"""AtteNT in TRL's SFTTrainer: LoRA on SmolLM2-135M-Instruct, GSM8K as prompt-completion
conversations, the ``llm`` preset (epoch 1 on all problems, then each epoch the 70% whose answers
have the highest loss).

    PYTHONPATH=platform python examples/trl_sft.py --limit 200 --epochs 3

Needs `pip install 'attent[trl,peft]' datasets` (LoRA is peft's, GSM8K is read with datasets; from a
clone, `pip install '.[trl,peft]' datasets`).

TRL's completion_only_loss (on by default for prompt-completion data) labels the prompt -100, so
a problem's loss is the mean loss of its answer's tokens. Prints one JSON line per epoch, the
selection as Trainer logged it, and a last line with the steps taken and planned.
"""

from __future__ import annotations

import argparse
import json

import attent
import datasets
import torch
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig


def load_gsm8k(path: str | None, limit: int) -> datasets.Dataset:
    """GSM8K's training problems as conversations: the question prompts, the answer completes."""
    data = (
        datasets.load_dataset("json", data_files=path, split="train")
        if path
        else datasets.load_dataset("openai/gsm8k", "main", split="train")
    )
    data = data.select(range(min(limit, len(data)))) if limit else data
    return data.map(
        lambda row: {
            "prompt": [{"role": "user", "content": row["question"]}],
            "completion": [{"role": "assistant", "content": row["answer"]}],
        },
        remove_columns=data.column_names,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")  # hub name or local folder
    parser.add_argument("--data", default=None)  # GSM8K JSONL; None: the hub's openai/gsm8k
    parser.add_argument("--limit", type=int, default=0)  # training problems used (0: all 7,473)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accumulation", type=int, default=1)  # batches per optimiser step
    parser.add_argument("--max-length", type=int, default=512)  # tokens per problem, prompt included
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--preset", default="llm", choices=["llm", "vit"])
    parser.add_argument("--output-dir", default="runs/trl_sft")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = attent.AtteNTSFTTrainer(
        model=model,
        processing_class=tokenizer,
        train_dataset=load_gsm8k(args.data, args.limit),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
        selection=attent.SelectionConfig(preset=args.preset),  # who picks the samples, how many, how often
        args=SFTConfig(
            output_dir=args.output_dir,
            num_train_epochs=args.epochs,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=args.accumulation,
            learning_rate=args.lr,
            max_length=args.max_length,
            lr_scheduler_type="cosine",  # sized by the planned subsets: it ends with the run
            packing=False,  # AtteNT needs one problem per row (packing is refused)
            bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
            logging_steps=5,
            save_strategy="no",
            report_to="none",
            seed=args.seed,
        ),
    )
    trainer.train()

    for row in trainer.state.log_history:
        if "selected_ratio" in row:  # one per epoch: selected_ratio, selection_hardness, subset_checksum, ...
            print(json.dumps(row), flush=True)
    print(
        json.dumps(
            {
                "steps": trainer.state.global_step,
                "planned_steps": trainer.state.max_steps,
                "final_learning_rate": trainer.lr_scheduler.get_last_lr()[0],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
