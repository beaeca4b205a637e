"""Wall-clock of the selection functions on one CPU core.

Times ``attent.selection.select`` for each strategy (hard, soft, random) at N = 1e5, 1e6, 1e7
scores and k = ratio * N, next to a bare ``torch.topk(scores, k)`` of the same size for scale.
Each cell is the median of ``--repeats`` timed calls after one untimed warm-up call. The goal is
10M scores in <= 0.5 s per strategy. ``--profile`` also splits the largest size into the steps
that make up a selection (input check, noise, threshold search, mask, index extraction).

    python benchmarks/selection_bench.py                    # Markdown table
    python benchmarks/selection_bench.py --ratios 0.2 0.5 0.8 --profile --json out.json

Timings on a shared machine are noisy: the script prints the load average next to the table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

try:
    from attent.selection import core, select
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))
    from attent.selection import core, select

GOAL_SECONDS = 0.5   # per strategy at 10M scores
GOAL_N = 10_000_000
STRATEGIES = ("hard", "soft", "random")


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: allocator, lazy init
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def bench(sizes, ratios, repeats, seed=0) -> list[dict]:
    rows = []
    for n in sizes:
        scores = torch.rand(n, generator=torch.Generator().manual_seed(seed)) * 10.0
        for ratio in ratios:
            k = max(1, round(ratio * n))
            row = {"n": n, "k": k, "ratio": ratio}
            for strategy in STRATEGIES:
                g = torch.Generator().manual_seed(seed)
                row[strategy] = median_seconds(lambda: select(scores, k, strategy, generator=g), repeats)
            row["torch.topk"] = median_seconds(lambda: torch.topk(scores, k), repeats)
            rows.append(row)
            print(f"  n={n:>10,} k={k:>10,}  " + "  ".join(
                f"{name}={row[name]:.4f}s" for name in (*STRATEGIES, "torch.topk")), file=sys.stderr, flush=True)
    return rows


def profile(n: int, ratio: float, repeats: int, seed=0) -> dict[str, float]:
    """Median seconds of each step of ``select`` at size n (same code paths as core.py)."""
    k = max(1, round(ratio * n))
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, generator=torch.Generator().manual_seed(seed)) * 10.0
    gumbel = core._gumbel(n, g, scores.dtype, scores.device)
    keys = scores + gumbel
    threshold = core._kth_largest(keys, k)
    mask = keys > threshold
    steps = {
        "check scores (aminmax: finite, 1-D)": lambda: core._check_scores(scores),
        "uniform noise: torch.rand": lambda: torch.rand(n, generator=g),
        "Gumbel noise: rand + clamp + 2 logs": lambda: core._gumbel(n, g, scores.dtype, scores.device),
        "keys = scores + T * gumbel (in place)": lambda: gumbel.clone().mul_(1.0).add_(scores),
        "  (for comparison: clone alone)": lambda: gumbel.clone(),
        "threshold: _kth_largest (sampled band)": lambda: core._kth_largest(keys, k),
        "  (for comparison: kthvalue over all N)": lambda: torch.kthvalue(keys, n - k + 1),
        "mask = keys > threshold": lambda: keys > threshold,
        "count: torch.count_nonzero(mask)": lambda: int(torch.count_nonzero(mask)),
        "  (for comparison: mask.sum())": lambda: int(mask.sum()),
        "indices: _nonzero(mask) (numpy flatnonzero)": lambda: core._nonzero(mask),
        "  (for comparison: torch mask.nonzero())": lambda: mask.nonzero().squeeze(1),
        "whole: _top_k(keys, k)": lambda: core._top_k(keys, k),
    }
    return {name: median_seconds(fn, repeats) for name, fn in steps.items()}


def markdown(rows) -> str:
    head = "| N | k | hard (s) | soft (s) | random (s) | torch.topk (s) | ≤ 0.5 s at 10M |"
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        goal = ""
        if r["n"] >= GOAL_N:
            missed = [s for s in STRATEGIES if r[s] > GOAL_SECONDS]
            goal = "yes" if not missed else "no: " + ", ".join(missed)
        lines.append(f"| {r['n']:,} | {r['k']:,} | " + " | ".join(
            f"{r[name]:.4f}" for name in (*STRATEGIES, "torch.topk")) + f" | {goal} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e5, 1e6, 1e7])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5], help="k = ratio * N")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (goal: 1)")
    parser.add_argument("--profile", action="store_true", help="split the largest size into steps")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes]
    load_before = load_average()
    rows = bench(sizes, args.ratios, args.repeats)
    steps = profile(max(sizes), 0.5, args.repeats) if args.profile else None
    load_after = load_average()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {cpu_model()}, "
          f"{os.cpu_count()} logical CPUs; load average (1/5/15 min) before: {load_before}, "
          f"after: {load_after}; median of {args.repeats} repeats\n")
    print(markdown(rows))
    if steps:
        print(f"\nSteps of one selection at N = {max(sizes):,}, k = N/2 (median seconds):\n")
        print("| step | seconds |\n|---|---|")
        for name, sec in steps.items():
            print(f"| {name} | {sec:.4f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cpu_model(),
            "cpus": os.cpu_count(), "load_before": load_before, "load_after": load_after,
            "repeats": args.repeats, "goal_seconds_at_10M": GOAL_SECONDS, "rows": rows, "profile": steps,
        }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
