"""`benchmarks/llm_gpu_profile.py` on this CPU: a recorded run's configuration (here the digits ViT,
which trains in seconds; on the GPU node the LLM run of `llm_size/h100/runs.json`) is trained as the
recipe trains it and profiled, and the summary counts what the profile saw."""
from __future__ import annotations

import json
import math

from conftest import REPO, benchmark_script


def test_the_profile_counts_the_recorded_runs_steps_and_names_where_time_went(tmp_path):
    from attent.config import load_experiment
    train, batch = 96, 32
    cfg = load_experiment(REPO / "experiments" / "digits_vit.yaml",
                          [f"task.train_limit={train}", "task.test_limit=32", f"train.batch_size={batch}",
                           "train.epochs=1", "selection.preset=null", "selection.method=full"])
    recorded = {"runs": [
        {"method": "full", "seed": cfg.seed, "stage": "verdict", "config": cfg.model_dump(mode="json")},
        {"method": "attent", "seed": cfg.seed, "stage": "verdict", "config": {}}]}
    (tmp_path / "runs.json").write_text(json.dumps(recorded))
    script = benchmark_script("llm_gpu_profile")
    script.main([str(tmp_path / "runs.json"), "--method", "full", "--seed", str(cfg.seed),
                 "--out", str(tmp_path / "prof"), "--tag", "cpu", "train.eval_every=1"])

    summary = json.loads((tmp_path / "prof" / "cpu.summary.json").read_text())
    assert summary["steps_per_epoch"] == math.ceil(train / batch)
    assert summary["overrides"] == ["train.eval_every=1"]
    assert summary["device"] == "cpu" and summary["device_busy_s"] == 0  # no CUDA kernels on a CPU
    assert all(seconds > 0 for seconds in summary["epoch_s"].values())  # warm-up, torch.profiler, cProfile, plain
    hosts = [name for name, _, _ in summary["top_by_host"]]
    assert any(name.startswith("aten::") for name in hosts), hosts  # torch.profiler saw the operators
    text = (tmp_path / "prof" / "cpu.profile.txt").read_text()
    assert "train_one_epoch" in text and "Self CPU" in text  # cProfile's and the profiler's tables

    script.main([str(tmp_path / "runs.json"), "--method", "full", "--seed", str(cfg.seed),
                 "--out", str(tmp_path / "prof"), "--tag", "timed", "--timing", "2"])
    timed = json.loads((tmp_path / "prof" / "timed.summary.json").read_text())
    assert len(timed["epoch_s"]["plain"]) == 2 and timed["steps_per_epoch"] == math.ceil(train / batch)
    assert timed["s_per_step_plain"] > 0 and "top_by_host" not in timed  # no profiler ran
    assert not (tmp_path / "prof" / "timed.profile.txt").exists()
