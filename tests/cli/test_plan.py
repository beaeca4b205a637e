"""`attent plan`: every run of an experiment or sweep priced from its plan and its counted FLOPs,
on the paper-scale files with no GPU, no network and no data; on the CPU with --measure."""

from __future__ import annotations

import json

import pytest
from attent.cli.main import main
from attent.cost.accelerators import ACCELERATORS
from attent.experiment.files import load_experiment
from attent.tasks.registry import build_task

from tests.helpers.llm_tiny import checkpoint, train_file  # noqa: F401  (fixtures)
from tests.helpers.paths import REPO


def plan(capsys, tmp_path, *args) -> tuple[dict, str]:
    out = tmp_path / "plan.json"
    assert main(["plan", *map(str, args), "--json", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_a_local_run_is_priced_from_its_data_its_plan_and_its_flops(capsys, tmp_path):
    estimate, out = plan(capsys, tmp_path, REPO / "experiments/digits_vit.yaml", "--gpu", "h100", "--mfu", "0.5",
                         "--price-per-gpu-hour", "3")  # fmt: skip
    (run,) = estimate["runs"]
    cfg = load_experiment(REPO / "experiments/digits_vit.yaml")
    samples = len(build_task(cfg.task, seed=cfg.seed).train_dataset())
    assert run["work"]["samples"] == samples and run["work"]["trained"] == sum(cfg.plan.subset_sizes(samples))
    flops = run["work"]["trained"] * run["flops"]["train"] + run["work"]["scored"] * run["flops"]["score"]
    peak = ACCELERATORS["h100"].peak(cfg.train.precision)
    assert run["method_gpu_hours"] == pytest.approx(flops / (0.5 * peak) / 3600)
    hours = run["method_gpu_hours"] + run["eval_gpu_hours"]
    assert run["cost"] == pytest.approx(3 * hours) and estimate["totals"]["cost"] == pytest.approx(3 * hours)
    assert "digits-vit" in out and "NVIDIA H100 SXM" in out


def test_the_paper_scale_files_are_priced_without_a_gpu_a_network_or_their_data(capsys, tmp_path):
    mae, out = plan(capsys, tmp_path, REPO / "experiments/multimae_gpu.yaml")
    runs = {r["run"]: r for r in mae["runs"]}
    assert list(runs) == [f"multimae-vitb16-attent{job}" for job in ("", "-classification", "-semseg", "-depth")]
    pretraining = runs["multimae-vitb16-attent"]
    assert pretraining["work"]["samples"] == 64431 and pretraining["work"]["trained"] < pretraining["work"]["full"]
    assert all(r["method_gpu_hours"] > 0 for r in mae["runs"])
    assert "semseg classes" not in out  # the file gives them (MultiMAE's 133, NYUv2's 40): nothing assumed

    table1, out = plan(capsys, tmp_path, REPO / "experiments/sweeps/table1_llm_gpu.yaml")
    assert table1["totals"]["runs"] == 54 and table1["totals"]["method_gpu_hours"] > 0
    assert {r["work"]["samples"] for r in table1["runs"]} == {100_000}  # the subsets of equal volume
    labels = {r["label"] for r in table1["runs"]}  # what the sweep file sets for each trial
    assert "model=Llama-2-7b-hf dataset=metamathqa method=full" in labels and len(labels) == 18
    assert "model=Llama-2-7b-hf dataset=metamathqa" in out
    controls, _ = plan(capsys, tmp_path, REPO / "experiments/sweeps/table1_llm_controls_gpu.yaml")
    assert controls["totals"]["runs"] == 27  # priced apart
    full = [r["method_gpu_hours"] for r in table1["runs"] if r["label"].endswith("method=full")]
    assert min(r["method_gpu_hours"] for r in controls["runs"]) > max(full)  # twice the epochs of the same runs


def test_measure_on_the_cpu_prices_the_run_by_its_measured_steps(capsys, tmp_path, checkpoint, train_file):  # noqa: F811
    estimate, out = plan(
        capsys, tmp_path, REPO / "experiments/gsm8k_smollm2.yaml", f"task.model={checkpoint}",
        f"task.dataset={train_file}", "task.lora_r=4", "train.batch_size=2", "train.epochs=2", "--measure",
    )  # fmt: skip
    (run,), (measured,) = estimate["runs"], estimate["measurements"]
    assert estimate["accelerator"] == "this machine's cpu" and run["utilisation"] is None
    # the task's own loader, on the CPU in the training process: loading and the step take turns
    loader = measured["loader_samples_per_s"]
    assert loader > 0 and measured["loader_workers"] == 0 and measured["threads"] == 1  # ray.cpus_per_worker
    seconds = run["work"]["trained"] * (1 / measured["train_samples_per_s"] + 1 / loader) + run["work"]["scored"] * (
        1 / measured["score_samples_per_s"] + 1 / loader
    )
    assert run["method_gpu_hours"] == pytest.approx(seconds / 3600)
    assert run["work"]["samples"] == 4  # the tiny training file's examples
    # tokens a sample: the file's examples tokenized, padded to the longest of a batch of 2
    assert "measured: 4 of its 4 examples tokenized" in out and 0 < run["tokens"] < 256
    assert "measured on cpu (1 thread(s)), batch 2" in out


def test_a_run_whose_training_set_is_neither_here_nor_sized_is_refused_in_one_line(capsys, tmp_path):
    code = main(["plan", str(REPO / "experiments/imagefolder_vit_gpu.yaml"), "task.expected_train_samples=null"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 2  # the progress line, then the refusal
    assert "task.expected_train_samples" in err[-1] and err[-1].endswith("or give --samples")
