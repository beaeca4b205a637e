"""The known sweep tests/analysis/test_report.py reads, in a real MLflow SQLite store, and runs logged as the engine logs them
(identity tag, flattened config as params), with which the report's other test modules build their experiments."""

from __future__ import annotations

from pathlib import Path

from attent import contract
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

EXPERIMENT = "vit-ablation"
SCHEDULE_TAGS = {contract.TAG_RATIO_SCHEDULE: "cosine(0.2→0.8)", contract.TAG_INTERVAL_SCHEDULE: "incremental(1→4)"}
# config -> (tags, per-seed final method cost (time_method_s), eval_accuracy, eval_loss,
# eval_accuracy history for epochs 0..2; the final epoch 3 logs the final value)
CONFIGS = {
    "full": (
        {
            contract.TAG_METHOD: "full",
            contract.TAG_STRATEGY: "none",
            contract.TAG_LABEL: "Full data",
            contract.TAG_RATIO_SCHEDULE: "none",
            contract.TAG_INTERVAL_SCHEDULE: "fixed(1)",
        },
        [100.0, 110.0, 120.0],
        [0.80, 0.82, 0.84],
        [0.50, 0.52, 0.54],
        [0.60, 0.70, 0.75],
    ),
    "hard": (
        {
            contract.TAG_METHOD: "attent",
            contract.TAG_STRATEGY: "hard",
            contract.TAG_LABEL: "Hard · cosine · incremental",
            **SCHEDULE_TAGS,
        },
        [60.0, 66.0, 72.0],
        [0.79, 0.80, 0.81],
        [0.60, 0.61, 0.62],
        [0.70, 0.75, 0.78],
    ),
    "soft": (
        {
            contract.TAG_METHOD: "attent",
            contract.TAG_STRATEGY: "soft",
            contract.TAG_LABEL: "Soft · cosine · incremental",
            **SCHEDULE_TAGS,
        },
        [70.0, 77.0, 84.0],
        [0.83, 0.84, 0.85],
        [0.45, 0.46, 0.47],
        [0.70, 0.81, 0.825],
    ),
}
EPOCHS = 4
# 1000 samples x 4 epochs on full data; Hard back-propagates half of that, Soft 55 %.
BACKPROPAGATED = {"full": 4000, "hard": 2000, "soft": 2200}
SELECTED_RATIOS = {"full": 1.0, "hard": 0.5, "soft": 0.55}
# Soft's runs come from an engine that predates time_method_s: its cost is the sum of the parts.
LOGS_METHOD_COST = {"full": True, "hard": True, "soft": False}


def time_metrics(config: str, cost: float, eval_seconds: float, step: int) -> list[Metric]:
    """Cumulative time split at ``step`` for a cumulative method cost ``cost``: training 3/4,
    scoring 3/16, selection 1/16 (exact in binary), evaluation apart, total = all of it."""
    parts = {"train": cost * 0.75, "scoring": cost * 0.1875, "selection": cost * 0.0625, "eval": eval_seconds}
    metrics = [Metric(contract.time_metric(part), value, 0, step) for part, value in parts.items()]
    metrics.append(Metric(contract.TIME_TOTAL, cost + eval_seconds, 0, step))
    if LOGS_METHOD_COST[config]:
        metrics.append(Metric(contract.TIME_METHOD, cost, 0, step))
    return metrics


def log_training_run(
    client: MlflowClient, experiment_id: str, config: str, seed: int, parent_id: str | None, status: str = "FINISHED"
) -> str:
    tags, costs, accuracies, losses, accuracy_history = CONFIGS[config]
    role = (
        {contract.TAG_ROLE: "trial", contract.TAG_PARENT_RUN_ID: parent_id} if parent_id else {contract.TAG_ROLE: "run"}
    )
    run_tags = {**tags, **role, contract.TAG_TASK: "vision"}  # no identity tag: older runs
    run_id = client.create_run(experiment_id, tags=run_tags).info.run_id
    cost, accuracy = costs[seed], accuracies[seed]
    metrics = [
        Metric("eval_loss", losses[seed], 0, EPOCHS - 1),
        Metric(contract.SAMPLE_SAVING, 1 - BACKPROPAGATED[config] / 4000, 0, EPOCHS - 1),
        Metric(contract.SAMPLES_BACKPROPAGATED, BACKPROPAGATED[config], 0, EPOCHS - 1),
        Metric(contract.MEAN_SELECTED_RATIO, SELECTED_RATIOS[config], 0, EPOCHS - 1),
    ]
    for epoch, epoch_accuracy in enumerate([*accuracy_history, accuracy]):
        progress = (epoch + 1) / EPOCHS  # evaluation: 4, 5, 6 s per epoch for seeds 0, 1, 2
        metrics += [
            Metric("eval_accuracy", epoch_accuracy, 0, epoch),
            *time_metrics(config, cost * progress, (4.0 + seed) * (epoch + 1), epoch),
            Metric(contract.TRAIN_LOSS, 2.0 / (epoch + 1) + seed * 0.01, 0, epoch),
        ]
    params = [
        Param(contract.PARAM_SEED, str(seed)),
        Param("selection.method", tags[contract.TAG_METHOD]),
        Param(contract.PARAM_RATIO_KIND, "none" if config == "full" else "cosine"),
    ]
    client.log_batch(run_id, metrics=metrics, params=params)
    client.set_terminated(run_id, status)
    return run_id


def known_sweep(tmp_path_factory) -> tuple[str, str, Path]:
    """(tracking URI, sweep parent run id, report folder) of the known sweep."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(EXPERIMENT, artifact_location=str(root / "artifacts"))
    parent_id = client.create_run(experiment_id, tags={"attent.role": "sweep", "attent.sweep": "ablation"}).info.run_id
    for seed in range(3):
        log_training_run(client, experiment_id, "full", seed, parent_id=None)
        log_training_run(client, experiment_id, "hard", seed, parent_id)
        log_training_run(client, experiment_id, "soft", seed, parent_id)
    log_training_run(client, experiment_id, "soft", 0, parent_id, status="RUNNING")
    log_training_run(client, experiment_id, "hard", 1, parent_id, status="KILLED")  # its driver died
    client.set_terminated(parent_id, "FINISHED")
    return uri, parent_id, root / "reports"


# --- runs as the engine logs them: identity tag, flattened config as params ----------------
def log_run(
    client: MlflowClient,
    experiment_id: str,
    params: dict[str, object],
    metrics: dict[str, float],
    tags: dict[str, str] | None = None,
) -> str:
    """A finished run with ``params`` as its flattened config, the identity tag the engine
    derives from them, and ``metrics`` as final values."""
    flat = {"name": f"run-{len(params)}", "mlflow.experiment": "x", **params}
    run_tags = {
        contract.TAG_ROLE: "run",
        contract.TAG_TASK: "vision",
        contract.TAG_METHOD: str(flat["selection.method"]),
        contract.TAG_IDENTITY: contract.identity_hash(flat),
        **(tags or {}),
    }
    run_id = client.create_run(experiment_id, tags=run_tags).info.run_id
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, 0, EPOCHS) for k, v in metrics.items()],
        params=[Param(k, str(v)) for k, v in flat.items()],
    )
    client.set_terminated(run_id, "FINISHED")
    return run_id


def new_experiment(store, name: str) -> tuple[MlflowClient, str]:
    client = MlflowClient(store[0])
    return client, client.create_experiment(name)


def cost_metrics(cost: float, backpropagated: float, accuracy: float) -> dict[str, float]:
    return {
        contract.TIME_METHOD: cost,
        contract.time_metric("eval"): 3.0,
        contract.TIME_TOTAL: cost + 3.0,
        contract.SAMPLES_BACKPROPAGATED: backpropagated,
        "eval_accuracy": accuracy,
    }
