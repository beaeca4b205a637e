"""Peak memory per worker of one LLM forward + backward: full-vocabulary logits vs the chunked loss.

One training step's ``per_sample_loss(...).mean().backward()`` of the LLM task (SmolLM2-135M with
LoRA, train mode, as experiments/gsm8k_smollm2.yaml) at batch 4 x 256 tokens, every token a
response token but a 16-token prompt (so the loss covers ~240 tokens per sample), measured with:

* ``full``: the previous path, ``response_token_loss(model(...).logits, labels)``: [B, T, V]
  logits and their fp32 log-softmax for the whole batch;
* ``chunked``: the task's loss now, ``response_loss`` (final hidden states, LM head and fp32
  log-softmax ``--chunk-tokens`` response tokens at a time under activation checkpointing);
* ``body`` (floor): the same forward to the final hidden states and a backward from a trivial
  function of them, no LM head at all: what the transformer itself needs.

Each measurement runs in a fresh subprocess, after one warm-up step of the same path on a
4 x 32-token batch (code pages, lazy initialisation and thread pools are shared by all paths and
not what is measured). On CPU: peak RSS during the step minus RSS before it (the kernel's
peak-RSS mark is reset through /proc/self/clear_refs, so loading the model does not count;
``resource.getrusage`` ru_maxrss is read after the step; glibc's mmap threshold is fixed at
128 KiB so freed tensors leave RSS at once), and in a second subprocess the peak of tensors
alive in torch's CPU allocator over the step (torch profiler memory timeline). On CUDA:
``torch.cuda.max_memory_allocated`` minus the memory allocated before the step. The chunked
loss's goal is chunked <= 1/4 of full; the "minus body" columns show what the LM head and the
loss add on top of the transformer's own activations.

    python benchmarks/llm/llm_memory.py                          # Markdown table
    python benchmarks/llm/llm_memory.py --chunk-tokens 1024 256 --out /tmp/memory   # ~6 min, 2 cores

Writes ``README.md`` (the table, the command, the machine) and ``peaks.json`` (every measurement) into
``--out``, by default a new folder ``benchmarks/results/llm_memory/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from attent.tasks.llm.config import LLMTaskConfig  # light: pydantic only

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

REPO = harness.REPO
GSM8K_TRAIN = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
PROMPT_TOKENS = 16
MiB = 2**20


# --- one measurement (subprocess) ------------------------------------------------------------
def proc_status(field: str) -> int | None:
    """A /proc/self/status size (VmRSS, VmHWM) in bytes, or None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM, ru_maxrss) to the current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def make_batch(tokenizer, batch_size: int, length: int, device: torch.device) -> dict:
    """``batch_size`` rows of ``length`` tokens of GSM8K solutions (random ids without the data),
    the first PROMPT_TOKENS of each row labelled IGNORE_INDEX, the rest response tokens."""
    needed = batch_size * length
    if GSM8K_TRAIN.is_file():
        ids: list[int] = []
        with GSM8K_TRAIN.open(encoding="utf-8") as f:
            for line in f:
                ids += tokenizer(json.loads(line)["answer"], add_special_tokens=False).input_ids
                if len(ids) >= needed:
                    break
        input_ids = torch.tensor(ids[:needed]).view(batch_size, length)
    else:
        input_ids = torch.randint(len(tokenizer), (batch_size, length), generator=torch.Generator().manual_seed(0))
    labels = input_ids.clone()
    labels[:, :PROMPT_TOKENS] = -100
    return {
        "index": torch.arange(batch_size),
        "input_ids": input_ids.to(device),
        "labels": labels.to(device),
        "attention_mask": torch.ones_like(input_ids).to(device),
    }


def step(method: str, task, model, batch: dict, chunk_tokens: int) -> torch.Tensor:
    """One forward + backward; returns the per-sample losses."""
    from attent.tasks.llm.loss import final_hidden_states, response_loss, response_token_loss

    torch.manual_seed(0)  # the same LoRA dropout masks for every method
    if method == "full":
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        losses = response_token_loss(logits, batch["labels"])
        del logits
    elif method in ("chunked", "chunked_gc"):
        losses = response_loss(model, batch, chunk_tokens=chunk_tokens, fused="off")
    elif method == "body":
        hidden = final_hidden_states(model, batch["input_ids"], batch["attention_mask"])
        losses = hidden.float().pow(2).mean(dim=(1, 2))
        del hidden
    else:
        raise ValueError(method)
    losses.mean().backward()
    return losses.detach()


def measure(args: argparse.Namespace) -> dict:
    from attent.tasks.llm.task import LLMTask

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = LLMTaskConfig(
        model=args.model,
        lora_r=args.lora_r,
        dtype=args.dtype,
        loss_chunk_tokens=args.chunk_tokens,
        gradient_checkpointing=args.worker == "chunked_gc",
    )
    task = LLMTask(config, seed=0)
    model = task.build_model().to(device).train()
    batch = make_batch(task.tokenizer, args.batch_size, args.length, device)
    # warm-up on a short batch: code pages, lazy init and thread pools are not what is measured
    step(
        args.worker,
        task,
        model,
        make_batch(task.tokenizer, args.batch_size, 2 * PROMPT_TOKENS, device),
        args.chunk_tokens,
    )
    model.zero_grad(set_to_none=True)
    gc.collect()
    result: dict = {
        "method": args.worker,
        "chunk_tokens": args.chunk_tokens,
        "response_tokens": int((batch["labels"][:, 1:] != -100).sum()),
    }
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        losses = step(args.worker, task, model, batch, args.chunk_tokens)
        torch.cuda.synchronize()
        result["cuda_peak_bytes"] = torch.cuda.max_memory_allocated() - before
    elif args.allocator:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import MemoryProfileTimeline

        with profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
        ) as prof:
            losses = step(args.worker, task, model, batch, args.chunk_tokens)
        _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(device)
        totals = [sum(row) for row in sizes]
        result["allocator_peak_bytes"] = max(totals) - totals[0]
    else:
        rss_ready = proc_status("VmRSS")
        result["peak_reset"] = reset_peak_rss()
        losses = step(args.worker, task, model, batch, args.chunk_tokens)
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        result["rss_peak_bytes"] = maxrss - rss_ready
        result["vmhwm_peak_bytes"] = proc_status("VmHWM") - rss_ready
    result["losses"] = losses.float().cpu().tolist()
    result["lora_grad_norm"] = float(
        torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in model.parameters() if p.grad is not None]))
    )
    return result


# --- driver -------------------------------------------------------------------------------------
def run_worker(args: argparse.Namespace, method: str, chunk_tokens: int, allocator: bool) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            method,
            "--worker-out",
            out.name,
            "--chunk-tokens",
            str(chunk_tokens),
            "--batch-size",
            str(args.batch_size),
            "--length",
            str(args.length),
            "--threads",
            str(args.threads),
            "--device",
            args.device,
            "--model",
            args.model,
            "--lora-r",
            str(args.lora_r),
            "--dtype",
            args.dtype,
        ] + (["--allocator"] if allocator else [])
        # a fixed mmap threshold: freed blocks over 128 KiB go back to the OS at once, so RSS
        # follows the live allocations instead of glibc's cached arenas
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        return json.loads(Path(out.name).read_text())


def mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MiB:,.0f}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        nargs="+",
        default=[LLMTaskConfig.model_fields["loss_chunk_tokens"].default],
        help="chunk sizes of the chunked loss to measure (default: the task's)",
    )
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--length", type=int, default=256, help="tokens per sample")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--no-body", action="store_true", help="skip the no-LM-head floor")
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="also measure the chunked loss with task.gradient_checkpointing on",
    )
    parser.add_argument(
        "--no-allocator", action="store_true", help="CPU: skip the torch-allocator measurement (profiled subprocesses)"
    )
    parser.add_argument(
        "--out", type=Path, help="results folder (default: a new stamped one under results/llm_memory/)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--allocator", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def measure_all(args: argparse.Namespace) -> list[dict]:
    """Every loss path, each in its own subprocess (and its allocator peak in another on CPU)."""
    cpu = args.device == "cpu"
    runs = [("full", args.chunk_tokens[0])] + [("chunked", c) for c in args.chunk_tokens]
    if args.gradient_checkpointing:
        runs.append(("chunked_gc", args.chunk_tokens[0]))
    if not args.no_body:
        runs.append(("body", args.chunk_tokens[0]))
    results = []
    for method, chunk in runs:
        row = run_worker(args, method, chunk, allocator=False)
        if cpu and not args.no_allocator:
            row["allocator_peak_bytes"] = run_worker(args, method, chunk, allocator=True)["allocator_peak_bytes"]
        row["label"] = {
            "chunked": f"chunked ({chunk} tokens)",
            "chunked_gc": f"chunked ({chunk} tokens) + gradient checkpointing",
        }.get(method, method)
        results.append(row)
        print(f"measured {row['label']}", file=sys.stderr, flush=True)
    return results


def table(args: argparse.Namespace, results: list[dict]) -> str:
    """The Markdown table: each path's peak, its ratio to full logits, and what it adds over the
    transformer alone (minus body)."""
    cpu = args.device == "cpu"
    full = results[0]
    body = next((row for row in results if row["method"] == "body"), None)
    metrics = (
        [("rss_peak_bytes", "peak RSS - RSS before")]
        if cpu
        else [("cuda_peak_bytes", "max_memory_allocated - allocated before")]
    )
    if cpu and not args.no_allocator:
        metrics.append(("allocator_peak_bytes", "torch CPU allocator peak"))
    lines = [
        f"Peak memory of one forward + backward, {args.model} LoRA r={args.lora_r} "
        f"({args.dtype}), batch {args.batch_size} x {args.length} tokens "
        f"({full['response_tokens']} response tokens), {args.device}, "
        f"{args.threads} threads; MiB, ratio = path / full",
        "",
    ]
    header = ["loss path"] + [f"{title} | ratio" for _, title in metrics]
    if body is not None:  # what the LM head and loss add on top of the transformer
        header += [f"{title} minus body | ratio" for _, title in metrics]
    header.append("max abs loss diff vs full")
    lines += ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(" | ".join(header).split(" | ")) - 1)]
    for row in results:
        cells = [row["label"]]
        for key, _ in metrics:
            row[f"{key}_ratio"] = row[key] / full[key]
            cells += [mib(row[key]), f"{row[f'{key}_ratio']:.3f}"]
        if body is not None:
            for key, _ in metrics:
                row[f"{key}_minus_body"] = row[key] - body[key]
                ratio = row[f"{key}_minus_body"] / (full[key] - body[key])
                row[f"{key}_minus_body_ratio"] = ratio
                cells += [mib(row[f"{key}_minus_body"]), f"{ratio:.3f}"]
        row["max_abs_loss_diff"] = max(abs(a - b) for a, b in zip(row["losses"], full["losses"]))
        cells.append("n/a (no LM head)" if row["method"] == "body" else f"{row['max_abs_loss_diff']:.2e}")
        lines.append("| " + " | ".join(cells) + " |")
    if cpu and not all(row.get("peak_reset") for row in results):
        lines.append("\n(peak RSS could not be reset after loading: ru_maxrss may include the load)")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if args.worker:
        args.chunk_tokens = args.chunk_tokens[0]
        args.worker_out.write_text(json.dumps(measure(args)))
        return
    info = harness.machine()
    results = measure_all(args)
    text = table(args, results)
    out = harness.results_folder(args.out, info)
    harness.write_json(
        out / "peaks.json",
        {
            "model": args.model,
            "lora_r": args.lora_r,
            "dtype": args.dtype,
            "batch_size": args.batch_size,
            "length": args.length,
            "device": args.device,
            "threads": args.threads,
            "torch": torch.__version__,
            "machine": platform.machine(),
            "results": results,
        },
    )
    print(
        harness.write_readme(
            out,
            "Peak memory of one LLM step: full-vocabulary logits against the chunked loss",
            harness.command_line(),
            text,
            info,
        ).read_text()
    )


if __name__ == "__main__":
    main()
