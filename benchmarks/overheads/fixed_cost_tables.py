"""The tables of benchmarks/overheads/fixed_cost.py: its rounds' phases, fixed cost per run and CPU by
process kind, as Markdown (one table set per mode, then the modes side by side)."""

from __future__ import annotations

import os
import statistics

# (phase, from, to) on the timeline of one run; the first run adds the driver's start and Ray's.
FIRST_ONLY = [
    ("python start + CLI imports", "process_started", "config_imported"),
    ("driver imports (ray, torch, mlflow)", "config_imported", "driver_imported"),
    ("ray.init (local)", "driver_started", "ray_ready"),
]
PHASES = [
    ("MLflow run, preflight", "ray_ready", "fit_called"),
    ("fit() -> training function entered (local mode)", "fit_called", "entered"),
    ("fit() -> controller up", "fit_called", "controller_started"),
    ("placement group + worker process + actor init", "controller_started", "workers_created"),
    ("train context + torch process group (gloo)", "workers_created", "backend_ready"),
    ("train fn unpickled (our imports) + launched", "backend_ready", "train_fn_launched"),
    ("worker set-up (task, data, model, MLflow)", "train_fn_launched", "setup_done"),
    ("set-up in the driver's process (task, data, model, MLflow)", "entered", "setup_done"),
    ("after the last epoch -> workers stopped", "epochs_ended", "workers_stopped"),
    ("controller finishes, fit() returns, run closed", "workers_stopped", "train_returned"),
    ("after the last epoch -> fit() returns, run closed", "epochs_ended", "train_returned"),
]
LOCAL_ONLY = {
    "fit() -> training function entered (local mode)",
    "set-up in the driver's process (task, data, model, MLflow)",
    "after the last epoch -> fit() returns, run closed",
}


def phase_rows(rounds: list[dict]) -> list[tuple[str, list[float], list[float]]]:
    """(phase, seconds in first runs, seconds in later runs)."""
    rows = []
    for name, start, end in FIRST_ONLY + PHASES:
        first, later = [], []
        for data in rounds:
            for number, run in enumerate(data["runs"]):
                if number > 0 and (name, start, end) in FIRST_ONLY:
                    continue
                points = {**data["marks"], **run}
                if name in LOCAL_ONLY and data.get("workers", 1) != 0:  # Ray's rows lack their marks there
                    continue
                if start == "ray_ready" and (number > 0 or "ray_ready" not in run):
                    points["ray_ready"] = run["driver_started"]
                if start in points and end in points:
                    (first if number == 0 else later).append(points[end] - points[start])
        rows.append((name, first, later))
    setup_parts = sorted({k for data in rounds for run in data["runs"] for k in run["setup_parts"]})
    for part in setup_parts:
        first = [d["runs"][0]["setup_parts"].get(part, 0.0) for d in rounds]
        later = [r["setup_parts"].get(part, 0.0) for d in rounds for r in d["runs"][1:]]
        rows.append((f"  set-up: {part}", first, later))
    marks = [d["marks"] for d in rounds]
    rows.append(("ray.shutdown()", [m["ray_shut_down"] - m["runs_done"] for m in marks if "ray_shut_down" in m], []))
    rows.append(
        ("interpreter exit", [m["exited"] - m.get("ray_shut_down", m["runs_done"]) for m in marks if "exited" in m], [])
    )
    return rows


def totals(rounds: list[dict]) -> tuple[list[float], list[float]]:
    """Fixed cost per run: everything but the epochs (first runs from process start to exit)."""
    first, later = [], []
    for data in rounds:
        for number, run in enumerate(data["runs"]):
            epochs = run["epochs_ended"] - run["setup_done"]
            if number == 0:
                end = (
                    data["marks"].get("exited", run["train_returned"])
                    if len(data["runs"]) == 1
                    else run["train_returned"]
                )
                first.append(end - data["marks"]["process_started"] - epochs)
            else:
                later.append(run["train_returned"] - run["driver_started"] - epochs)
    return first, later


def fmt(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f}" if values else "–"


def cpu_rows(rounds: list[dict], key: str) -> list[tuple[str, list[float]]]:
    kinds = sorted({k for d in rounds for r in d["runs"] for k in r[key]})
    rows = [(kind, [r[key].get(kind, 0.0) for d in rounds for r in d["runs"][1:] or d["runs"]]) for kind in kinds]
    return sorted(rows, key=lambda row: -statistics.median(row[1]))


def report(args, rounds: list[dict]) -> str:
    load = [d["load"] for d in rounds]
    workers = rounds[0].get("workers", 1)
    mode = "Ray Train's local mode (ray.num_workers 0), 1 CPU" if workers == 0 else f"{workers} worker(s) x 1 CPU"
    lines = [
        f"{len(rounds)} round(s) x {args.runs} run(s) of {args.epochs} epoch(s), {args.samples} images, "
        f"{mode}; RAY_TRAIN_HEALTH_CHECK_INTERVAL_S={args.health_check or 'engine default'}; "
        f"load average at round ends (1 min): {', '.join(f'{one_min:.1f}' for one_min, *_ in load)}; "
        f"{os.cpu_count()} CPUs",
        "",
        "| phase | first run of a process, s (min / median) | later runs, same Ray, s (min / median) |",
        "|---|---:|---:|",
    ]
    for name, first, later in phase_rows(rounds):
        lines.append(f"| {name} | {fmt(first)} | {fmt(later)} |")
    first, later = totals(rounds)
    lines.append(f"| **fixed cost per run** (wall-clock minus epochs) | **{fmt(first)}** | **{fmt(later)}** |")
    epoch = [r["epoch_s"] for d in rounds for r in d["runs"]]
    lines += [
        "",
        f"Epochs: {statistics.median(epoch):.2f} s each (median).",
        "",
        "CPU seconds by process kind from the run's start to its first epoch (later runs; the first "
        "run when there is one run per round), median:",
        "",
        "| process | CPU s |",
        "|---|---:|",
    ]
    lines += [f"| {kind} | {statistics.median(v):.2f} |" for kind, v in cpu_rows(rounds, "cpu_startup")]
    window = statistics.median(r["training_window_s"] for d in rounds for r in d["runs"])
    lines += [
        "",
        f"CPU seconds by process kind while the epochs ran ({window:.1f} s window), median "
        "(share of one core in brackets):",
        "",
        "| process | CPU s | share of a core |",
        "|---|---:|---:|",
    ]
    for kind, values in cpu_rows(rounds, "cpu_training"):
        windows = [r["training_window_s"] for d in rounds for r in d["runs"][1:] or d["runs"]]
        share = statistics.median(v / w for v, w in zip(values, windows))
        lines.append(f"| {kind} | {statistics.median(values):.2f} | {share:.1%} |")
    return "\n".join(lines)


def side_by_side(by_mode: dict[int, list[dict]]) -> str:
    """Fixed cost per run of each mode, and each mode's over the first's (medians)."""
    base = by_mode[next(iter(by_mode))]
    (base_first, base_later) = totals(base)
    lines = [
        "| ray.num_workers | first run of a process, s (min / median) | later runs, s (min / median) | "
        "first / first's | later / first's |",
        "|---:|---:|---:|---:|---:|",
    ]
    for workers, rounds in by_mode.items():
        first, later = totals(rounds)
        ratio = [
            statistics.median(v) / statistics.median(b) if v and b else float("nan")
            for v, b in ((first, base_first), (later, base_later))
        ]
        lines.append(f"| {workers} | {fmt(first)} | {fmt(later)} | {ratio[0]:.2f} | {ratio[1]:.2f} |")
    return "\n".join(lines)
