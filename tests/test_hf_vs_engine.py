"""benchmarks/hf_vs_engine.py without training (its smoke run trains; see the script): the four
arms are one job on one task section, the savings pair each arm with its own framework's full run,
and the paired interval is scipy's t interval of the per-seed differences."""
from __future__ import annotations

import importlib.util
import math

import pytest
from scipy import stats

from conftest import REPO


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("hf_vs_engine", REPO / "benchmarks" / "hf_vs_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_arms_are_one_job(script, tmp_path):
    args = script.parse_args(["--problems", "16", "--heldout", "8", "--epochs", "2", "--seeds", "4"])
    cfgs = {arm: script.experiment(args, 4, arm, tmp_path, "t") for arm in script.ARMS}
    first = cfgs["trainer_full"]
    assert len({cfg.name for cfg in cfgs.values()}) == 4  # never one run resumed as another
    for cfg in cfgs.values():
        assert cfg.task == first.task and cfg.train == first.train and cfg.seed == 4
    task, train = first.task, first.train
    assert (task.train_limit, task.eval.response_loss_limit, task.split_seed) == (16, 8, None)  # the seed draws both
    assert task.eval.benchmarks == ["gsm8k_loss"] and train.eval_every == train.epochs == 2
    assert (train.batch_size, train.global_batch_size, train.lr, task.lora_r, task.max_length) == (4, 8, 5e-4, 4, 128)
    assert cfgs["engine_attent"].selection.preset == "llm" and cfgs["engine_attent"].selection.method == "attent"
    assert cfgs["engine_full"].selection.method == "full"
    assert cfgs["engine_attent"].ray.num_workers == 1


ARMS = ("trainer_full", "trainer_attent", "engine_attent", "engine_full")


def rows(method: dict, samples: dict, loss: dict, seeds=(0, 1, 2)) -> list[dict]:
    return [{"seed": s, "arm": arm, "method_s": method[arm] + s, "samples_backpropagated": samples[arm],
             "optimizer_steps": 1, "heldout_loss": loss[arm] + 0.01 * s * (arm == "trainer_attent"),
             "engine_own_heldout_loss": loss[arm] if arm.startswith("engine") else math.nan}
            for s in seeds for arm in ARMS]


def test_savings_pair_each_arm_with_its_frameworks_full_run(script):
    table = rows({"trainer_full": 100, "trainer_attent": 80, "engine_attent": 60, "engine_full": 120},
                 {"trainer_full": 384, "trainer_attent": 307, "engine_attent": 307, "engine_full": 384},
                 dict.fromkeys(ARMS, 1.0), seeds=(0,))
    script.add_savings(table)
    by = {r["arm"]: r for r in table}
    assert by["trainer_attent"]["realized_saving"] == pytest.approx(1 - 80 / 100)
    assert by["engine_attent"]["realized_saving"] == pytest.approx(1 - 60 / 120)
    assert by["engine_attent"]["ideal_saving"] == pytest.approx(1 - 307 / 384)
    assert by["trainer_full"]["realized_saving"] == by["engine_full"]["ideal_saving"] == 0


def test_paired_interval_and_summary(script):
    table = rows({"trainer_full": 100, "trainer_attent": 80, "engine_attent": 60, "engine_full": 120},
                 {"trainer_full": 384, "trainer_attent": 307, "engine_attent": 307, "engine_full": 384},
                 {"trainer_full": 1.50, "trainer_attent": 1.49, "engine_attent": 1.52, "engine_full": 1.51})
    script.add_savings(table)
    diffs = [1.49 + 0.01 * s - 1.50 for s in (0, 1, 2)]
    low, high = stats.t.interval(0.95, 2, loc=sum(diffs) / 3, scale=stats.sem(diffs))
    assert script.paired(table, "trainer_attent", "trainer_full", "heldout_loss") == \
        f"{sum(diffs) / 3:+.4g} [{low:+.4g}, {high:+.4g}]"
    assert script.paired(table[:4], "trainer_attent", "trainer_full", "method_s") == "-20 (1 seed: no interval)"
    args = script.parse_args([])
    text = script.summary(args, table, 60.0)
    assert "| AtteNTTrainer (llm preset) − Trainer, full data |" in text
    assert "| AtteNTTrainer (llm preset) − engine, AtteNT (llm preset) |" in text
    assert "differ by at most 0." in text
    # equal differences on every seed: a zero-width interval, not NaN
    assert script.paired(table, "trainer_attent", "engine_attent", "method_s") == "+20 [+20, +20]"
