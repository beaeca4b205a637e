"""`attent demo`: the embedded default. On a local Ray and a local MLflow SQLite store, a small
sweep on real data — the full-data baseline, AtteNT's ViT preset (soft) and the same schedule
with hard and random selection — then the comparison table and the sweep's report."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .sweep import run_sweep

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
DEMO_SWEEP = EXPERIMENTS / "sweeps" / "demo_fashion_mnist.yaml"


def demo_overrides() -> list[str]:
    """Fashion-MNIST when Debian's package (or $ATTENT_FASHION_MNIST) is there, else digits."""
    from .data.vision import find_fashion_mnist
    try:
        find_fashion_mnist(None)
        return []
    except FileNotFoundError:
        print("Fashion-MNIST not found (apt-get install dataset-fashion-mnist); using sklearn digits instead.")
        return ["task.dataset=digits", "task.train_limit=null", "task.test_limit=null", "train.epochs=10"]


def run_demo(workdir: Path) -> int:
    from analysis.report import build_report

    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # mlflow.db, ray_results/ and reports/ land here
    name = f"attent-demo-{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.perf_counter()
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    run_sweep(DEMO_SWEEP, name=name, overrides=demo_overrides() + [f"mlflow.experiment={name}",
                                                                   f"mlflow.tracking_uri={uri}"])
    print("\n" + comparison_table(uri, name))
    print(f"\nDemo wall-clock: {time.perf_counter() - start:.0f}s (Ray start-up and scheduling included)\n")
    build_report(name, tracking_uri=uri, out_dir=workdir / "reports")
    print(f"\nEverything is in MLflow (sqlite:///{workdir / 'mlflow.db'}, experiment '{name}'). "
          f"Open the dashboard with\n  {Path(sys.executable).parent / 'attent'} ui\n"
          f"from {workdir}, then browse http://127.0.0.1:5000")
    return 0


def comparison_table(tracking_uri: str, experiment: str) -> str:
    """Accuracy, time, samples and saving of each trial against the full-data trial, from MLflow."""
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    runs = client.search_runs([experiment_id], "tags.`attent.role` = 'trial' and attributes.status = 'FINISHED'")
    rows = sorted(((r.data.tags["attent.label"], r.data.metrics) for r in runs), key=lambda r: r[0] != "Full data")
    baseline = dict(rows).get("Full data")
    if baseline is None:
        return "(the full-data trial did not finish: no comparison)"
    lines = ["| run | test accuracy | training time (s) | vs full | samples back-propagated | saving |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, m in rows:
        lines.append(f"| {label} | {m.get('eval_test_accuracy', float('nan')):.4f} | {m['time_total_s']:.1f} | "
                     f"{m['time_total_s'] / baseline['time_total_s'] - 1:+.1%} | {int(m['samples_backpropagated']):,} | "
                     f"{m['sample_saving']:.1%} |")
    return "\n".join(lines)
