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
    from .tasks.vision.files import find_fashion_mnist
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
    """Each finished trial against the full-data trial, from MLflow: test accuracy; the method's
    cost (training + scoring + selection seconds; evaluation, checkpointing and start-up apart)
    and its change; evaluation time; samples back-propagated; and the ideal saving (1 - samples
    back-propagated / full data's) beside the realized one (1 - method cost / full data's)."""
    from mlflow import MlflowClient

    from . import contract
    client = MlflowClient(tracking_uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    runs = client.search_runs([experiment_id], f"tags.`{contract.TAG_ROLE}` = '{contract.ROLE_TRIAL}' "
                                               "and attributes.status = 'FINISHED'")
    rows = sorted(((r.data.tags[contract.TAG_LABEL], r.data.tags.get(contract.TAG_METHOD), r.data.metrics)
                   for r in runs), key=lambda r: r[1] != contract.METHOD_FULL)
    if not rows or rows[0][1] != contract.METHOD_FULL:
        return "(the full-data trial did not finish: no comparison)"

    cost = contract.method_cost
    full = rows[0][2]
    lines = ["| run | test accuracy | method cost (s) | Δ cost vs full | eval (s) | samples back-propagated "
             "| ideal saving | realized saving | realized / ideal |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, _, m in rows:
        realized = 1 - cost(m) / cost(full)
        ideal = 1 - m[contract.SAMPLES_BACKPROPAGATED] / full[contract.SAMPLES_BACKPROPAGATED]
        efficiency = f"{realized / ideal:.2f}" if abs(ideal) > 1e-9 else "—"
        lines.append(f"| {label} | {m.get(contract.EVAL_PREFIX + 'test_accuracy', float('nan')):.4f} "
                     f"| {cost(m):.1f} | {cost(m) / cost(full) - 1:+.1%} | {m.get(contract.time_metric('eval'), float('nan')):.1f} "
                     f"| {int(m[contract.SAMPLES_BACKPROPAGATED]):,} | {ideal:.1%} | {realized:.1%} | {efficiency} |")
    return "\n".join(lines)
