"""benchmarks/speed/phase_costs.py from its command line at its tiny size on the CPU (one round, one torch
thread): a row per installed integration and workload, every phase's cost positive and finite, each scoring
pass in the batch its Selector reports, the rows not run said with their reason. No timing threshold: what
the costs are is the study's (docs/findings/phase-costs.md), and machines differ threefold. The same run on
CUDA (bf16) under ``pytest -m gpu``."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers.paths import REPO

SCRIPT = REPO / "benchmarks" / "speed" / "phase_costs.py"
# (integration, workload) -> the module it needs, beside torch, timm and transformers
EXPECTED = {
    ("engine", "vit"): None,
    ("Selector", "vit"): None,
    ("Selector", "lm"): None,
    ("AtteNTTrainer", "vit"): None,
    ("AtteNTTrainer", "lm"): None,
    ("AtteNTSFTTrainer", "lm"): "trl",
    ("Lightning", "vit"): "lightning",
    ("Lightning", "lm"): "lightning",
}
COSTS = (
    "train_s_per_sample",
    "score_s_per_sample",
    "load_s_per_sample",
    "score_load_s_per_sample",
    "selection_s_per_reselection",
    "score_over_train",
    "forward_over_train",
)


def run(tmp_path, *args: str) -> dict:
    out = tmp_path / "phase_costs"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "tiny", "--repeats", "1", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads((out / "results.json").read_text()), "readme": (out / "README.md").read_text()}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    return run(tmp_path_factory.mktemp("cpu"), "--device", "cpu")


def installed() -> set[tuple[str, str]]:
    return {key for key, module in EXPECTED.items() if module is None or importlib.util.find_spec(module)}


def check(results: dict) -> None:
    rows = {(r["integration"], r["workload"]): r for r in results["rows"]}
    assert set(rows) == installed()
    said = {(s["integration"], s["workload"]) for s in results["skipped"]}
    assert said == {(i, w) for i in {i for i, _ in EXPECTED} for w in ("vit", "lm")} - installed()
    for key, row in rows.items():
        for name in COSTS:
            assert math.isfinite(row[name]) and row[name] > 0, (key, name, row[name])
        assert f"| {key[0]} | {key[1]} |" in results["readme"]
    fits = results["fits"]
    for fit in fits:  # two epochs: each scored every sample, trained half of them, re-selected once
        assert fit["scored"] == 2 * fit["pool"] and fit["trained"] == fit["pool"] and fit["reselections"] == 2
        assert fit["loaded"] == fit["pool"] // 2 and fit["score_loaded"] == fit["pool"]


def test_a_row_per_installed_integration_and_workload_with_every_cost_positive(results):
    check(results)
    assert results["device"] == "cpu"


def test_each_scoring_pass_uses_the_batch_its_selector_reports(results):
    for row in results["rows"]:
        assert len(row["scoring_batches"]) == 2
        assert all(b == min(row["reported_scoring_batch"], row["pool"]) for b in row["scoring_batches"]), row


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible here)")
def test_the_same_on_cuda_in_bf16(tmp_path):
    results = run(tmp_path, "--device", "cuda")
    check(results)
    assert results["device"] == "cuda"
