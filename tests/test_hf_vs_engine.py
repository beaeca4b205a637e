"""benchmarks/hf_vs_engine.py without training (its smoke run trains; see the script): the four
arms are one job on one task section, the savings pair each arm with its own framework's full run,
and the words of the paired comparisons come from Holm-adjusted intervals."""
from __future__ import annotations

import math

import pytest
from scipy import stats

from conftest import benchmark_script


@pytest.fixture(scope="module")
def script():
    return benchmark_script("hf_vs_engine")


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


def test_paired_words_come_from_holm_adjusted_intervals(script):
    table = rows({"trainer_full": 100, "trainer_attent": 80, "engine_attent": 60, "engine_full": 120},
                 {"trainer_full": 384, "trainer_attent": 307, "engine_attent": 307, "engine_full": 384},
                 {"trainer_full": 1.50, "trainer_attent": 1.49, "engine_attent": 1.52, "engine_full": 1.51})
    script.add_savings(table)
    # held-out loss, per seed: AtteNTTrainer − Trainer -0.01, 0, +0.01 (p = 1); AtteNTTrainer − engine
    # -0.03, -0.02, -0.01 (p = 0.07, not rejected); engine AtteNT − engine full +0.01 on every seed
    loss = script.judged(table, "heldout_loss", margin=0.02)
    assert [p.verdict for p in loss] == ["inconclusive", "inconclusive", "worse"]
    diffs = [1.49 + 0.01 * s - 1.50 for s in (0, 1, 2)]
    # Holm rejects one comparison of 3 and stops at its second step: the comparisons it does not
    # reject get that step's interval, 1 - 0.05 / 2 (not their own steps', which could exclude 0)
    low, high = stats.t.interval(0.975, 2, loc=sum(diffs) / 3, scale=stats.sem(diffs))
    assert (loss[0].level, loss[0].low, loss[0].high) == (pytest.approx(0.975), pytest.approx(low), pytest.approx(high))
    assert loss[1].level == pytest.approx(0.975) and loss[1].low < 0 < loss[1].high
    assert "**higher**" in script.judged_cell(loss[2]) and "at 98.3%" in script.judged_cell(loss[2])
    # a margin wide enough: the spread-out differences become equivalent, by TOST
    assert script.judged(table, "heldout_loss", margin=1.0)[0].verdict == "equivalent within ± 1"
    # cost: constant differences on every seed (zero-width intervals) are lower / higher
    cost = script.judged(table, "method_s", None)
    assert [script.judged_cell(p).rsplit("**", 2)[1] for p in cost] == ["lower", "higher", "lower"]
    assert script.judged_cell(cost[1]).startswith("+20 [+20, +20]")
    assert script.judged_cell(script.judged(table[:4], "method_s", None)[0]) == "-20 (1 seed: no interval)"
    text = script.summary(script.parse_args([]), table, 60.0)
    assert "| AtteNTTrainer (llm preset) − Trainer, full data |" in text
    assert "| AtteNTTrainer (llm preset) − engine, AtteNT (llm preset) |" in text
    assert "equivalent within ± 0.02" in text and "differ by at most 0." in text
