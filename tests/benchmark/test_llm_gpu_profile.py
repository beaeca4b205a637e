"""`benchmarks/llm/llm_gpu_profile.py` on this CPU, from its command line: a recorded run's
configuration (here the digits ViT, which trains in seconds; on the GPU node the LLM run of an
`attent bench --local` store or of `llm_size/h100/runs.json`) is trained as the recipe trains it
and profiled, and the summary counts what the profile saw."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from attent import contract
from attent.engine.tracking import finish_run, start_or_resume_run

from tests.helpers.paths import REPO


def profile(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "llm" / "llm_gpu_profile.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


TRAIN, BATCH = 96, 32  # training samples, batch size: 3 steps an epoch


def tiny_digits_experiment():
    """The digits ViT on full data, one epoch of ``TRAIN`` samples in batches of ``BATCH``."""
    from attent.experiment.files import load_experiment

    return load_experiment(
        REPO / "experiments" / "digits_vit.yaml",
        [
            f"task.train_limit={TRAIN}",
            "task.test_limit=32",
            f"train.batch_size={BATCH}",
            "train.epochs=1",
            "selection.preset=null",
            "selection.method=full",
        ],
    )


def write_recorded_runs(path: Path, cfg) -> None:
    """A runs.json as `llm_size/h100/runs.json` records them: ``cfg``'s full data verdict run, and
    an AtteNT one beside it."""
    recorded = {
        "runs": [
            {"method": "full", "seed": cfg.seed, "stage": "verdict", "config": cfg.model_dump(mode="json")},
            {"method": "attent", "seed": cfg.seed, "stage": "verdict", "config": {}},
        ]
    }
    path.write_text(json.dumps(recorded))


def log_verdict_run(cfg, uri: str) -> None:
    """``cfg`` as `attent bench` records it in MLflow at ``uri``, experiment "bench": a finished
    verdict run tagged with its method."""
    logged = cfg.model_copy(
        update={"mlflow": cfg.mlflow.model_copy(update={"tracking_uri": uri, "experiment": "bench"})}
    )
    run_id, _ = start_or_resume_run(
        logged,
        role=contract.ROLE_TRIAL,
        extra_tags={contract.TAG_BENCH_METHOD: "full", contract.TAG_BENCH_STAGE: contract.BENCH_STAGE_VERDICT},
    )
    finish_run(uri, run_id, ok=True)


def test_the_profile_counts_the_recorded_runs_steps_and_names_where_time_went(tmp_path):
    cfg = tiny_digits_experiment()
    write_recorded_runs(tmp_path / "runs.json", cfg)
    profile(
        str(tmp_path / "runs.json"),
        "--method",
        "full",
        "--seed",
        str(cfg.seed),
        "--out",
        str(tmp_path / "prof"),
        "--tag",
        "cpu",
        "train.eval_every=1",
    )

    summary = json.loads((tmp_path / "prof" / "cpu.summary.json").read_text())
    assert summary["steps_per_epoch"] == math.ceil(TRAIN / BATCH)
    assert summary["overrides"] == ["train.eval_every=1"]
    assert summary["device"] == "cpu" and summary["device_busy_s"] == 0  # no CUDA kernels on a CPU
    assert all(seconds > 0 for seconds in summary["epoch_s"].values())  # warm-up, torch.profiler, cProfile, plain
    hosts = [name for name, _, _ in summary["top_by_host"]]
    assert any(name.startswith("aten::") for name in hosts), hosts  # torch.profiler saw the operators
    text = (tmp_path / "prof" / "cpu.profile.txt").read_text()
    assert "train_one_epoch" in text and "Self CPU" in text  # cProfile's and the profiler's tables

    # the same run as `attent bench` records it in MLflow (a verdict run tagged with its method)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log_verdict_run(cfg, uri)
    profile(
        uri,
        "--experiment",
        "bench",
        "--method",
        "full",
        "--seed",
        str(cfg.seed),
        "--out",
        str(tmp_path / "prof"),
        "--tag",
        "timed",
        "--timing",
        "2",
    )
    timed = json.loads((tmp_path / "prof" / "timed.summary.json").read_text())
    assert len(timed["epoch_s"]["plain"]) == 2 and timed["steps_per_epoch"] == math.ceil(TRAIN / BATCH)
    assert timed["s_per_step_plain"] > 0 and "top_by_host" not in timed  # no profiler ran
    assert not (tmp_path / "prof" / "timed.profile.txt").exists()
