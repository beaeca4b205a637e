"""What AtteNTTrainer costs on top of Hugging Face's Trainer, and what its subsets save, on one device.

The arms train the same LoRA job, interleaved round by round (one run at a time); the first three
unless --arms names others (Trainer always runs):

    trainer          transformers.Trainer
    attent_full      AtteNTTrainer, SelectionConfig(method="full"): its sampler, per-sample loss and
                     bookkeeping, on all data (the integration's overhead alone)
    attent_llm       AtteNTTrainer, SelectionConfig(preset="llm"): epoch 1 on all samples, then the 70 %
                     with the highest losses
    attent_vit       AtteNTTrainer, SelectionConfig(preset="vit"): a scoring pass, then soft selection of
                     20 % rising to 80 % (only with --arms: the ViT variant on this LoRA job)

The model is SmolLM2-135M-Instruct's architecture (a Llama: 30 layers, 576 wide, a 49,152-token
vocabulary) built from its config with random weights, so the script needs no download; LoRA of rank
8 on every linear layer of the blocks. Data: synthetic token sequences of --length tokens whose first
quarter is the prompt (labels -100). Method time: the wall-clock from each epoch's on_epoch_begin to
its on_epoch_end (Trainer's whole epoch: AtteNTTrainer's scoring and re-selection, loading, forward,
backward, optimiser), synchronised with the device; start-up and model building are outside it.

    python benchmarks/overheads/hf_overhead.py --device cuda --samples 2048 --rounds 3     # a GPU node
    python benchmarks/overheads/hf_overhead.py --device cpu --samples 32 --length 64 --rounds 1 --layers 2 --out /tmp/smoke

Writes ``README.md`` (the table, the command, the machine) and ``runs.json`` (every round's epochs)
into --out, by default a new folder ``benchmarks/results/hf_overhead/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import attent
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

ARMS = ("trainer", "attent_full", "attent_llm", "attent_vit")
DEFAULT_ARMS = ARMS[:3]


def model(args) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=args.layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(LlamaForCausalLM(config), lora)


def samples(args) -> list[dict]:
    """--samples sequences of --length tokens; the first quarter is the prompt (no loss there)."""
    g = torch.Generator().manual_seed(0)
    prompt = args.length // 4
    items = []
    for _ in range(args.samples):
        ids = torch.randint(10, 49152, (args.length,), generator=g).tolist()
        items.append({"input_ids": ids, "attention_mask": [1] * args.length, "labels": [-100] * prompt + ids[prompt:]})
    return items


def collate(items: list[dict]) -> dict[str, torch.Tensor]:
    return {key: torch.tensor([item[key] for item in items]) for key in items[0]}


def run(arm: str, args, data: list[dict], out: str) -> dict:
    clock = harness.epoch_clock(args.device)
    training = TrainingArguments(
        output_dir=out,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch,
        learning_rate=1e-4,
        lr_scheduler_type="cosine",
        bf16=args.device == "cuda",
        use_cpu=args.device == "cpu",
        save_strategy="no",
        report_to="none",
        logging_steps=10_000,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    common = dict(model=model(args), args=training, train_dataset=data, data_collator=collate, callbacks=[clock])
    if arm == "trainer":
        trainer = Trainer(**common)
    else:
        config = (
            attent.SelectionConfig(method="full")
            if arm == "attent_full"
            else attent.SelectionConfig(preset=arm.removeprefix("attent_"))
        )
        trainer = attent.AtteNTTrainer(**common, selection=config)
    trainer.train()
    backpropagated = trainer.selector.samples_backpropagated if arm != "trainer" else args.samples * args.epochs
    return {
        "arm": arm,
        "epoch_s": clock.epochs,
        "method_s": sum(clock.epochs),
        "samples_backpropagated": backpropagated,
        "steps": trainer.state.global_step,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None,
    }


def table(args, rows: list[dict]) -> str:
    """Per arm: the median method time, each round's, and its ratio to Trainer's in the same round."""
    lines = [
        f"{args.samples} samples x {args.length} tokens, batch {args.batch}, {args.epochs} epochs, "
        f"{args.layers} layers, {args.device}; medians over {args.rounds} round(s), arms interleaved.",
        "",
        "| arm | method time (s) | per round | / Trainer's, same round | samples back-propagated "
        "| optimiser steps | peak GPU memory (GiB) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for arm in args.arms:
        runs = [r for r in rows if r["arm"] == arm]
        memory = runs[0]["peak_memory_gib"]
        per_round = ", ".join(f"{r['method_s']:.2f}" for r in runs)
        lines.append(
            f"| {arm} | {statistics.median(r['method_s'] for r in runs):.2f} | {per_round} | "
            f"{harness.ratio_text(harness.paired_ratios(rows, 'method_s', arm, 'trainer'))} | "
            f"{runs[0]['samples_backpropagated']} | {runs[0]['steps']} | "
            f"{'—' if memory is None else f'{memory:.2f}'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--length", type=int, default=512)  # tokens per sample, prompt included
    parser.add_argument("--batch", type=int, default=16)  # per-device batch
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--layers", type=int, default=30)  # SmolLM2-135M's 30
    parser.add_argument("--rounds", type=int, default=3)  # every arm once per round, interleaved
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(DEFAULT_ARMS), help="trainer always runs")
    parser.add_argument(
        "--out", type=Path, default=None, help="default: a new stamped folder under results/hf_overhead/"
    )
    args = parser.parse_args(argv)
    args.arms = ["trainer", *(arm for arm in args.arms if arm != "trainer")]  # every ratio is to Trainer's
    info = harness.machine()
    data = samples(args)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for arm in args.arms:
                if args.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                row = {"round": round_, **run(arm, args, data, scratch)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = harness.results_folder(args.out, info)
    harness.write_json(out / "runs.json", {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows})
    readme = harness.write_readme(
        out, "AtteNTTrainer against Trainer", harness.command_line(argv), table(args, rows), info
    )
    print(readme.read_text())


if __name__ == "__main__":
    main()
