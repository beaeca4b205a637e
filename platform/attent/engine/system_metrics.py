"""MLflow's system metrics monitor (CPU, memory, disk, network; GPUs when nvidia-ml-py is
installed): each node's local rank 0 (``engine.worker``) samples its node into the run, beside
the metrics ``tracking.RunLogger`` writes."""

from __future__ import annotations

from .. import contract

# Short runs take tens of seconds: sample every 2 s (MLflow's default, 10 s, would give a few
# points). $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it, as MLflow documents.
SYSTEM_METRICS_INTERVAL_S = 2.0


def start_system_metrics(tracking_uri: str, run_id: str, node_rank: int):
    """MLflow's system metrics monitor (CPU, memory, disk, network; GPUs when nvidia-ml-py is
    installed) sampling this node into the run as ``system/node_<rank>/...``, in a thread, until
    ``finish()`` or the run ends. A resumed run continues its steps. None when
    $MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING is set false."""
    import logging

    from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    if MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.is_set() and not MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get():
        return None
    # its start/stop and "no GPU" lines are INFO, once per run and node: the epochs say more
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    monitor = SystemMetricsMonitor(
        run_id,
        sampling_interval=SYSTEM_METRICS_INTERVAL_S,
        samples_before_logging=1,
        resume_logging=True,
        node_id=contract.system_node_id(node_rank),
        tracking_uri=tracking_uri,
    )
    monitor.start()
    return monitor


def stop_system_metrics(monitor) -> None:
    """Stop the monitor and log one last sample: MLflow's ``finish()`` drops the sample it was
    collecting, so a run shorter than the interval would have none."""
    try:
        monitor.finish()
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()
    except Exception as error:  # best effort, as MLflow's monitor itself: never fails a run
        print(f"[attent] system metrics: the last sample was not logged ({error})", flush=True)
