"""benchmarks/overheads/hf_vs_engine.py from its command line, without training (its smoke run trains; see
the script): the four arms are one job on one task section, the savings pair each arm with its own
framework's full run, and the verdicts of the paired comparisons come from Holm-adjusted intervals."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

from scipy import stats

from tests.helpers.paths import REPO

SCRIPT = REPO / "benchmarks" / "overheads" / "hf_vs_engine.py"
ARMS = ("trainer_full", "trainer_attent", "engine_attent", "engine_full")


def script(*args: str) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_arms_are_one_job(tmp_path):
    cfgs = json.loads(
        script(
            "--problems",
            "16",
            "--heldout",
            "8",
            "--epochs",
            "2",
            "--seeds",
            "4",
            "--dry-run",
            "--workdir",
            str(tmp_path),
        )
    )
    assert list(cfgs) == list(ARMS)
    first = cfgs["trainer_full"]
    assert len({cfg["name"] for cfg in cfgs.values()}) == 4  # never one run resumed as another
    for cfg in cfgs.values():
        assert cfg["task"] == first["task"] and cfg["train"] == first["train"] and cfg["seed"] == 4
    task, train = first["task"], first["train"]
    assert (task["train_limit"], task["eval"]["response_loss_limit"], task["split_seed"]) == (
        16,
        8,
        None,
    )  # the seed draws both
    assert task["eval"]["suites"] == ["gsm8k_loss"] and train["eval_every"] == train["epochs"] == 2
    assert (train["batch_size"], train["global_batch_size"], train["lr"], task["lora_r"], task["max_length"]) == (
        4,
        8,
        5e-4,
        4,
        128,
    )
    engine = cfgs["engine_attent"]
    assert engine["selection"]["preset"] == "llm" and engine["selection"]["method"] == "attent"
    assert cfgs["engine_full"]["selection"]["method"] == "full"
    assert engine["ray"]["num_workers"] == 1 and engine["mlflow"]["tracking_uri"].endswith(f"{tmp_path}/mlflow.db")


def rows(method: dict, samples: dict, loss: dict, seeds=(0, 1, 2)) -> list[dict]:
    return [
        {
            "seed": s,
            "arm": arm,
            "method_s": method[arm] + s,
            "samples_backpropagated": samples[arm],
            "optimizer_steps": 1,
            "heldout_loss": loss[arm] + 0.01 * s * (arm == "trainer_attent"),
            "engine_own_heldout_loss": loss[arm] if arm.startswith("engine") else math.nan,
        }
        for s in seeds
        for arm in ARMS
    ]


def summarized(tmp_path, table: list[dict], margin: float) -> dict[str, list[str]]:
    """summary.md of ``table`` (written as runs.csv): each table row's cells, by its first cell."""
    with open(tmp_path / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    script("--summarize", "--out", str(tmp_path), "--margin", str(margin))
    text = (tmp_path / "summary.md").read_text()
    return {
        cells[0]: cells[1:]
        for line in text.splitlines()
        if line.startswith("| ")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }


COST = {"trainer_full": 100, "trainer_attent": 80, "engine_attent": 60, "engine_full": 120}
SAMPLES = {"trainer_full": 384, "trainer_attent": 307, "engine_attent": 307, "engine_full": 384}


def test_savings_pair_each_arm_with_its_frameworks_full_run(tmp_path):
    table = summarized(tmp_path, rows(COST, SAMPLES, dict.fromkeys(ARMS, 1.0), seeds=(0,)), margin=0.02)
    # per arm: method cost, samples, steps, realized saving, ideal saving, held-out loss
    assert table["AtteNTTrainer (llm preset)"][3] == f"{1 - 80 / 100:.4g}"
    assert table["engine, AtteNT (llm preset)"][3] == f"{1 - 60 / 120:.4g}"
    assert table["engine, AtteNT (llm preset)"][4] == f"{1 - 307 / 384:.4g}"
    assert table["Trainer, full data"][3] == table["engine, full data"][4] == "0"
    assert table["AtteNTTrainer (llm preset) − Trainer, full data"][1] == "-20 (1 seed: no interval)"


def test_paired_verdicts_come_from_holm_adjusted_intervals(tmp_path):
    table = rows(
        COST, SAMPLES, {"trainer_full": 1.50, "trainer_attent": 1.49, "engine_attent": 1.52, "engine_full": 1.51}
    )
    cells = summarized(tmp_path, table, margin=0.02)
    loss = [
        cells[pair][0]
        for pair in (
            "AtteNTTrainer (llm preset) − Trainer, full data",
            "AtteNTTrainer (llm preset) − engine, AtteNT (llm preset)",
            "engine, AtteNT (llm preset) − engine, full data",
        )
    ]
    # held-out loss, per seed: AtteNTTrainer − Trainer -0.01, 0, +0.01 (p = 1); AtteNTTrainer − engine
    # -0.03, -0.02, -0.01 (p = 0.07, not rejected); engine AtteNT − engine full +0.01 on every seed
    assert [cell.rsplit("**", 2)[1] for cell in loss] == ["inconclusive", "inconclusive", "higher"]
    diffs = [1.49 + 0.01 * s - 1.50 for s in (0, 1, 2)]
    # Holm rejects one comparison of 3 and stops at its second step: the comparisons it does not
    # reject get that step's interval, 1 - 0.05 / 2 (not their own steps', which could exclude 0)
    low, high = stats.t.interval(0.975, 2, loc=sum(diffs) / 3, scale=stats.sem(diffs))
    assert loss[0] == f"{sum(diffs) / 3:+.4g} [{low:+.4g}, {high:+.4g}] at 97.5%: **inconclusive**"
    assert loss[1].endswith("at 97.5%: **inconclusive**") and "at 98.3%" in loss[2]
    # cost: constant differences on every seed (zero-width intervals) are lower / higher
    cost = [cells[pair][1] for pair in cells if " − " in pair]
    assert [c.rsplit("**", 2)[1] for c in cost] == ["lower", "higher", "lower"]
    assert cost[1].startswith("+20 [+20, +20]")
    text = (tmp_path / "summary.md").read_text()
    assert "equivalent within ± 0.02" in text and "differ by at most 0." in text
    # a margin wide enough: the spread-out differences become equivalent, by TOST
    wide = summarized(tmp_path, table, margin=1.0)
    assert wide["AtteNTTrainer (llm preset) − Trainer, full data"][0].endswith("**equivalent within ± 1**")
