"""A training run and then its downstream jobs: what `attent train` and every sweep trial run.

Each downstream job is a Ray Train run of its own, an MLflow child of the pretraining run
(tagged with its id and the job's name), loading the pretraining run's ``pretrained`` artifact.
The pretraining run then receives each job's final metrics as ``downstream.<job>.<metric>``,
so a table reads one row per pretraining configuration. Jobs that already finished (a resumed
sweep, a re-run) are not trained again: their metrics are read back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from mlflow.entities import Metric

from .. import contract
from ..config import DownstreamJob, ExperimentConfig, flatten
from .launch import TrainResult, train
from .dashboard import add_to_training_view
from .tracking import client_for, latest_run


@dataclass
class PipelineResult:
    training: TrainResult
    downstream: dict[str, float] = field(default_factory=dict)  # downstream.<job>.<metric> -> value


def run_pipeline(cfg: ExperimentConfig, *, checked: bool = False, **train_options) -> PipelineResult:
    """``train(cfg)``, then ``cfg.downstream`` on its weights."""
    training = train(cfg, checked=checked, **train_options)
    result = PipelineResult(training)
    if cfg.downstream:
        result.downstream = run_downstream(cfg, training.run_id)
    return result


def run_downstream(cfg: ExperimentConfig, pretraining_run_id: str) -> dict[str, float]:
    """Every downstream job of ``cfg`` on the weights of ``pretraining_run_id``; their final
    metrics, also logged on the pretraining run."""
    check_exported(cfg.mlflow.tracking_uri, pretraining_run_id)
    finals: dict[str, float] = {}
    for job in cfg.downstream:
        job_cfg = job_experiment(cfg, job, pretraining_run_id)
        print(f"[attent] downstream job {job.name}: {job_cfg.task.name}, {job_cfg.train.epochs} epochs, "
              f"on run {pretraining_run_id}", flush=True)
        metrics = _run_job(job_cfg, job.name, pretraining_run_id)
        finals.update({contract.downstream_metric(job.name, k[len(contract.EVAL_PREFIX):]): float(v)
                       for k, v in metrics.items() if k.startswith(contract.EVAL_PREFIX)})
    now = int(time.time() * 1000)
    client = client_for(cfg.mlflow.tracking_uri)
    client.log_batch(pretraining_run_id, metrics=[Metric(k, v, now, cfg.train.epochs) for k, v in finals.items()])
    # the dashboard's training view gains the downstream.* columns now, not at the next run
    add_to_training_view(client, client.get_run(pretraining_run_id).info.experiment_id, finals)
    return finals


def job_experiment(cfg: ExperimentConfig, job: DownstreamJob, pretraining_run_id: str) -> ExperimentConfig:
    """The experiment of one downstream job on the weights of ``pretraining_run_id``. Named after
    that run and the job's settings: a re-run reuses (or resumes) only the same job on the same
    weights; a changed job trains anew."""
    pretrained = f"runs:/{pretraining_run_id}/{contract.PRETRAINED_ARTIFACT}"
    job_cfg = cfg.downstream_experiment(job, pretrained=pretrained).resolved()
    settings = contract.identity_hash(flatten(job_cfg))[:6]
    return job_cfg.model_copy(update={"name": f"{job_cfg.name}-{pretraining_run_id[:8]}-{settings}"})


def check_exported(tracking_uri: str, run_id: str) -> None:
    """Refuse, before any worker starts, a run that does not exist or exported no weights."""
    from mlflow.exceptions import MlflowException
    client = client_for(tracking_uri)
    try:
        client.get_run(run_id)
    except MlflowException:
        raise ValueError(f"no MLflow run {run_id!r} in {tracking_uri}: give the pretraining run's id "
                         "(attent train prints it; the MLflow UI shows it)") from None
    if not client.list_artifacts(run_id, contract.PRETRAINED_ARTIFACT):
        raise FileNotFoundError(f"run {run_id} has no {contract.PRETRAINED_ARTIFACT}/ artifact: it did "
                                "not finish, or its task exports no weights for downstream jobs")


def _run_job(job_cfg: ExperimentConfig, job: str, pretraining_run_id: str) -> dict[str, float]:
    """The job's final metrics: read back when it already finished, else trained now."""
    done = latest_run(job_cfg)
    if done is not None and done.info.status == "FINISHED":
        return dict(done.data.metrics)
    result = train(job_cfg, parent_run_id=pretraining_run_id, role=contract.ROLE_DOWNSTREAM, checked=True,
                   extra_tags={contract.TAG_PRETRAINING_RUN: pretraining_run_id,
                               contract.TAG_DOWNSTREAM_JOB: job})
    return result.metrics
