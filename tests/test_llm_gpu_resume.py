"""`benchmarks/llm_gpu.py run --resume`: a GPU session that ran out of device time goes on in the
next one. The recorded H100 runs (`benchmarks/results/llm_size/h100/runs.json`) stand in for the
training, so the control flow is checked without a GPU: the earlier choice stands (no selection
run again), finished runs are kept, only the missing ones train, and full data at equal cost is
the equal-samples run again only when both configurations are the same computation."""
from __future__ import annotations

import copy
import json
import platform as host

import pytest

from conftest import REPO, benchmark_script

RECORDED = REPO / "benchmarks" / "results" / "llm_size" / "h100" / "runs.json"
FIRST_SESSION = 7  # the selection stage's 3 runs and seed 0's first 4 verdict runs


@pytest.fixture
def llm_gpu():
    return benchmark_script("llm_gpu")


def run_resumed(llm_gpu, tmp_path, monkeypatch, recorded: dict, cost: dict[tuple[str, int], float]):
    """Resume from the first session's file on this CPU; each training returns the recorded
    result of its method and seed (method cost from ``cost`` where given). Returns the trained
    (method, seed, epochs) and the file written."""
    earlier = copy.deepcopy(recorded)
    earlier["runs"] = earlier["runs"][:FIRST_SESSION]
    earlier["machine"]["device"] = host.processor() or host.machine()  # resumed on the same device
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    results = {(r["method"], r["seed"]): r for r in recorded["runs"] if r["stage"] == "verdict"}
    trained = []

    def recorded_training(run, device):
        cfg = run.experiment.resolved()
        trained.append((run.method, cfg.seed, cfg.train.epochs))
        result = copy.deepcopy(results[(run.method, cfg.seed)])
        result.pop("same_run_as", None)
        result.update(config=cfg.model_dump(mode="json"), stage=run.stage)
        result["finals"]["time_method_s"] = cost.get((run.method, cfg.seed), result["finals"]["time_method_s"])
        return result

    monkeypatch.setattr(llm_gpu, "train_on_device", recorded_training)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "runs.json"
    llm_gpu.main(["run", str(REPO / "benchmarks" / "llm_size.yaml"), "--workload", "gsm8k-128", "--out", str(out),
                  "--resume", str(tmp_path / "earlier.json"), *recorded["machine"]["overrides"]])
    return trained, json.loads(out.read_text())


def test_a_resumed_gpu_run_trains_only_what_is_missing(llm_gpu, tmp_path, monkeypatch):
    recorded = json.loads(RECORDED.read_text())
    trained, saved = run_resumed(llm_gpu, tmp_path, monkeypatch, recorded, cost={})
    later = [(m, s) for s in (1, 2) for m in ("full", "full_long", "full_equal_samples", "attent", "random")]
    assert [(m, s) for m, s, _ in trained] == [("random", 0), *later]
    assert {epochs for m, _, epochs in trained if m == "full"} == {8}  # the earlier choice, not a new stage
    assert saved["runs"][:FIRST_SESSION] == recorded["runs"][:FIRST_SESSION]
    equal_cost = [r for r in saved["runs"] if r["method"] == "full_equal_cost"]
    assert [r["seed"] for r in equal_cost] == [0, 1, 2]
    for run in equal_cost:  # 8 x AtteNT's cost / full data's rounds to 6 epochs: the equal-samples run
        samples = next(r for r in saved["runs"] if r["method"] == "full_equal_samples" and r["seed"] == run["seed"])
        assert run["same_run_as"] == "full_equal_samples" and run["finals"] == samples["finals"]
        assert run["config"]["train"]["epochs"] == 6 and run["config"]["name"].endswith(f"full_equal_cost-s{run['seed']}")


def test_equal_cost_on_other_epochs_is_trained_not_reused(llm_gpu, tmp_path, monkeypatch):
    recorded = json.loads(RECORDED.read_text())
    # seed 2's AtteNT at half of full data's cost: equal cost is 4 epochs, not the 6 of equal samples
    full_cost = next(r for r in recorded["runs"] if r["method"] == "full" and r["seed"] == 2 and r["stage"] == "verdict")
    trained, saved = run_resumed(llm_gpu, tmp_path, monkeypatch, recorded,
                                 cost={("attent", 2): full_cost["finals"]["time_method_s"] / 2})
    assert ("full_equal_cost", 2, 4) in trained
    seed2 = next(r for r in saved["runs"] if r["method"] == "full_equal_cost" and r["seed"] == 2)
    assert "same_run_as" not in seed2 and seed2["config"]["train"]["epochs"] == 4


# --- a run from the start: two choices in turn, and the seed budget (batch 32 on an H100) ------------------
RECORDED_B32 = REPO / "benchmarks" / "results" / "llm_size" / "h100_b32" / "runs.json"


def run_from_start(llm_gpu, tmp_path, monkeypatch, budget_s: float):
    """``llm_size_b32.yaml`` from the start on this CPU, each training returning the H100's recorded
    result of its method and seed. Returns the trained (method, seed) and the file written."""
    recorded = json.loads(RECORDED_B32.read_text())
    results = {(r["method"], r["seed"]): r for r in recorded["runs"] if not r.get("same_run_as")}
    trained = []

    def recorded_training(run, device):
        cfg = run.experiment.resolved()
        trained.append((run.method, cfg.seed))
        return {**copy.deepcopy(results[(run.method, cfg.seed)]), "config": cfg.model_dump(mode="json")}

    monkeypatch.setattr(llm_gpu, "train_on_device", recorded_training)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "runs.json"
    llm_gpu.main(["run", str(REPO / "benchmarks" / "llm_size_b32.yaml"), "--workload", "gsm8k-128", "--out", str(out),
                  "--budget-s", str(budget_s), *recorded["machine"]["overrides"]])
    return trained, json.loads(out.read_text())


def test_the_second_choice_reuses_the_first_choices_run(llm_gpu, tmp_path, monkeypatch):
    trained, saved = run_from_start(llm_gpu, tmp_path, monkeypatch, budget_s=float("inf"))
    selection = [m for m, _ in trained if "+" in m]
    # the learning rate at 8 epochs, then the epochs at the chosen rate: its 8-epoch run is the rate's run again
    assert selection == ["full+lr=0.0005", "full+lr=0.001", "full+lr=0.002", "full+epochs=4", "full+epochs=16"]
    again = next(r for r in saved["runs"] if r["method"] == "full+epochs=8")
    first = next(r for r in saved["runs"] if r["method"] == "full+lr=0.002")
    assert again["same_run_as"] == "full+lr=0.002" and again["finals"] == first["finals"]
    assert again["candidate"] == ["train.epochs", 8]
    assert [(c["key"], c["value"]) for c in saved["choices"]] == [("train.lr", 0.002), ("train.epochs", 8)]
    assert {s for m, s in trained if "+" not in m} == {0, 1, 2}


def test_a_seed_that_would_end_past_the_budget_is_not_started(llm_gpu, tmp_path, monkeypatch):
    recorded = json.loads(RECORDED_B32.read_text())
    seed0 = sum(r["wall_s"] for r in recorded["runs"]
                if r["stage"] == "verdict" and r["seed"] == 0 and not r.get("same_run_as"))
    # the stand-in trains in no time, so a budget just under seed 0's recorded time stops before seed 1
    trained, saved = run_from_start(llm_gpu, tmp_path, monkeypatch, budget_s=seed0 - 1)
    assert {s for m, s in trained if "+" not in m} == {0}
    assert {r["seed"] for r in saved["runs"] if r["stage"] == "verdict"} == {0}
    trained, _ = run_from_start(llm_gpu, tmp_path, monkeypatch, budget_s=seed0 + 60)
    assert {s for m, s in trained if "+" not in m} == {0, 1, 2}
