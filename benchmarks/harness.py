"""What the performance scripts of the suite share: the machine a measurement ran on (processor
and its vector instructions, load, Python, torch, the GPU), a results folder named after the script
and stamped with machine, date and commit (``results/<script>/<date>-<machine>-<commit>/``, its
``machine.json`` and the README the script writes), the experiment a timing script builds from a
base YAML, one epoch clock for Hugging Face Trainer arms, and ratios between arms measured in the
same round.

A script in a topic folder (``benchmarks/<topic>/<script>.py``) puts this folder on its module
path, the one entry it adds, and imports this module as ``harness``; ``attent`` comes as installed
(``pip install -e .``). Nothing outside ``benchmarks/`` imports it.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


# --- the machine --------------------------------------------------------------------------------


def commit() -> str:
    """The working tree's commit (short), with ``+changes`` when it differs from it."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    head = git("rev-parse", "--short=9", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def cpu_isa() -> str:
    """The widest vector instructions the processor offers (Linux's /proc/cpuinfo flags): AVX512,
    AVX2, AVX, NEON, or the machine's architecture where none is listed."""
    try:
        flags = next(
            (
                line.split(":", 1)[1].split()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith(("flags", "Features"))
            ),
            [],
        )
    except OSError:
        flags = []
    for flag, name in (("avx512f", "AVX512"), ("avx2", "AVX2"), ("avx", "AVX"), ("asimd", "NEON")):
        if flag in flags:
            return name
    return platform.machine()


def machine() -> dict[str, Any]:
    """The machine a measurement runs on: processor and its vector instructions, CPUs, load,
    Python and torch (with the CPU kernels it picked), the GPU if one is visible, the commit and
    the time (UTC)."""
    from attent.cli.doctor import cpu_model

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_isa": cpu_isa(),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "python": platform.python_version(),
        "host": platform.node(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if "torch" in sys.modules or _importable("torch"):
        import torch

        info["torch"] = torch.__version__
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
            info["cuda"] = torch.version.cuda
    return info


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def machine_line(info: dict[str, Any] | None = None) -> str:
    """One Markdown line naming the machine, for a report's head."""
    info = info or machine()
    device = f"{info['gpu']} (CUDA {info['cuda']}), " if info.get("gpu") else ""
    load = " ".join(f"{x:.2f}" for x in info["load_average"])
    torch = f", torch {info['torch']} ({info.get('torch_cpu_capability', '?')} kernels)" if info.get("torch") else ""
    return (
        f"Machine: {device}{info['cpu']} ({info.get('cpu_isa', '?')}), {info['cpus']} CPUs, load average {load}; "
        f"Python {info['python']}{torch}; commit `{info['commit']}`, {info['date']}."
    )


def study_name() -> str:
    """The study a running script measures: its file's name (``fixed_cost`` for
    ``benchmarks/overheads/fixed_cost.py``), which names its folder under ``results/``."""
    return Path(sys.argv[0]).stem


def stamped_folder(study: str | None = None, info: dict[str, Any] | None = None, root: Path = RESULTS) -> Path:
    """``results/<study>/<date>-<machine>-<commit>/`` (the study: the running script's name),
    made, with the machine described in its ``machine.json``: a new measurement never overwrites
    an earlier one."""
    info = info or machine()
    where = info.get("gpu") or info["cpu"]
    slug = re.sub(r"[^a-z0-9]+", "-", where.lower()).strip("-")[:40]
    folder = root / (study or study_name()) / f"{time.strftime('%Y-%m-%d', time.gmtime())}-{slug}-{info['commit']}"
    return results_folder(folder, info)


def results_folder(out: Path | str | None, info: dict[str, Any] | None = None) -> Path:
    """Where a script writes its results: ``out`` when given (a script's ``--out``), else a new
    stamped folder of its study; made, with the machine described in its ``machine.json``."""
    if out is None:
        return stamped_folder(None, info)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "machine.json", info or machine())
    return folder


def write_json(path: Path, data: Any) -> Path:
    """``data`` as indented JSON at ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def write_readme(folder: Path, title: str, command: str, body: str, info: dict[str, Any] | None = None) -> Path:
    """``folder/README.md``: what was measured, the command that measured it, the machine, then
    ``body`` (the script's tables)."""
    path = folder / "README.md"
    path.write_text(f"# {title}\n\n`{command}`\n\n{machine_line(info)}\n\n{body.strip()}\n")
    return path


def command_line(argv: list[str] | None = None) -> str:
    """How this script was run, as a reader would type it."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(REPO) if script.is_relative_to(REPO) else script
    return " ".join(["python", str(shown), *(sys.argv[1:] if argv is None else argv)])


# --- runs ---------------------------------------------------------------------------------------

# AtteNT under the released code's reading of "interval", as the cycles verdict runs it
# (benchmarks/specs/cycles_verdict_6000.yaml; E = 21: a warm-up, then 4 cycles of 5 epochs)
CYCLES_SELECTION = [
    "selection.preset=vit",
    "selection.warmup_epochs=1",
    "selection.soft_logits=raw",
    "selection.temperature=1.0",
    "selection.ratio={kind: incremental, start: 0.2, end: 0.8}",
    "selection.interval={kind: cycles, cycles: 4, start: 1, end: 4}",
]


def experiment(
    base: Path,
    name: str,
    overrides: Iterable[str],
    workdir: Path | str,
    mlflow_experiment: str,
    *,
    workers: int = 1,
    threads: float = 1,
    checkpoint_every: int = 1,
):
    """A timing script's run of ``base`` with ``overrides``: ``workers`` Ray Train workers (0:
    local mode, in the calling process) on ``threads`` CPUs each, its checkpoints and its MLflow
    store (SQLite) under ``workdir``; resolved."""
    from attent.experiment.files import load_experiment

    workdir = Path(workdir)
    return load_experiment(
        base,
        [
            f"name={name}",
            *overrides,
            f"ray.num_workers={workers}",
            f"ray.cpus_per_worker={threads:g}",
            f"ray.checkpoint_every={checkpoint_every}",
            f"ray.storage_path={workdir / 'ray_results'}",
            f"mlflow.tracking_uri=sqlite:///{workdir / 'mlflow.db'}",
            f"mlflow.experiment={mlflow_experiment}",
        ],
    ).resolved(REPO)


def epoch_clock(device: str = "cpu"):
    """A ``transformers.TrainerCallback`` timing each epoch, on_epoch_begin to on_epoch_end
    (``.epochs``: seconds per epoch), and the steps, on_step_begin to on_step_end (``.steps``:
    their sum); a CUDA ``device`` is synchronised at both ends of each."""
    import torch
    from transformers import TrainerCallback

    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)

    class EpochClock(TrainerCallback):
        def __init__(self):
            self.epochs: list[float] = []
            self.steps = 0.0
            self._epoch = self._step = 0.0

        def on_epoch_begin(self, args, state, control, **kwargs):
            sync()
            self._epoch = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kwargs):
            sync()
            self.epochs.append(time.perf_counter() - self._epoch)

        def on_step_begin(self, args, state, control, **kwargs):
            self._step = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.steps += time.perf_counter() - self._step

    return EpochClock()


# --- ratios -------------------------------------------------------------------------------------


def paired_ratios(
    rows: list[dict[str, Any]], key: str, arm: str, baseline: str, *, by: str = "round", label: str = "arm"
) -> list[float]:
    """``key`` of ``arm`` over ``key`` of ``baseline``, one ratio per value of ``by`` (a round,
    a seed) where both ran: arms measured side by side are compared within the pair, so a drift
    of the machine between rounds cancels."""
    values: dict[tuple[Any, str], float] = {(r[by], r[label]): r[key] for r in rows}
    pairs = sorted({r[by] for r in rows})
    return [values[p, arm] / values[p, baseline] for p in pairs if (p, arm) in values and (p, baseline) in values]


def ratio_text(ratios: list[float], unit: str = "round") -> str:
    """The median ratio and its range over the pairs, e.g. ``1.018 [1.003, 1.033] (2 rounds)``."""
    if not ratios:
        return "–"
    if len(ratios) == 1:
        return f"{ratios[0]:.3f} (1 {unit})"
    return f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] ({len(ratios)} {unit}s)"


def mean_std(values: list[float]) -> str:
    """``mean ± std`` of the values that are numbers (``–`` for none; the mean alone for one)."""
    values = [v for v in values if v == v]
    if not values:
        return "–"
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) if len(values) > 1 else math.nan
    return f"{mean:.4g} ± {spread:.2g}" if spread == spread else f"{mean:.4g}"


def judged_pairs(
    rows: list[dict[str, Any]],
    key: str,
    pairs: list[tuple[str, str, str, str]],
    margin: float | None,
    *,
    by: str = "seed",
    label: str = "arm",
) -> list:
    """One family of paired comparisons of ``key``, each ``(subject label, method label, subject
    arm, method arm)`` over the values of ``by`` (the seeds) that ran both arms, judged by the
    analysis package's ``judge_family``: paired t-tests Holm-adjusted across the family (the
    interval shown is the one at each comparison's Holm step), "better" / "worse" (at lower
    values) only where the adjusted test rejects, "equivalent within ± margin" from Holm-adjusted
    paired TOSTs where a margin is declared, "inconclusive" otherwise."""
    import numpy as np
    from attent.analysis.stats import MATCHED, Paired, judge_family

    values = {(r[by], r[label]): r[key] for r in rows}
    keys = sorted({r[by] for r in rows})
    family = []
    for subject, method, a, b in pairs:
        both = [k for k in keys if (k, a) in values and (k, b) in values]
        family.append(
            Paired(
                subject=subject,
                method=method,
                budget_match=MATCHED,
                quantity=key,
                subject_values=np.array([values[k, a] for k in both], dtype=float),
                method_values=np.array([values[k, b] for k in both], dtype=float),
                better_when="lower",
            )
        )
    return judge_family(family, margin)


def judged_cell(p) -> str:
    """A judged pair as a table cell: mean difference [Holm-step interval] and its verdict, said
    as "lower" or "higher" for better or worse (a cost or a loss is no verdict on a method by itself)."""
    if p.seeds == 0:
        return "–"
    if p.seeds < 2:
        return f"{p.mean:+.4g} (1 seed: no interval)"
    from attent.analysis.stats import BETTER, WORSE

    said = {BETTER: "lower", WORSE: "higher"}.get(p.verdict, p.verdict)
    return f"{p.mean:+.4g} [{p.low:+.4g}, {p.high:+.4g}] at {p.level:.1%}: **{said}**"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A results CSV's rows, numbers as numbers (integers where written as such), empty cells left out."""

    def value(text: str):
        try:
            number = float(text)
        except ValueError:
            return text
        return int(number) if number.is_integer() and "." not in text and "e" not in text else number

    with open(path, newline="") as f:
        return [{k: value(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def write_rows(path: Path, rows: list[dict[str, Any]], columns: Iterable[str]) -> None:
    """``rows`` as a results CSV of ``columns`` (a missing value left empty)."""
    columns = list(columns)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in columns})


def clock(read_batch, batches: int, repeats: int) -> dict[str, float]:
    """Median over repeats of (samples per CPU-second, samples per wall-second) of
    ``read_batch(b) -> samples`` over ``batches`` batches; one uncounted pass first."""
    cpu_rates, wall_rates = [], []
    for repeat in range(repeats + 1):
        cpu, wall, done = time.process_time(), time.perf_counter(), 0
        for b in range(batches):
            done += read_batch(b)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if repeat:
            cpu_rates.append(done / cpu)
            wall_rates.append(done / wall)
    return {"cpu_rate": statistics.median(cpu_rates), "wall_rate": statistics.median(wall_rates)}
