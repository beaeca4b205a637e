"""What the paper's tables cost at its own scale, priced by ``attent plan`` before any GPU is paid
for, and what the paper's reported times imply about the utilisation its runs reached.

    python benchmarks/cost/run_plan.py [--mfu MFU] [--before FOLDER] [--out FOLDER]

Each table's sweep file (and the first milestone) is priced as shipped on an A100 80GB and an
H100, Table 1's controls apart and Table 1 on its whole data sets too, and Table 1 again in the
paper's precision on its four GPUs (fp32, with and without TF32).
Every figure is ``attent plan --json``'s: the work from the selection plan, the FLOPs counted on
the meta device at the tokens a sample really has (a language model's batches padded to their
longest), the hours at each workload's measured MFU on the A100 carried to the H100 by measured
throughput (``attent.cost.rates``; ``--mfu`` states one instead), evaluation's decoding at the
memory bandwidth. Costs are at the illustrative rates of ``RATES`` (round numbers, not quotes:
rerun ``attent plan --price-per-gpu-hour`` with yours). Each figure is set beside the same one in
``--before`` (by default the newest earlier results folder). Writes ``README.md`` and
``results.json`` (every plan) into ``--out``, by default a new folder
``benchmarks/results/run_plan/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402
from attent.cost.accelerators import ACCELERATORS  # noqa: E402

SWEEPS = "experiments/sweeps"
A100 = ACCELERATORS["a100-80gb"]  # the paper's GPU: its reported times are read against its peaks
TABLES = [  # (what, file, overrides)
    ("Milestone: LLaMA-2-7B on MetaMathQA's 100k slice, 3 seeds", f"{SWEEPS}/milestone_llama2_metamath_gpu.yaml", []),
    ("Table 2: Multi-Modal MAE with and without AtteNT", f"{SWEEPS}/multimae_with_without_gpu.yaml", []),
    ("Table 8: AtteNT against three sampling methods", f"{SWEEPS}/comparison_multimae_gpu.yaml", []),
    ("Table 7: fixed sample ratios", f"{SWEEPS}/ratio_multimae_gpu.yaml", []),
    ("Table 3: the schedule and strategy ablation (MAE)", f"{SWEEPS}/ablation_multimae_gpu.yaml", []),
    ("Table 1: three 7B models x three data sets", f"{SWEEPS}/table1_llm_gpu.yaml", []),
    ("Table 1's 10-epoch controls, apart", f"{SWEEPS}/table1_llm_controls_gpu.yaml", []),
    (
        "Table 1 on the whole sets at 1,024 tokens",
        f"{SWEEPS}/table1_llm_gpu.yaml",
        ["task.train_limit=null", "task.max_length=1024"],
    ),
]
PAPER_PRECISION = [  # Table 1 as the paper's appendix states it: Float32 on 4 A100 80GB
    ("Table 1 in fp32 on 4 GPUs, TF32 off", ["task.dtype=float32", "train.precision=fp32", "ray.num_workers=4"]),
    (
        "Table 1 in fp32 on 4 GPUs, TF32 on",
        ["task.dtype=float32", "train.precision=fp32", "ray.num_workers=4", "train.tf32=true"],
    ),
]
GPUS = ("a100-80gb", "h100")
RATES = {"a100-80gb": {"on demand": 4.0, "spot": 1.6}, "h100": {"on demand": 6.0, "spot": 2.4}}  # $ / GPU-hour
PAPER_TIMES = [  # (what, the plan, the run's label in it, reported minutes, GPUs): Tables 1 and 2, without AtteNT
    ("Table 1, LLaMA-2-7B, MetaMathQA, full data", "milestone", "method=full", 246, 4, "its 100k slice, max 512"),
    (
        "Table 1, LLaMA-2-7B, MetaMathQA, full data",
        "table1_whole",
        "model=Llama-2-7b-hf dataset=metamathqa method=full",
        246,
        4,
        "all 395k, max 1,024",
    ),
    (
        "Table 2, Multi-Modal MAE pre-training, full data",
        "table2",
        "preset=None method=full",
        1234,
        4,
        "800 epochs of 64,431 images",
    ),
]


def plan(file: str, overrides: list[str], gpu: str, mfu: float | None) -> dict:
    """``attent plan`` of one file, read from its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        stated = ["--mfu", str(mfu)] if mfu is not None else []
        command = [
            str(Path(sys.executable).with_name("attent")),
            "plan",
            file,
            *overrides,
            "--gpu",
            gpu,
            *stated,
            "--json",
            str(out),
        ]
        subprocess.run(command, cwd=harness.REPO, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def earlier(folder: Path | None) -> dict | None:
    """The plans of an earlier results folder (default: the newest one here, by the date its machine.json
    records: folders of one day sort by commit, not by time), None if none."""
    if folder is None:
        found = sorted(
            (harness.RESULTS / "run_plan").glob("*/results.json"),
            key=lambda path: json.loads((path.parent / "machine.json").read_text())["date"],
        )
        return json.loads(found[-1].read_text()) if found else None
    return json.loads((Path(folder) / "results.json").read_text())


def summary(result: dict) -> dict:
    """A plan's totals: runs, GPU-hours of the method and of evaluation, hours one run after another."""
    runs = result["runs"]
    return {
        "runs": len(runs),
        "method_gpu_hours": sum(r["method_gpu_hours"] for r in runs),
        "eval_gpu_hours": sum(r["eval_gpu_hours"] for r in runs),
        "serial_hours": sum(r["wall_clock_hours"] for r in runs),  # one run at a time, each on its workers
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mfu", type=float, default=None, help="one MFU for every run (default: each workload's)")
    parser.add_argument("--before", type=Path, help="an earlier results folder to compare with (default: the newest)")
    parser.add_argument("--out", type=Path, help="results folder (default: a new stamped one)")
    args = parser.parse_args()
    info, before = harness.machine(), earlier(args.before)
    results: dict = {"command": harness.command_line(), "mfu": args.mfu, "rates": RATES, "plans": {}}
    for what, file, overrides in TABLES:
        for gpu in GPUS:
            print(f"{what} on {gpu} ...", flush=True)
            results["plans"][f"{what} | {gpu}"] = plan(file, overrides, gpu, args.mfu)
    for what, overrides in PAPER_PRECISION:
        print(f"{what} ...", flush=True)
        results["plans"][f"{what} | a100-80gb"] = plan(
            f"{SWEEPS}/table1_llm_gpu.yaml", overrides, "a100-80gb", args.mfu
        )
    if before is not None:
        results["before"] = {
            "command": before["command"],
            "mfu": before["mfu"],
            "totals": {key: summary(p) for key, p in before["plans"].items()},
        }
    out = harness.results_folder(args.out, info)
    harness.write_json(out / "results.json", results)
    harness.write_readme(out, "The paper's tables priced by attent plan", results["command"], render(results), info)
    print(out / "README.md")


def render(results: dict) -> str:
    plans, mfu = results["plans"], results["mfu"]
    before = results.get("before", {}).get("totals", {})
    utilisation = f"at {mfu:.0%} model-FLOPs utilisation" if mfu is not None else "at each workload's measured rates"
    lines = [
        f"## GPU-hours and cost {utilisation}",
        "",
        "| what | runs (downstream jobs too) | GPU | method GPU-h | evaluation GPU-h | GPU-h before → after | "
        "hours, one run after another | on demand | spot |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, result in plans.items():
        what, gpu = key.split(" | ")
        s, rate = summary(result), results["rates"][gpu]
        hours = s["method_gpu_hours"] + s["eval_gpu_hours"]
        was = before.get(key)
        change = f"{was['method_gpu_hours'] + was['eval_gpu_hours']:,.0f} → {hours:,.0f}" if was else f"{hours:,.0f}"
        lines.append(
            f"| {what} | {s['runs']} | {gpu} | {s['method_gpu_hours']:,.1f} | {s['eval_gpu_hours']:,.1f} | {change} | "
            f"{s['serial_hours']:,.1f} | ${hours * rate['on demand']:,.0f} | ${hours * rate['spot']:,.0f} |"
        )
    rates = "; ".join(
        f"{gpu} ${r['on demand']:.2f} on demand, ${r['spot']:.2f} spot" for gpu, r in results["rates"].items()
    )
    lines += [
        "",
        f"Rates per GPU-hour, illustrative round numbers (not quotes): {rates}. Hours one run after another: "
        "each run on its own workers (8 GPUs; the fp32 rows 4), as `max_concurrent: 1` runs them. Before: "
        f"`{results['before']['command']}` (MFU {results['before']['mfu']}, every LLM sample at `max_length`, "
        "evaluation compute-bound)."
        if before
        else "",
        "",
        *sources(plans),
        "",
        *paper_times(plans),
    ]
    return "\n".join(lines)


def sources(plans: dict) -> list[str]:
    """Where the plans' rates and tokens come from, each once."""
    found = dict.fromkeys(source for plan in plans.values() for run in plan["runs"] for source in run["sources"])
    return ["## Where the rates come from", "", *(f"* {source}" for source in found)]


def paper_times(plans: dict) -> list[str]:
    """What the paper's reported times imply, against the FLOPs counted for the same runs."""
    lines = [
        "## What the paper's reported times imply",
        "",
        "| the paper's run | counted as | reported | counted FLOPs | implied TFLOP/s per A100 | of bf16 peak | of TF32 | of fp32 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    prefixes = {"milestone": "Milestone", "table1_whole": "Table 1 on the whole sets", "table2": "Table 2:"}
    for what, source, label, minutes, gpus, counted in PAPER_TIMES:
        key = next(k for k in plans if k.startswith(prefixes[source]) and k.endswith("| a100-80gb"))
        run = next(r for r in plans[key]["runs"] if r.get("label") == label)
        if run.get("tokens"):
            counted += f", {run['tokens']:,.0f} tokens a sample"
        rate = run["method_flops"] / (minutes * 60 * gpus)
        lines.append(
            f"| {what} | {counted} | {minutes} min on {gpus} | {run['method_flops']:.2e} | {rate / 1e12:,.0f} | "
            f"{rate / A100.bf16:.0%} | {rate / A100.tf32:.0%} | {rate / A100.fp32:.0%} |"
        )
    lines += [
        "",
        "Counted FLOPs: a language model's samples at the width their batches are padded to (the expected longest "
        f"of a batch); A100 dense peaks {A100.bf16 / 1e12:g} (bf16), {A100.tf32 / 1e12:g} (TF32), "
        f"{A100.fp32 / 1e12:g} (fp32) TFLOP/s.",
    ]
    return lines


if __name__ == "__main__":
    main()
