"""The class make-up of the subsets a vision sweep's runs trained on, re-selection by
re-selection: why a strategy's accuracy collapses or holds (Hard on the digits, for one).

For each finished run of the MLflow experiment it reads the run's ``config.yaml`` (to rebuild its
training split, and so each sample's class) and ``selection_history.json`` (the indices of each
re-selection), and writes, beside a summary per trial configuration:

- ``subsets.csv``: one row per run and re-selection: epoch, ratio, the share of each class in
  the subset, the share of the largest class, the number of classes present, and the subset's
  share of the class least represented relative to the data (1 = as in the data);
- ``summary.md``: per configuration (strategy, ratio and interval schedule), over runs and
  re-selections: the mean largest-class share and the smallest class's worst representation,
  next to the run's final test accuracy.

    python benchmarks/run_analysis/subset_classes.py --tracking-uri sqlite:///mlflow.db \\
        --experiment ablation-digits-cycles --out benchmarks/results/paper_tables/ablation-digits-cycles/subset_classes
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import yaml


def runs_of(client, experiment: str):
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no MLflow experiment {experiment!r}")
    return [
        r
        for r in client.search_runs([found.experiment_id], "attributes.status = 'FINISHED'", max_results=5000)
        if r.data.tags.get("attent.role") in ("run", "trial")
    ]  # not a sweep's or benchmark's parent


def train_labels(config: dict):
    """The run's training labels, as its task split them (the same limits, seeds and hold-out)."""
    from attent.experiment.schema import ExperimentConfig
    from attent.tasks.vision.task import load_splits

    cfg = ExperimentConfig.model_validate(config).resolved()
    return load_splits(cfg.task, cfg.seed).train.labels


def run_rows(client, run, scratch: Path, labels_of: dict) -> list[dict]:
    run_id = run.info.run_id
    config = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml", str(scratch))).read_text())
    history = json.loads(Path(client.download_artifacts(run_id, "selection_history.json", str(scratch))).read_text())
    key = json.dumps(config["task"], sort_keys=True) + str(config.get("seed"))
    if key not in labels_of:
        labels_of[key] = train_labels(config)
    labels = labels_of[key]
    classes = sorted(set(labels.tolist()))
    prior = {c: float((labels == c).float().mean()) for c in classes}
    rows = []
    for selection in history["selections"]:
        indices = selection.get("indices")
        if indices is None or len(indices) == len(labels):  # not logged, or all data
            continue
        picked = labels[indices]
        share = {c: float((picked == c).float().mean()) for c in classes}
        rows.append(
            {
                "run_id": run_id,
                "configuration": run.data.tags.get("attent.label", run.info.run_name),
                "strategy": run.data.tags.get("attent.strategy", ""),
                "seed": config.get("seed"),
                "epoch": selection.get("epoch"),
                "ratio": round(len(indices) / len(labels), 4),
                "largest_class_share": max(share.values()),
                "classes_present": sum(v > 0 for v in share.values()),
                "least_represented": min(share[c] / prior[c] for c in classes),
                "test_accuracy": run.data.metrics.get("eval_test_accuracy"),
                **{f"class_{c}": share[c] for c in classes},
            }
        )
    return rows


def summary(rows: list[dict]) -> str:
    by_config: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_config[row["configuration"]].append(row)
    lines = [
        "| configuration | runs | re-selections | largest class share (mean) | classes present (min) | "
        "least represented class, share / its share of the data (min) | final test accuracy (mean) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, group in sorted(
        by_config.items(), key=lambda kv: statistics.mean(r["test_accuracy"] or 0 for r in kv[1])
    ):
        accuracy = {r["run_id"]: r["test_accuracy"] for r in group if r["test_accuracy"] is not None}
        lines.append(
            f"| {name} | {len(accuracy)} | {len(group)} | {statistics.mean(r['largest_class_share'] for r in group):.3f} | "
            f"{min(r['classes_present'] for r in group)} | {min(r['least_represented'] for r in group):.3f} | "
            f"{statistics.mean(accuracy.values()) if accuracy else float('nan'):.4f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--experiment", required=True, action="append", help="repeatable")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from mlflow import MlflowClient

    client, rows, labels_of = MlflowClient(args.tracking_uri), [], {}
    with tempfile.TemporaryDirectory() as scratch:
        for experiment in args.experiment:
            for number, run in enumerate(runs_of(client, experiment)):
                rows += run_rows(client, run, Path(scratch) / str(number) / experiment, labels_of)
    if not rows:
        raise SystemExit("no run with logged subsets (mlflow.log_selected_indices) in those experiments")
    args.out.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(args.out / "subsets.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        writer.writerows(rows)
    text = summary(rows)
    (args.out / "summary.md").write_text(f"# Class make-up of the subsets: {', '.join(args.experiment)}\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
