"""`attent demo`: the embedded default. A full-data baseline and AtteNT (ViT preset) on real
data, on a local Ray and a local MLflow SQLite store, then a short comparison table."""
from __future__ import annotations

import os
import time
from pathlib import Path

from .config import load_experiment
from .engine.launch import TrainResult, train

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
DEMO_CONFIG = EXPERIMENTS / "fashion_mnist_vit.yaml"


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
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # mlflow.db and ray_results/ land here
    stamp = time.strftime("%Y%m%d-%H%M%S")
    common = demo_overrides() + ["mlflow.experiment=attent-demo"]
    runs = {
        "Full data": load_experiment(DEMO_CONFIG, common + [f"name=demo-full-{stamp}", "selection.preset=null", "selection.method=full"]),
        "AtteNT (ViT preset)": load_experiment(DEMO_CONFIG, common + [f"name=demo-attent-{stamp}"]),
    }
    results: dict[str, TrainResult] = {}
    for label, cfg in runs.items():
        print(f"\n=== {label}: {cfg.name} ===", flush=True)
        results[label] = train(cfg)
    print("\n" + comparison_table(results))
    uri = runs["Full data"].resolved().mlflow.tracking_uri
    print(f"\nBoth runs are in MLflow ({uri}, experiment 'attent-demo'). Open the dashboard with:\n"
          f"  {Path(os.sys.executable).parent / 'attent'} ui --tracking-uri {uri}\n"
          f"then browse http://127.0.0.1:5000")
    return 0


def comparison_table(results: dict[str, TrainResult]) -> str:
    baseline = results["Full data"].metrics
    header = "| run | test accuracy | training time (s) | wall-clock (s) | samples back-propagated | saving vs full |"
    lines = [header, "|---|---:|---:|---:|---:|---:|"]
    for label, result in results.items():
        m = result.metrics
        time_change = m["time_total_s"] / baseline["time_total_s"] - 1
        lines.append(f"| {label} | {m.get('eval_test_accuracy', float('nan')):.4f} | {m['time_total_s']:.1f} "
                     f"({time_change:+.1%}) | {result.wallclock_s:.1f} | {int(m['samples_backpropagated']):,} | "
                     f"{1 - m['samples_backpropagated'] / baseline['samples_backpropagated']:.1%} |")
    return "\n".join(lines)
