"""AtteNT in Hugging Face's Trainer: LoRA on SmolLM2-135M-Instruct, GSM8K, the ``llm`` preset
(epoch 1 on all problems, then each epoch the 70% whose answers have the highest loss).

    PYTHONPATH=platform python examples/hf_trainer.py --limit 200 --epochs 3

Needs `pip install 'attent[hf,peft]' datasets` (LoRA is peft's, GSM8K is read with datasets; from a
clone, `pip install '.[hf,peft]' datasets`).

The prompt's labels are -100, so a problem's loss is the mean loss of its answer's tokens.
Prints one JSON line per epoch, the selection as Trainer logged it, and a last line with the
steps taken and planned (the test suite reads them).
"""

from __future__ import annotations

import argparse
import json

import attent
import datasets
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, TrainingArguments


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
    parser.add_argument("--output-dir", default="runs/hf_trainer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    train_set = load_gsm8k(args.data, args.limit)
    train_set = train_set.map(
        tokenize, fn_kwargs=dict(tokenizer=tokenizer, max_length=args.max_length), remove_columns=train_set.column_names
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))

    trainer = attent.AtteNTTrainer(
        model=model,
        train_dataset=train_set,
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True),  # pads the labels with -100
        selection=attent.SelectionConfig(preset=args.preset),  # who picks the samples, how many, how often
        args=TrainingArguments(
            output_dir=args.output_dir,
            num_train_epochs=args.epochs,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=args.accumulation,
            learning_rate=args.lr,
            lr_scheduler_type="cosine",  # sized by the planned subsets: it ends with the run
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
