"""Runs that several tests read, each trained at most once per test session (``conftest``'s
session fixtures train them on first use, so every test stays independent of the order):

- the reference runs: fixed seeds through the whole engine, their per-epoch numbers and subsets
  recorded in ``reference_runs.json``. A change that claims to change no behaviour must
  reproduce them bit for bit where the same CPU kernels run (the record names torch's build, its
  CPU capability and the processor model), to 1e-5 elsewhere. Variants of a reference run (a
  worker killed, kernels tracked, two Ray nodes) must reproduce it too.
- two small digits sweeps (Ray Tune + Train, MLflow in SQLite): sample ratios 80 / 50 % and full
  data (the paper's Table 5); and the ablation (Table 3): full data, the incremental schedule at
  two soft temperatures, the cosine schedule.

Re-record the references (only for a change that means to change the numbers, saying so in its
commit): ``ATTENT_RECORD_REFERENCE=1 pytest tests/test_reference_runs.py``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from attent.config import ExperimentConfig, build_experiment
from attent.selection.config import deep_merge

TESTS = Path(__file__).resolve().parent
REPO, SHARED = TESTS.parent, TESTS.parent.parent / "shared"
RECORD = TESTS / "reference_runs.json"

DIGITS = {
    "seed": 5,
    "task": {"name": "vision", "dataset": "digits", "img_size": 8,
             "model": {"preset": "vit_tiny_cpu", "patch_size": 2}},
    "train": {"epochs": 4, "batch_size": 32},
    "ray": {"num_workers": 2},
}
REFERENCE_RUNS: dict[str, dict[str, Any]] = {
    "digits-soft": deep_merge(DIGITS, {"selection": {"preset": "vit"}}),
    "digits-infobatch": deep_merge(DIGITS, {"selection": {"method": "infobatch"}}),
    "digits-full": deep_merge(DIGITS, {"selection": {"method": "full"}}),
    # AtteNT's LLM variant: epoch 1 on all 12 examples, epoch 2 on the 70 % with the highest
    # losses of epoch 1's own forwards (no scoring pass); greedy GSM8K answers and the held-out
    # response loss after each epoch
    "llm": {
        "seed": 0,
        "task": {"name": "llm", "model": "smollm2-135m-instruct", "lora_r": 4, "dataset": "gsm8k",
                 "data_dir": str(SHARED / "datasets"), "train_limit": 12, "max_length": 128,
                 "eval": {"benchmarks": ["gsm8k", "gsm8k_loss"], "eval_limit": 2, "max_new_tokens": 24,
                          "eval_batch_size": 2, "response_loss_limit": 6}},
        "train": {"epochs": 2, "batch_size": 4, "global_batch_size": 8, "lr": 2e-4},
        "selection": {"preset": "llm"},
        "ray": {"num_workers": 1},
    },
}
# Variants of a reference run that must train identically: its rank 0 killed after epoch 2 and
# restarted from the checkpoint, while the run tracks the empirical kernel on a probe set.
VARIANTS: dict[str, dict[str, Any]] = {
    "restarted": {"antk": {"enabled": True}, "fault": {"fail_once_after_epoch": 1}, "ray": {"max_failures": 1}},
}
TIMED = "time_"  # per-epoch values that depend on the wall-clock: not compared


def cpu_kernels() -> str:
    """What decides the CPU kernels' rounding: torch's build, its vector ISA and the processor
    (oneDNN and MKL pick their blocking per CPU model: two AVX512 machines, one Intel and one AMD,
    differed in the 8th digit)."""
    return f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {processor()}"


def processor() -> str:
    """The CPU's vendor, family and model (Linux), else what Python's platform module says."""
    try:
        fields = dict(map(str.strip, line.split(":", 1)) for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if ":" in line)
        return " ".join(fields[k] for k in ("vendor_id", "cpu family", "model") if k in fields)
    except OSError:
        import platform
        return platform.processor() or platform.machine()


def reference_experiment(name: str, root: Path, variant: str = "") -> ExperimentConfig:
    """A reference run's experiment (or one of its ``VARIANTS``, ``<name>-<variant>``), stored
    under ``root``."""
    data = deep_merge(REFERENCE_RUNS[name], VARIANTS[variant] if variant else {})
    data = deep_merge(data, {"name": f"{name}-{variant}" if variant else name,
                             "ray": {"storage_path": str(root / "ray_results")},
                             "mlflow": {"tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "experiment": "reference"}})
    return build_experiment(data)


@dataclass
class TrainedRun:
    cfg: ExperimentConfig
    run_id: str
    metrics: dict[str, float]         # the last report
    epochs: list[dict[str, float]]    # epoch_history.json
    subsets: list[list[int]]          # selection_history.json: each re-selection's indices

    @property
    def tracking_uri(self) -> str:
        return self.cfg.mlflow.tracking_uri


def histories(tracking_uri: str, run_id: str, scratch: Path) -> tuple[list[dict[str, float]], list[list[int]]]:
    """A finished run's per-epoch rows and its re-selections' subsets, from its MLflow artifacts."""
    import mlflow
    client = mlflow.MlflowClient(tracking_uri)
    scratch.mkdir(parents=True, exist_ok=True)
    epochs = json.loads(Path(client.download_artifacts(run_id, "epoch_history.json", str(scratch))).read_text())
    selections = json.loads(Path(client.download_artifacts(run_id, "selection_history.json",
                                                          str(scratch))).read_text())["selections"]
    return epochs, [s["indices"] for s in selections]


def train_run(cfg: ExperimentConfig, scratch: Path) -> TrainedRun:
    from attent.engine.driver import train
    result = train(cfg)
    return TrainedRun(cfg, result.run_id, result.metrics,
                      *histories(cfg.mlflow.tracking_uri, result.run_id, scratch / cfg.name))


def untimed(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items() if not k.startswith(TIMED)} for row in rows]


def record(name: str, run: TrainedRun) -> None:
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    recorded[name] = {"recorded_with": cpu_kernels(), "epochs": untimed(run.epochs), "subsets": run.subsets}
    RECORD.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")


def recorded(name: str) -> dict[str, Any]:
    return json.loads(RECORD.read_text())[name]


def assert_reproduces(name: str, epochs: list[dict[str, float]], subsets: list[list[int]]) -> None:
    """A run chose the recorded subsets and logged every recorded per-epoch number: bit for bit
    on the recording's CPU kernels, to 1e-5 elsewhere. (A variant may log more, e.g. kernels.)"""
    expected = recorded(name)
    assert subsets == expected["subsets"]  # the same samples at every re-selection
    assert len(epochs) == len(expected["epochs"])
    exact = expected["recorded_with"] == cpu_kernels()
    for epoch, (row, want) in enumerate(zip(epochs, expected["epochs"])):
        for key, value in want.items():
            if exact:
                assert row[key] == value, (epoch, key, row[key], value)
            else:
                assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (epoch, key, row[key], value)


# --- the digits sweeps ---------------------------------------------------------------------------
RATIO_SWEEP, ABLATION_SWEEP = "e2e-ratio", "e2e-ablation"
FULL = {"selection.preset": None, "selection.method": "full"}
SWEEPS = {
    RATIO_SWEEP: {"overrides": {"selection.strategy": "hard", "selection.interval": {"kind": "fixed", "start": 1}},
                  "grid": {"selection.ratio": [{"kind": "fixed", "start": r} for r in (0.8, 0.5)]},
                  "trials": [FULL]},
    ABLATION_SWEEP: {"grid": {"selection.temperature": [0.5, 2.0]},  # the ViT preset: incremental ratio
                     "trials": [FULL, {"selection.ratio": {"kind": "cosine", "start": 0.2, "end": 0.8}}]},
}
SWEEP_TRAIN_SAMPLES, SWEEP_TEST_SAMPLES = 300, 100


def write_sweep(root: Path, uri: str, name: str, sweep: dict) -> Path:
    """A sweep over the digits experiment shrunk to seconds per trial, two trials at a time."""
    sweep = dict(sweep)
    overrides = {"train.epochs": 2, "task.train_limit": SWEEP_TRAIN_SAMPLES, "task.test_limit": SWEEP_TEST_SAMPLES,
                 "ray.num_workers": 1, "ray.storage_path": str(root / "ray_results"),
                 "mlflow.tracking_uri": uri, **sweep.pop("overrides", {})}
    spec = {"name": name, "base": str(REPO / "experiments" / "digits_vit.yaml"),
            "overrides": overrides, "seeds": [0], "max_concurrent": 2, **sweep}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"sweep": spec}, sort_keys=False, allow_unicode=True))
    return path


@dataclass
class SweptStore:
    tracking_uri: str
    root: Path
    results: dict[str, list]  # sweep name -> Tune's results of its trials


def run_digits_sweeps(root: Path) -> SweptStore:
    from attent.sweep import run_sweep
    uri = f"sqlite:///{root / 'mlflow.db'}"
    results = {}
    for name, sweep in SWEEPS.items():
        results[name] = list(run_sweep(write_sweep(root, uri, name, sweep)))
        assert all(result.error is None for result in results[name]), [r.error for r in results[name]]
    return SweptStore(uri, root, results)
