"""A fresh run's fixed cost, as far as a test can guard it without timing anything
(benchmarks/results/fixed_cost/fixed_cost.md measures it): the engine's modules import no library that only
some runs need (timm and torchvision for a ViT's set-up, matplotlib for the final figures, the
Hugging Face libraries for the LLM task)."""

from __future__ import annotations

import json
import subprocess
import sys

# what `attent train` imports before the run starts, and what must wait for a path that needs it
ENGINE = [
    "attent.engine.driver",
    "attent.engine.worker",
    "attent.engine.recipe",
    "attent.engine.logged_models",
    "attent.engine.tracking",
    "attent.tasks.registry",
    "attent.tasks.vit",
]
LATER = ["timm", "torchvision", "matplotlib", "transformers", "peft", "mlflow.pytorch", "pytorch_lightning"]


def test_the_engine_imports_no_library_that_only_some_runs_need():
    code = (
        f"import importlib, json, sys\n"
        f"for name in {ENGINE!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {LATER!r} if m in sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
