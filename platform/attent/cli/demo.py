"""`attent demo`: the embedded default. On a local Ray and a local MLflow SQLite store, the small
time-to-accuracy benchmark's Fashion-MNIST workload — full data, AtteNT's ViT variant, random
subsets and InfoBatch, one run at a time — then its report and verdict."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..benchmark import run_benchmark

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks" / "specs"
DEMO_BENCHMARK = BENCHMARKS / "time_to_accuracy_demo.yaml"


def demo_overrides() -> list[str]:
    """Fashion-MNIST when Debian's package (or $ATTENT_FASHION_MNIST) is there, else digits."""
    from ..tasks.vision.files import find_fashion_mnist

    try:
        find_fashion_mnist(None)
        return []
    except FileNotFoundError:
        print("Fashion-MNIST not found (apt-get install dataset-fashion-mnist); using sklearn digits instead.")
        return ["task.dataset=digits", "task.train_limit=null", "task.test_limit=null", "train.epochs=15"]


def run_demo(workdir: Path, console=None) -> int:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # mlflow.db, ray_results/ and reports/ land here
    name = f"attent-demo-{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.perf_counter()
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    out = run_benchmark(
        DEMO_BENCHMARK,
        demo_overrides() + [f"mlflow.tracking_uri={uri}"],
        out_dir=workdir / "reports",
        name=name,
        console=console,
    )
    print(f"\nDemo wall-clock: {time.perf_counter() - start:.0f}s (Ray start-up and scheduling included)")
    print(f"Report: {out / 'time_to_accuracy.md'}, figures in {out / 'figures'}.")
    print(dashboard_hint(uri, name))
    return 0


def dashboard_hint(tracking_uri: str, experiment: str) -> str:
    """How to see the demo's runs: the `attent ui` command over its store, and the link that opens
    the experiment's training runs with the training view (MLflow's home page would open on its
    GenAI pages)."""
    from ..engine.dashboard import UI_DEFAULT_URL, experiment_link

    command = f"{Path(sys.executable).parent / 'attent'} ui --tracking-uri {tracking_uri}"
    link = experiment_link(tracking_uri, experiment, UI_DEFAULT_URL)
    if link is None:  # the benchmark logged nothing: nothing to open
        return f"Nothing was logged to MLflow ({tracking_uri}, experiment '{experiment}')."
    return (
        f"Everything is in MLflow ({tracking_uri}, experiment '{experiment}'). To see its training runs, start\n"
        f"  {command}\n"
        f"and open (attent ui prints it too):\n"
        f"  {link}"
    )
