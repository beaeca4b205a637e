"""benchmarks/results/README.md: the index of the studies under benchmarks/results/, one line each
(what it measured and what made it, its files, the documentation pages that report it), written from
the folder as it stands and the documentation's links to it.

    python benchmarks/results_index.py            # rewrite the index
    python benchmarks/results_index.py --check    # exit 1 if the index is not up to date
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCS = REPO / "docs"
INDEX = RESULTS / "README.md"

# study -> what it measured, and the command (spec, script) that made it
STUDIES = {
    "antk": "empirical ANTK tracking on real runs (`attent train ... antk.enabled=true`)",
    "beyond_paper": "the selection library's options beyond the paper (`attent bench benchmarks/beyond_the_paper.yaml`)",
    "cycles_verdict": "AtteNT under the released code's schedule (subset bursts inside full-data training) at the "
                      "authors' operating point, Fashion-MNIST 6,000 images "
                      "(`attent bench benchmarks/cycles_verdict_6000.yaml --local`)",
    "data_size": "the verdict against training-set size, Fashion-MNIST 600 to 20,000 images "
                 "(`attent bench benchmarks/data_size*.yaml`, joined by `attent report --with`)",
    "engine_overhead": "the engine's per-epoch cost over a bare torch loop, a Ray run's fixed cost "
                       "(`benchmarks/engine_overhead.py`)",
    "faults": "eight faults provoked through the CLI (`benchmarks/faults_report.py`)",
    "fixed_cost": "a training run's fixed cost, phase by phase; local mode beside one Ray worker "
                  "(`benchmarks/fixed_cost.py`)",
    "gpu_tier": "notes per lent GPU node: the GPU tests and the LLM benchmarks run there (`tests/test_gpu.py`, "
                "`attent bench --local`)",
    "hf_overhead": "AtteNTTrainer's cost over Hugging Face's Trainer on one GPU (`benchmarks/hf_overhead.py`)",
    "hf_vs_engine": "one LoRA job through Trainer, AtteNTTrainer and the engine (`benchmarks/hf_vs_engine.py`)",
    "llm_memory": "peak memory of one LLM step, full-vocabulary logits against the chunked loss "
                  "(`benchmarks/llm_memory.py`)",
    "llm_paper": "the paper's LLM variant at 1,024 GSM8K problems on an H100 (`benchmarks/llm_paper_gpu.yaml`)",
    "llm_size": "LoRA on 128 GSM8K problems: the CPU benchmark, then H100 runs at batch 8 and 32 "
                "(`benchmarks/llm_size.yaml`, `llm_size_b32.yaml`; profiles by `benchmarks/llm_gpu_profile.py`)",
    "mae_400_verdict": "the Multi-Modal MAE verdict at 400 scenes (`attent bench benchmarks/mae_400_verdict.yaml`)",
    "mae_plateau": "where full data plateaus on the Multi-Modal MAE (`attent bench benchmarks/mae_plateau.yaml`)",
    "mae_saving": "the realized saving of the Multi-Modal MAE's scoring passes (`attent bench benchmarks/mae_saving.yaml`)",
    "paper_tables": "the paper's tables on digits (`attent sweep experiments/sweeps/*_digits.yaml`, `attent report`)",
    "reference_drift": "the reference runs' drift across CPU kernels, behind the tests' off-machine tolerance "
                       "(`tests/reference_drift.py`)",
    "scoring_speed": "a scoring pass's speed by batch size and precision (`benchmarks/scoring_speed.py`)",
    "selection_scaling": "the selection functions' wall-clock up to 1e8 scores (`benchmarks/selection_bench.py`)",
    "selection_scaling_quiet": "the same on a quiet machine (`benchmarks/selection_bench.py`)",
    "suite_cpu": "where the test suite's CPU goes, test by test (`tests/suite_cpu.py`, a pytest plugin)",
    "theory": "the theory lab: Algorithm 1 on one attention layer (`attent theory experiments/theory_*.yaml`)",
    "tracking_load": "concurrent writers against MLflow backends (`benchmarks/tracking_load.py`)",
    "tta_small": "the small time-to-accuracy benchmark, earlier protocol "
                 "(`attent bench benchmarks/time_to_accuracy_small.yaml`)",
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
    return [str(page.relative_to(DOCS)) for page in sorted(DOCS.rglob("*.md"))
            if page != DOCS / "findings" / "index.md" and pattern.search(page.read_text(encoding="utf-8"))]


def index() -> str:
    lines = ["# Results", "",
             "One line per study: what it measured and what made it, its files here, the documentation pages "
             "that report it (the [findings](../../docs/findings/index.md) gather them). Written by `python benchmarks/results_index.py` from this folder and the documentation's "
             "links; a study's own README (where it has one) or report says on which machine and commit it ran.",
             "", "| study | what, made by | files | reported in |", "|---|---|---|---|"]
    for study, entries in studies().items():
        files = ", ".join(f"[{entry}]({entry})" for entry in entries)
        reported = ", ".join(f"[{page[:-3]}](../../docs/{page})" for page in pages(study)) or "—"
        what = STUDIES.get(study, "(not described: add it to benchmarks/results_index.py)")
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
            print(f"{INDEX.relative_to(REPO)} is not up to date: python benchmarks/results_index.py", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(text, encoding="utf-8")
    print(f"wrote {INDEX.relative_to(REPO)} ({len(text.splitlines()) - 6} studies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
