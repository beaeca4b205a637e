"""The steps of ``gpu_check.py``: each one's command line (on a GPU, or at its smallest on the CPU with
``--cpu``) and the figures read back from what it wrote. Each step runs as a subprocess of its own; the
stand-in storage is built by the tests' helper (``tests/helpers/standin_storage.py``) in one of them, so
that nothing here imports the tests.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MULTIMAE = "experiments/multimae_gpu.yaml"
MILESTONE = "experiments/sweeps/milestone_llama2_metamath_gpu.yaml"
LORA = "experiments/llm_lora_gpu.yaml"
GPU_TESTS = ("tests/engine/test_gpu.py", "tests/system/test_gpu.py")
# One GPU: one worker per stand-in (its default two would each wait for a GPU of their own).
ONE_WORKER = "ray.num_workers=1"
# On the CPU the plans measure small stand-ins of the models (a 7B model does not fit there).
CPU_MAE = ["task.model.preset=vit_tiny_cpu", "task.model.patch_size=16", "train.batch_size=4",
           "train.loader_workers=1", "ray.cpus_per_worker=1", "downstream=[]"]  # fmt: skip
CPU_LORA = ["task.model=smollm2-135m-instruct", "task.max_length=64", "task.lora_r=8", "train.batch_size=2",
            "ray.cpus_per_worker=1"]  # fmt: skip

STORAGE_CODE = """
import json, sys
from pathlib import Path
from tests.helpers import standin_storage as storage
folder = Path(sys.argv[1])
storage.SHARED_DATASETS, storage.BIN = Path(sys.argv[2]), Path(sys.argv[3])
storage.build(folder)
Path(sys.argv[4]).write_text(json.dumps(storage.job_env(folder)))
"""


@dataclass
class Context:
    """What every step reads: the repository, the scratch folder, the mode and the storage built."""

    repo: Path
    work: Path
    cpu: bool
    datasets: Path | None
    shim: Path  # a folder holding an `attent` command for this Python
    job_env: dict[str, str] = field(default_factory=dict)  # the stand-in storage's, once built

    @property
    def storage(self) -> Path:
        return self.work / "storage"

    def attent(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "attent.cli", *args]


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    weight: float  # its share of the budget, against the others'
    command: Callable[[Context, Path], list[str] | str]  # argv, or why it is skipped
    figures: Callable[[Context, Path, str], dict[str, Any]]  # from its folder and its output
    needs_storage: bool = False


# --- the stand-in storage ---------------------------------------------------------------------------------
def storage_command(ctx: Context, folder: Path) -> list[str] | str:
    if ctx.datasets is None or not (ctx.datasets / "gsm8k" / "train.jsonl").is_file():
        return (
            f"no GSM8K/MBPP mirror at {ctx.datasets}: copy the one beside the clone (../shared/datasets) into "
            "the repository's shared/datasets, or give --datasets"
        )
    env_file = ctx.work / "job_env.json"
    return [sys.executable, "-c", STORAGE_CODE, str(ctx.storage), str(ctx.datasets), str(ctx.shim), str(env_file)]


def storage_figures(ctx: Context, folder: Path, output: str) -> dict[str, Any]:
    ctx.job_env.update(json.loads((ctx.work / "job_env.json").read_text()))
    size = sum(p.stat().st_size for p in ctx.storage.rglob("*") if p.is_file())
    return {"summary": f"{size / 2**20:.0f} MiB at {ctx.storage}", "mib": round(size / 2**20, 1)}


# --- the GPU tests ----------------------------------------------------------------------------------------
def tests_command(ctx: Context, folder: Path) -> list[str]:
    junit = f"--junitxml={folder / 'junit.xml'}"
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *GPU_TESTS, junit]


def tests_figures(ctx: Context, folder: Path, output: str) -> dict[str, Any]:
    tests, counts = {}, {"passed": 0, "failed": 0, "skipped": 0}
    for case in ET.parse(folder / "junit.xml").getroot().iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        outcome = {"failure": "failed", "error": "failed"}.get(outcome, outcome)
        counts[outcome] += 1
        tests[case.get("name")] = {"outcome": outcome, "seconds": round(float(case.get("time", 0)), 1)}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    shown = "; ".join(
        f"{name} {t['outcome']} {t['seconds']} s" for name, t in tests.items() if t["outcome"] != "skipped"
    )
    figures = {"summary": summary + (f" ({shown})" if shown else ""), **counts, "tests": tests}
    if counts["skipped"] and not counts["passed"] and not counts["failed"]:
        figures["status"] = "skipped"  # no CUDA here: every test skipped itself, saying why
    return figures


# --- the rehearsals ---------------------------------------------------------------------------------------
def rehearse(file: str) -> Callable[[Context, Path], list[str]]:
    def command(ctx: Context, folder: Path) -> list[str]:
        out = str(folder / "reports")
        return ctx.attent("rehearse", "--shared-folder", str(ctx.storage), "--out", out, file, ONE_WORKER)

    return command


def rehearse_figures(ctx: Context, folder: Path, output: str) -> dict[str, Any]:
    done = re.search(r"\[attent\] rehearsed (\S+) as (\S+) in (\d+)s: (.*)", output)
    if done is None:
        return {"summary": "no rehearsal line in its output"}
    # the failure rehearsed once: a run says "resumed ... from its epoch-2 checkpoint", a sweep's trial
    # "resumed from checkpoint after epoch 2"
    resumed = re.search(r"\[attent\] resumed .*checkpoint", output) is not None
    store = tracked(folder / "mlflow.db")
    gpu = "on the GPU" if store["use_gpu"] == ["True"] else f"use_gpu {store['use_gpu']}"
    return {
        "summary": f"{done[2]} in {done[3]} s, {gpu}; resumed from its checkpoint: {'yes' if resumed else 'no'}; "
        f"runs {store['runs']}; {done[4]}",
        "rehearsed_s": int(done[3]),
        "resumed": resumed,
        "result": done[4],
        **store,
    }


def tracked(db: Path) -> dict[str, Any]:
    """What the step's own MLflow store holds: its runs by status, whether their workers had a GPU,
    and whether MLflow logged GPU system metrics (read with sqlite3: no MLflow in this process)."""
    import sqlite3

    with sqlite3.connect(db) as con:
        runs = dict(con.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall())
        use_gpu = [v for (v,) in con.execute("SELECT DISTINCT value FROM params WHERE key = 'ray.use_gpu'")]
        gpu_metrics = con.execute("SELECT COUNT(DISTINCT key) FROM latest_metrics WHERE key LIKE 'system/%gpu%'")
        return {"runs": runs, "use_gpu": sorted(use_gpu), "gpu_system_metrics": gpu_metrics.fetchone()[0]}


# --- attent plan --measure --------------------------------------------------------------------------------
def plan(file: str, cpu_overrides: list[str]) -> Callable[[Context, Path], list[str]]:
    """`attent plan --measure` of ``file`` with its /shared paths moved to the stand-in storage (its
    data and its downstream jobs' data measured by their own loaders)."""

    def command(ctx: Context, folder: Path) -> list[str]:
        text = (ctx.repo / file).read_text()
        copy = folder / Path(file).name
        copy.write_text(re.sub(r"(?<![\w./])/shared/", f"{ctx.storage}/shared/", text))
        overrides = cpu_overrides if ctx.cpu else []
        return ctx.attent(
            "plan", "--measure", str(copy), *overrides, "--gpu", "h100", "--json", str(folder / "plan.json")
        )

    return command


def plan_figures(ctx: Context, folder: Path, output: str) -> dict[str, Any]:
    data = json.loads((folder / "plan.json").read_text())
    measured = [
        {key: m[key] for key in ("device", "batch_size", "train_samples_per_s", "score_samples_per_s",
                                 "loader_samples_per_s", "loader_workers")}
        for m in data["measurements"]
    ]  # fmt: skip
    runs = [
        {key: r[key] for key in ("run", "utilisation", "method_gpu_hours", "wall_clock_hours", "flops_saving")}
        for r in data["runs"]
    ]
    parts = []
    for m in measured:
        loader = "no loader" if m["loader_samples_per_s"] is None else (
            f"loader {m['loader_samples_per_s']:,.0f}/s on {m['loader_workers']} process(es)")  # fmt: skip
        parts.append(
            f"batch {m['batch_size']}: {m['train_samples_per_s']:,.1f} train/s, "
            f"{m['score_samples_per_s']:,.1f} score/s, {loader}"
        )
    total = data["totals"].get("method_gpu_hours")
    hours = f"; {total:,.1f} GPU-h on {data['accelerator']}" if isinstance(total, int | float) else ""
    device = measured[0]["device"] if measured else "?"
    return {"summary": f"{device}: " + " | ".join(parts) + hours, "measurements": measured, "runs": runs}


# --- the input pipeline -----------------------------------------------------------------------------------
def pipeline_command(ctx: Context, folder: Path) -> list[str]:
    samples, repeats = ("16", "1") if ctx.cpu else ("64", "2")
    script = str(ctx.repo / "benchmarks" / "speed" / "input_pipeline.py")
    out, work = str(folder / "results"), str(folder / "work")
    return [sys.executable, script, "--samples", samples, "--repeats", repeats, "--out", out, "--workdir", work]


def pipeline_figures(ctx: Context, folder: Path, output: str) -> dict[str, Any]:
    results = json.loads((folder / "results" / "results.json").read_text())
    rates = {
        name: {row["path"]: round(row["cpu_rate"], 1) for row in results[name]["rows"]}
        for name in ("imagefolder", "multimae-scenes", "multimae-photo-multimodal")
        if name in results
    }
    # the training loader's path after the cache ("after, scoring pass" is the faster, unaugmented one)
    after = {name: next(r for path, r in rows.items() if path.startswith("after:")) for name, rows in rates.items()}
    summary = "; ".join(f"{name} {rate:,.0f}" for name, rate in after.items())
    return {
        "summary": f"samples per CPU-second of one loader process, decoded cache: {summary}",
        "samples_per_cpu_s": rates,
        "h100_train_rate": results.get("h100_train_rate"),
    }


# --- AtteNTTrainer's savings ------------------------------------------------------------------------------
def savings_command(ctx: Context, folder: Path) -> list[str]:
    script = str(ctx.repo / "benchmarks" / "overheads" / "hf_overhead.py")
    size = ["--samples", "16", "--length", "32", "--batch", "8", "--layers", "2"] if ctx.cpu else [
        "--samples", "256", "--length", "256", "--batch", "16"]  # fmt: skip
    device = "cpu" if ctx.cpu else "cuda"
    return [sys.executable, script, "--device", device, *size, "--epochs", "3", "--rounds", "1",
            "--arms", "attent_llm", "attent_vit", "--out", str(folder / "results")]  # fmt: skip


def savings_figures(ctx: Context, folder: Path, output: str) -> dict[str, Any]:
    """Per preset: realized saving (1 - its method time / Trainer's) and ideal saving (1 - the samples
    it back-propagated / Trainer's), from hf_overhead.py's one round."""
    rows = json.loads((folder / "results" / "runs.json").read_text())["rows"]
    base = next(r for r in rows if r["arm"] == "trainer")
    presets = {}
    for row in rows:
        if row["arm"] != "trainer":
            presets[row["arm"].removeprefix("attent_")] = {
                "method_s": round(row["method_s"], 2),
                "realized_saving": round(1 - row["method_s"] / base["method_s"], 3),
                "ideal_saving": round(1 - row["samples_backpropagated"] / base["samples_backpropagated"], 3),
            }
    summary = "; ".join(
        f"{name}: realized {p['realized_saving']:.1%}, ideal {p['ideal_saving']:.1%}" for name, p in presets.items()
    )
    return {"summary": f"{summary} (Trainer {base['method_s']:.1f} s)", "trainer_s": base["method_s"], **presets}


STEPS = (
    Step("storage", "stand-in storage (tests/helpers/standin_storage.py)", 30, storage_command, storage_figures),
    Step("gpu_tests", "`pytest -m gpu` (tests/engine, tests/system)", 115, tests_command, tests_figures),
    Step("rehearse_multimae", f"`attent rehearse {MULTIMAE}`", 110, rehearse(MULTIMAE), rehearse_figures, True),
    Step("rehearse_milestone", f"`attent rehearse {MILESTONE}`", 80, rehearse(MILESTONE), rehearse_figures, True),
    Step("plan_mae", f"`attent plan --measure {MULTIMAE}` (ViT-B)", 45, plan(MULTIMAE, CPU_MAE), plan_figures, True),
    Step("plan_lora", f"`attent plan --measure {LORA}` (7B LoRA)", 50, plan(LORA, CPU_LORA), plan_figures, True),
    Step("input_pipeline", "input pipeline per loader process", 30, pipeline_command, pipeline_figures),
    Step("trainer_savings", "AtteNTTrainer's savings (llm, vit presets)", 55, savings_command, savings_figures),
)


def write_shim(folder: Path) -> Path:
    """A folder with an `attent` command running this Python's attent (a node without the venv's)."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "attent"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m attent.cli "$@"\n')
    shim.chmod(0o755)
    return folder


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
