"""Wall-clock of the selection functions on one CPU core, and how it grows with N.

Times ``attent.selection.strategies.select`` for each strategy (hard, soft, random) at N = 1e6 ... 1e8 scores
and k = ratio * N, next to a bare ``torch.topk(scores, k)`` of the same size for scale. Each cell
is the median of ``--repeats`` timed calls after one untimed warm-up call. The CPU seconds of this
process are kept beside the wall-clock, split into user (the computation) and system (mostly
first-touch page faults of fresh buffers): a loaded machine stretches the wall-clock without
changing the work, and on a virtual machine the page faults vary from call to call.

Scaling: per strategy (and ratio) a least-squares fit seconds = a * N + b over the sizes, the
seconds per 10M scores at each size, and t(100M) / t(10M), which is ~10 for linear cost.
The goal is linear cost and <= 1 s per strategy at N = 100M. ``--profile`` also splits the largest
size into the steps that make up a selection (input check, noise, threshold pass, index pass).

    python benchmarks/speed/selection_scaling.py                    # Markdown tables
    python benchmarks/speed/selection_scaling.py --sizes 1e6 1e7 1e8 --profile --out /tmp/scaling

Timings on a shared machine are noisy: the script prints the load average next to the tables.
Writes ``README.md`` (the tables, the command, the machine) and ``timings.json`` into ``--out``, by
default a new folder ``benchmarks/results/selection_scaling/<date>-<machine>-<commit>/``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from attent.cli.doctor import cpu_model
from attent.selection import strategies, topk

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

GOAL_SECONDS = 1.0  # per strategy at 100M scores
GOAL_N = 100_000_000
PER = 10_000_000  # seconds are also reported per 10M scores
STRATEGIES = ("hard", "soft", "random")
COLUMNS = (*STRATEGIES, "torch.topk")


def median_seconds(fn, repeats: int, setup=None) -> dict[str, float]:
    """Median wall-clock, user-CPU and system-CPU seconds of ``fn()`` over ``repeats`` calls after
    one warm-up call (each median on its own), and the fastest wall-clock; ``setup()`` (untimed)
    runs before each call, e.g. to refill a buffer that fn works in place."""
    if setup:
        setup()
    fn()  # warm-up: allocator, lazy init
    wall, user, system = [], [], []
    for _ in range(repeats):
        if setup:
            setup()
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_SELF)
        user.append(after.ru_utime - before.ru_utime)
        system.append(after.ru_stime - before.ru_stime)
    return {
        "wall": statistics.median(wall),
        "user": statistics.median(user),
        "sys": statistics.median(system),
        "min_wall": min(wall),
    }


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def bench(sizes, ratios, repeats, seed=0) -> list[dict]:
    rows = []
    for n in sizes:
        scores = torch.rand(n, generator=torch.Generator().manual_seed(seed)) * 10.0
        for ratio in ratios:
            k = max(1, round(ratio * n))
            row = {"n": n, "k": k, "ratio": ratio, "detail": {}}
            for strategy in STRATEGIES:
                g = torch.Generator().manual_seed(seed)
                t = median_seconds(
                    lambda scores=scores, k=k, strategy=strategy, g=g: strategies.select(
                        scores, k, strategy, generator=g
                    ),
                    repeats,
                )
                row[strategy], row["detail"][strategy] = t["wall"], t
            t = median_seconds(lambda scores=scores, k=k: torch.topk(scores, k), repeats)
            row["torch.topk"], row["detail"]["torch.topk"] = t["wall"], t
            rows.append(row)
            print(
                f"  n={n:>11,} k={k:>11,}  "
                + "  ".join(f"{name}={row[name]:.4f}s" for name in COLUMNS)
                + f"  load {load_average()}",
                file=sys.stderr,
                flush=True,
            )
        del scores
    return rows


def scaling(rows) -> list[dict]:
    """Per ratio and strategy: least-squares fit seconds = a * N + b, and t(100M) / t(10M)."""
    fits = []
    for ratio in sorted({r["ratio"] for r in rows}):
        sub = sorted((r for r in rows if r["ratio"] == ratio), key=lambda r: r["n"])
        by_n = {r["n"]: r for r in sub}
        for strategy in STRATEGIES:
            fit = {"ratio": ratio, "strategy": strategy}
            if len(sub) >= 2:
                n = np.array([r["n"] for r in sub], dtype=float)
                t = np.array([r[strategy] for r in sub])
                (a, b), *_ = np.linalg.lstsq(np.stack([n, np.ones_like(n)], axis=1), t, rcond=None)
                residual = t - (a * n + b)
                fit.update(
                    seconds_per_10M=a * PER,
                    intercept_s=b,
                    r2=1 - float(residual @ residual) / float(((t - t.mean()) ** 2).sum() or 1.0),
                    max_rel_residual=float(np.max(np.abs(residual) / t)),
                )
            if GOAL_N in by_n and PER in by_n:
                fit["ratio_100M_10M"] = by_n[GOAL_N][strategy] / by_n[PER][strategy]
            if GOAL_N in by_n:
                fit["seconds_at_100M"] = by_n[GOAL_N][strategy]
                fit["goal_met"] = by_n[GOAL_N][strategy] <= GOAL_SECONDS
            fits.append(fit)
    return fits


def profile(n: int, ratio: float, repeats: int, seed=0) -> dict[str, dict[str, float]]:
    """Median seconds of each step of ``select`` at size n (the code paths topk.py takes there)."""
    k = max(1, round(ratio * n))
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, generator=torch.Generator().manual_seed(seed)) * 10.0
    tiny = torch.finfo(torch.float32).tiny
    values = scores.numpy()
    streams = topk.streams(n, scores) and topk.uniform_bits_match()
    if streams:
        uniform = topk.uniform_f32(n, g, tiny)
    else:
        uniform = torch.rand(n, generator=g).clamp_(min=tiny).numpy()
    noise = uniform.copy()
    torch.from_numpy(noise).log_().neg_().log_()  # T * (-G) at T = 1: what the first pass turns into keys
    work = np.empty_like(uniform)
    refill = {"uniform": lambda: np.copyto(work, uniform), "noise": lambda: np.copyto(work, noise)}
    steps = {
        "check scores (aminmax: finite, 1-D)": (lambda: strategies.check_scores(scores), None),
        "before: Gumbel noise, _gumbel (rand + clamp + 2 logs + neg)": (
            lambda: topk.gumbel(n, g, scores.dtype, scores.device),
            None,
        ),
        "  (its torch.rand alone)": (lambda: torch.rand(n, generator=g), None),
        "noise bits: int32 random_(0, 2**24), same stream (_uniform_bits)": (lambda: topk.uniform_bits(n, g), None),
        "uniform float32: bits * 2**-24, clamped, in place (_uniform_f32)": (
            lambda: topk.uniform_f32(n, g, tiny),
            None,
        ),
        "Gumbel: log_, neg_, log_ over the whole tensor (in place)": (
            lambda: torch.from_numpy(work).log_().neg_().log_(),
            refill["uniform"],
        ),
        "threshold pass, soft: keys = scores - T*(-G) fused (_threshold_blocks)": (
            lambda: topk.threshold_blocks(work, k, values),
            refill["noise"],
        ),
        "threshold pass, hard (_threshold_blocks on the scores)": (lambda: topk.threshold_blocks(values, k), None),
        "  (for comparison: kthvalue over all N)": (lambda: torch.kthvalue(scores, n - k + 1), None),
        "threshold + index pass, hard (_top_k_blocks on the scores)": (lambda: topk.top_k_blocks(values, k), None),
    }
    if not streams:  # small or unsupported input: select takes the whole-tensor path
        steps = {name: step for name, step in steps.items() if "_blocks" not in name and "_uniform" not in name}
    return {name: median_seconds(fn, repeats, setup) for name, (fn, setup) in steps.items()}


def markdown(rows) -> str:
    head = (
        "| N | k | "
        + " | ".join(f"{c} (s)" for c in COLUMNS)
        + " | "
        + " | ".join(f"{s} s/10M" for s in STRATEGIES)
        + " | ≤ 1 s at 100M |"
    )
    lines = [head, "|" + "---|" * (3 + len(COLUMNS) + len(STRATEGIES))]
    for r in rows:
        goal = ""
        if r["n"] == GOAL_N:
            missed = [s for s in STRATEGIES if r[s] > GOAL_SECONDS]
            goal = "yes" if not missed else "no: " + ", ".join(missed)
        lines.append(
            f"| {r['n']:,} | {r['k']:,} | "
            + " | ".join(f"{r[c]:.4f}" for c in COLUMNS)
            + " | "
            + " | ".join(f"{r[s] * PER / r['n']:.4f}" for s in STRATEGIES)
            + f" | {goal} |"
        )
    return "\n".join(lines)


def markdown_cpu(rows) -> str:
    lines = [
        "| N | k | " + " | ".join(f"{c} user + sys (s)" for c in COLUMNS) + " |",
        "|" + "---|" * (2 + len(COLUMNS)),
    ]
    for r in rows:
        lines.append(
            f"| {r['n']:,} | {r['k']:,} | "
            + " | ".join(f"{r['detail'][c]['user']:.4f} + {r['detail'][c]['sys']:.4f}" for c in COLUMNS)
            + " |"
        )
    return "\n".join(lines)


def markdown_scaling(fits) -> str:
    def num(fit, key, fmt):
        return format(fit[key], fmt) if key in fit else "n/a"

    lines = [
        "| ratio | strategy | fit: s per 10M | fit: intercept (s) | R² | max rel. residual "
        "| t(100M) / t(10M) | t(100M) (s) | ≤ 1 s at 100M |",
        "|" + "---|" * 9,
    ]
    for f in fits:
        goal = ("yes" if f["goal_met"] else "no") if "goal_met" in f else "n/a"
        lines.append(
            f"| {f['ratio']} | {f['strategy']} | {num(f, 'seconds_per_10M', '.4f')} | "
            f"{num(f, 'intercept_s', '+.4f')} | {num(f, 'r2', '.4f')} | "
            f"{num(f, 'max_rel_residual', '.1%')} | "
            f"{num(f, 'ratio_100M_10M', '.2f')} | {num(f, 'seconds_at_100M', '.4f')} | {goal} |"
        )
    return "\n".join(lines)


def parse_args(argv) -> argparse.Namespace:
    """The command line: the sizes and ratios timed, the repeats and threads, and the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 3e6, 1e7, 3e7, 1e8])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5], help="k = ratio * N")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (goal: 1)")
    parser.add_argument("--profile", action="store_true", help="split the largest size into steps")
    parser.add_argument(
        "--out", type=Path, help="results folder (default: a new stamped one under results/selection_scaling/)"
    )
    return parser.parse_args(argv)


def readme_body(rows, fits, steps, largest: int, repeats: int, load_before: str, load_after: str) -> str:
    """The README's text: the setting and load, the wall-clock and CPU tables, the scaling fits and,
    with ``--profile``, the steps of one selection at the largest size."""
    text = [
        f"torch {torch.__version__}, numpy {np.__version__}, {torch.get_num_threads()} thread(s), "
        f"{cpu_model()}, {os.cpu_count()} logical CPUs; load average (1/5/15 min) before: {load_before}, "
        f"after: {load_after}; median of {repeats} repeats after a warm-up call\n",
        "Wall-clock seconds per call, and per 10M scores:\n",
        markdown(rows),
        "\nCPU seconds per call, user + system of this process (system: mostly page faults of fresh "
        "buffers; the wall-clock above also counts waiting for a core on a loaded machine):\n",
        markdown_cpu(rows),
        "\nScaling (wall-clock): least-squares fit seconds = a * N + b over the sizes above; linear "
        "cost gives t(100M) / t(10M) ~ 10:\n",
        markdown_scaling(fits),
    ]
    if steps:
        text += [
            f"\nSteps of one selection at N = {largest:,}, k = N/2, T = 1 (median seconds):\n",
            "| step | wall (s) | user (s) | sys (s) |\n|---|---|---|---|",
            *(f"| {name} | {sec['wall']:.4f} | {sec['user']:.4f} | {sec['sys']:.4f} |" for name, sec in steps.items()),
        ]
    return "\n".join(text)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    info = harness.machine()
    sizes = sorted(int(s) for s in args.sizes)
    load_before = load_average()
    rows = bench(sizes, args.ratios, args.repeats)
    fits = scaling(rows)
    steps = profile(max(sizes), 0.5, args.repeats) if args.profile else None
    load_after = load_average()

    body = readme_body(rows, fits, steps, max(sizes), args.repeats, load_before, load_after)
    out = harness.results_folder(args.out, info)
    harness.write_json(
        out / "timings.json",
        {
            "torch": torch.__version__,
            "numpy": np.__version__,
            "threads": torch.get_num_threads(),
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": load_after,
            "repeats": args.repeats,
            "goal_seconds_at_100M": GOAL_SECONDS,
            "rows": rows,
            "scaling": fits,
            "profile": steps,
        },
    )
    print(
        harness.write_readme(
            out,
            "Wall-clock of the selection functions, and how it grows with N",
            harness.command_line(argv),
            body,
            info,
        ).read_text()
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
