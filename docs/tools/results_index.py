"""benchmarks/results/README.md: the index of the studies under benchmarks/results/, one line each
(what it measured and what made it, its files, the documentation pages that report it), written from
the folder as it stands and the documentation's links to it. A study's folder is named after what
made it: the `attent bench` spec (benchmarks/specs/NAME.yaml) or the script (benchmarks/*/NAME.py).

    python docs/tools/results_index.py            # rewrite the index
    python docs/tools/results_index.py --check    # exit 1 if the index is not up to date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
DOCS = REPO / "docs"
INDEX = RESULTS / "README.md"

# study -> what it measured, and the command (spec, script) that made it
STUDIES = {
    "antk": "empirical ANTK tracking on real runs (`attent train ... antk.enabled=true`; no spec or script)",
    "beyond_the_paper": "the selection library's options beyond the paper "
    "(`attent bench benchmarks/specs/beyond_the_paper.yaml`)",
    "cycles_verdict_6000_free_scores": "the same with free scores (`selection.scores: training`): no scoring pass "
    "(`attent bench benchmarks/specs/cycles_verdict_6000_free_scores.yaml --local`)",
    "cycles_verdict_6000": "AtteNT under the released code's schedule (subset bursts inside full-data training) at "
    "the authors' operating point, Fashion-MNIST 6,000 images "
    "(`attent bench benchmarks/specs/cycles_verdict_6000.yaml --local`)",
    "stream_verdict_2000": "selection from a stream (pools of B / r, each scored) against epoch-level AtteNT, "
    "Random and full data at equal measured cost and InfoBatch, Fashion-MNIST 2,000 images "
    "(`attent bench benchmarks/specs/stream_verdict_2000.yaml --local`)",
    "stream_verdict_llm": "the same on the LLM task: LoRA on SmolLM2-135M-Instruct, 64 GSM8K problems "
    "(`attent bench benchmarks/specs/stream_verdict_llm.yaml --local`)",
    "llm_packing": "packed against padded LLM batches, SmolLM2-135M with LoRA under sdpa on the CPU "
    "(`benchmarks/speed/llm_packing.py`)",
    "data_size": "the verdict against training-set size, Fashion-MNIST 600, 2,000 and 20,000 images "
    "(`attent bench benchmarks/specs/data_size.yaml`); `data_size/` inside: all sizes joined "
    "(`attent report --with`)",
    "data_size_20000_seeds": "seeds 3-5 at 20,000 images (`attent bench benchmarks/specs/data_size_20000_seeds.yaml`)",
    "data_size_6000": "a fourth size, 6,000 images (`attent bench benchmarks/specs/data_size_6000.yaml`)",
    "data_size_600_long": "the 600-image pilot carried to E = 320 "
    "(`attent bench benchmarks/specs/data_size_600_long.yaml`)",
    "data_size_plateau": "more seeds of the plateau control (`attent bench benchmarks/specs/data_size_plateau.yaml`)",
    "data_size_small_seeds": "seeds 3-5 at 600 and 2,000 images "
    "(`attent bench benchmarks/specs/data_size_small_seeds.yaml`)",
    "digits_vit_tuning": "`experiments/digits_vit.yaml`'s settings (patch size, epochs, learning rate, warm-up) "
    "tuned on a held-out validation split at about the same CPU seconds (`benchmarks/tuning/digits_vit_tuning.py`)",
    "engine_overhead": "the engine's per-epoch cost over a bare torch loop, a Ray run's fixed cost "
    "(`benchmarks/overheads/engine_overhead.py`)",
    "faults_report": "eight faults provoked through the CLI (`benchmarks/robustness/faults_report.py`)",
    "fixed_cost": "a training run's fixed cost, phase by phase; local mode beside one Ray worker "
    "(`benchmarks/overheads/fixed_cost.py`)",
    "gpu_check": "one GPU node's check within its budget: the GPU tests, the paper-scale rehearsals and plans, the "
    "input pipeline, AtteNTTrainer's savings (`benchmarks/gpu/gpu_check.py`, `make gpu-check`)",
    "gpu_tier": "notes per lent GPU node: the GPU tests and the LLM specs run there (`tests/engine/test_gpu.py`, "
    "`tests/system/test_gpu.py`, `attent bench --local`; no spec or script of its own)",
    "hf_overhead": "AtteNTTrainer's cost over Hugging Face's Trainer on one GPU "
    "(`benchmarks/overheads/hf_overhead.py`)",
    "hf_vs_engine": "one LoRA job through Trainer, AtteNTTrainer and the engine "
    "(`benchmarks/overheads/hf_vs_engine.py`)",
    "llm_memory": "peak memory of one LLM step, full-vocabulary logits against the chunked loss "
    "(`benchmarks/llm/llm_memory.py`)",
    "llm_paper_gpu": "the paper's LLM variant at 1,024 GSM8K problems on an H100 "
    "(`attent bench benchmarks/specs/llm_paper_gpu.yaml --local`)",
    "llm_size": "LoRA on 128 GSM8K problems: the CPU run, then an H100 at batch 8 "
    "(`attent bench benchmarks/specs/llm_size.yaml`; `h100/profile/`, `h100/timing/`: "
    "`benchmarks/llm/llm_gpu_profile.py` on its runs)",
    "llm_size_b32": "the same at batch 32 on an H100 (`attent bench benchmarks/specs/llm_size_b32.yaml --local`)",
    "mae_400_verdict": "the Multi-Modal MAE verdict at 400 scenes "
    "(`attent bench benchmarks/specs/mae_400_verdict.yaml`)",
    "mae_plateau": "where full data plateaus on the Multi-Modal MAE (`attent bench benchmarks/specs/mae_plateau.yaml`)",
    "mae_saving": "the realized saving of the Multi-Modal MAE's scoring passes "
    "(`attent bench benchmarks/specs/mae_saving.yaml`)",
    "paper_tables": "the paper's tables on digits (`attent sweep experiments/sweeps/*_digits.yaml`, `attent report`; "
    "a folder per sweep; `subset_classes*/`: `benchmarks/run_analysis/subset_classes.py`)",
    "phase_costs": "a training step, a scoring pass, loading and a re-selection per sample, by integration and workload (`benchmarks/speed/phase_costs.py`)",
    "multimae_model": "MultiMAE-B's model against ours before: GFLOPs a sample at the paper's size, pretext losses "
    "of a few epochs on the offline scenes (`benchmarks/cost/multimae_model.py`)",
    "run_plan": "the paper's Tables 1, 2, 3, 7 and 8 and the first milestone priced by `attent plan` on A100 and H100 "
    "(`benchmarks/cost/run_plan.py`)",
    "preset_limits": "each selection plan's realized saving against its limit, side by side with full data "
    "(`benchmarks/speed/preset_limits.py`)",
    "free_score_agreement": "free scores against a fresh scoring pass, Spearman at each re-selection (`benchmarks/speed/free_score_agreement.py`)",
    "scoring_speed": "a scoring pass's speed by batch size and precision (`benchmarks/speed/scoring_speed.py`)",
    "selection_scaling": "the selection functions' wall-clock up to 1e8 scores, on a loaded and on a quiet "
    "machine (`benchmarks/speed/selection_scaling.py`)",
    "theory": "the theory lab: Algorithm 1 on one attention layer (`attent theory experiments/theory_*.yaml`)",
    "time_to_accuracy_small": "the small time-to-accuracy benchmark, earlier protocol "
    "(`attent bench benchmarks/specs/time_to_accuracy_small.yaml`)",
    "tracking_load": "concurrent writers against MLflow backends (`benchmarks/robustness/tracking_load.py`)",
}


def studies() -> dict[str, list[str]]:
    """Study -> its entries in results/: a folder (``name/``), or the files of one stem."""
    found: dict[str, list[str]] = {}
    for path in sorted(RESULTS.iterdir()):
        if path == INDEX or path.name.startswith("."):
            continue
        study = path.name if path.is_dir() else path.name.split(".")[0]
        found.setdefault(study, []).append(path.name + ("/" if path.is_dir() else ""))
    return found


def pages(study: str) -> list[str]:
    """The documentation pages that link the study's results (the findings index aside), relative to docs/."""
    pattern = re.compile(rf"results/{re.escape(study)}(?![\w-])")
    return [
        str(page.relative_to(DOCS))
        for page in sorted(DOCS.rglob("*.md"))
        if page != DOCS / "findings" / "index.md" and pattern.search(page.read_text(encoding="utf-8"))
    ]


def index() -> str:
    lines = [
        "# Results",
        "",
        "One line per study: what it measured and what made it, its files here, the documentation pages "
        "that report it (the [findings](../../docs/findings/index.md) gather them); a study's folder is named "
        "after the spec or script that made it ([the suite](../README.md)). Written by "
        "`python docs/tools/results_index.py` from this folder and the documentation's links; a study's own "
        "README (where it has one) or report says on which machine and commit it ran.",
        "",
        "| study | what, made by | files | reported in |",
        "|---|---|---|---|",
    ]
    for study, entries in studies().items():
        files = ", ".join(f"[{entry}]({entry})" for entry in entries)
        reported = ", ".join(f"[{page[:-3]}](../../docs/{page})" for page in pages(study)) or "—"
        what = STUDIES.get(study, "(not described: add it to docs/tools/results_index.py)")
        lines.append(f"| {study} | {what} | {files} | {reported} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the index is not up to date")
    args = parser.parse_args(argv)
    text = index()
    if args.check:
        current = INDEX.read_text(encoding="utf-8") if INDEX.exists() else ""
        if current != text:
            print(f"{INDEX.relative_to(REPO)} is not up to date: python docs/tools/results_index.py", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(text, encoding="utf-8")
    print(f"wrote {INDEX.relative_to(REPO)} ({len(text.splitlines()) - 6} studies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
