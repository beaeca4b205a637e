"""The MLflow run contract: every tag, param and metric name the engine writes and ``analysis``
reads, in one dependency-free module that both import (standard library only, and the selection's
metric names from ``attent.selection.metric_names``, constants that every integration logs too).

A training run is one MLflow run. Params are the flattened experiment config (``selection.ratio.start``
...); tags say what the run is; metrics are logged per epoch (step = epoch index) and once more
at the end (step = number of epochs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The selection's metric names, defined once for the engine and every integration:
from .selection.metric_names import (  # noqa: F401
    SAMPLES_BACKPROPAGATED,
    SAMPLES_FORWARDED,
    SCORE_AGREEMENT,
    SELECTED_RATIO,
    SELECTION_HARDNESS,
    SELECTION_OVERLAP,
    SUBSET_CHECKSUM,
    TRAIN_LOSS,
    component_loss_metric,
    component_weight_metric,
)

# --- tags -----------------------------------------------------------------------------------
TAG_TASK = "attent.task"  # task name (vision, llm, ...)
TAG_METHOD = "attent.method"  # selection.method: attent | full | class_weight | group_weight | gradnorm | infobatch
TAG_STRATEGY = "attent.strategy"  # attent's strategy: hard | soft | random (Random); none for the other methods
TAG_RATIO_SCHEDULE = "attent.ratio_schedule"  # e.g. incremental(0.2→0.8); none without one
TAG_INTERVAL_SCHEDULE = "attent.interval_schedule"  # e.g. incremental(1→4); none
TAG_LABEL = "attent.label"  # human row label of the selection config
TAG_ROLE = "attent.role"  # run | trial | sweep
TAG_IDENTITY = "attent.identity"  # hash of the config minus seed and plumbing
TAG_RATIO_REACHED = "attent.ratio_reached"  # largest ratio the schedule actually selects
TAG_GIT_COMMIT = "attent.git_commit"
TAG_RUN_KEY = "attent.run_key"  # storage path + name: one run across resumes
TAG_SWEEP = "attent.sweep"  # sweep name (trials and the sweep parent)
TAG_SWEEP_KEY = "attent.sweep_key"  # where the sweep's Tune state lives
TAG_TRIAL = "attent.trial"  # trial id within its sweep
TAG_PARENT_RUN_ID = "mlflow.parentRunId"  # MLflow's own parent/child link
TAG_RUN_NAME = "mlflow.runName"
TAG_PRETRAINING_RUN = "attent.pretraining_run"  # downstream jobs: the pretraining run they fine-tune
TAG_DOWNSTREAM_JOB = "attent.downstream_job"  # downstream jobs: the job's name (classification...)
TAG_SKIPPED_CHECKPOINTS = "attent.skipped_checkpoints"  # unreadable checkpoints a restore passed over, and why
TAG_DRIVER = "attent.driver"  # JSON: the process that owns the run while RUNNING (host, pid, start time)
TAG_CLOSED_AS_KILLED = "attent.closed_as_killed"  # why a later command ended the run KILLED (its driver was gone)

TAG_BENCH_WORKLOAD = "attent.benchmark.workload"  # time-to-accuracy benchmark runs: their workload,
TAG_BENCH_METHOD = "attent.benchmark.method"  # the run's arm in the benchmark (attent, hard, ...)
TAG_BENCH_METRIC = "attent.benchmark.metric"  # and the per-epoch metric its curves read
TAG_BENCH_STAGE = "attent.benchmark.stage"  # selection (choices read validation) | verdict (reads test)
BENCH_STAGE_SELECTION, BENCH_STAGE_VERDICT = "selection", "verdict"
TAG_SAME_RUN_AS = "attent.same_run_as"  # a benchmark run recorded from an earlier run of the same computation: its id
BENCH_CHOICES_FILE = "choices.json"  # on the benchmark's parent run: what the selection stage chose
BENCH_SPEC_FILE = "benchmark.json"  # on the benchmark's parent run: its spec (tolerances, margins)

ROLE_RUN, ROLE_TRIAL, ROLE_SWEEP, ROLE_DOWNSTREAM = "run", "trial", "sweep", "downstream"
ROLE_BENCHMARK = "benchmark"  # a benchmark's parent run (its report's artifacts)
ROLE_THEORY, ROLE_THEORY_RUN = "theory", "theory_run"  # theory lab: parent run, one teaching rule × seed run
TAG_THEORY_METHOD = "attent.theory.method"  # theory lab runs: their teaching rule, greedy | random | full
TAG_THEORY_SEED = "attent.theory.seed"
TRAINING_ROLES = (ROLE_RUN, ROLE_TRIAL)
STATUS_FINISHED, STATUS_RUNNING, STATUS_KILLED = "FINISHED", "RUNNING", "KILLED"  # MLflow's run statuses
NONE = "none"  # tag value where a dimension does not apply
METHOD_ATTENT = "attent"  # TAG_METHOD values analysis singles out
METHOD_FULL = "full"  # the no-selection baseline
# benchmark-only arm names (TAG_BENCH_METHOD values the time-to-accuracy report singles out)
METHOD_FULL_EQUAL_COST = (
    "full_equal_cost"  # full data for the epochs whose measured method cost matches AtteNT's (same seed)
)
METHOD_RANDOM_EQUAL_COST = (
    "random_equal_cost"  # Random for the epochs whose measured method cost matches AtteNT's (same seed)
)
METHOD_FULL_EQUAL_SAMPLES = "full_equal_samples"  # full data for AtteNT's mean ratio x E epochs (equal samples)
METHOD_FULL_LONG = "full_long"  # full data for 2E epochs: the plateau control
METHOD_INFOBATCH_BUDGET = "infobatch_budget"  # InfoBatch pruned to AtteNT's budget


def base_method(name: str) -> str:
    """``attent+stale`` -> ``attent``, ``soft+T0.1`` -> ``soft``: the arm a named variant of a
    benchmark's arm (``arm+suffix``) is a variant of."""
    return str(name).split("+", 1)[0]


# --- params (flattened config keys that analysis reads) --------------------------------------
PARAM_SEED = "seed"
PARAM_RATIO_KIND = "selection.ratio.kind"
PARAM_RATIO_START = "selection.ratio.start"  # for a fixed schedule: the ratio itself
PARAM_RATIO_END = "selection.ratio.end"
PARAM_TEMPERATURE = "selection.temperature"
PARAM_INTERVAL = "selection.interval"  # the interval section: kind, start, end (+ cycles, redraw for kind cycles)
PARAM_INTERVAL_KIND = f"{PARAM_INTERVAL}.kind"
PARAM_INTERVAL_REDRAW = f"{PARAM_INTERVAL}.redraw"  # kind cycles: re-select at every subset epoch
PARAM_EPOCHS = "train.epochs"  # the paper tables' plateau control: full data for twice the others'

# --- metrics --------------------------------------------------------------------------------
EVAL_PREFIX = "eval_"  # a run's own evaluation: eval_<name>
VAL_PREFIX, TEST_PREFIX = "eval_val_", "eval_test_"  # the validation split (choices) and the test split (verdicts)
DOWNSTREAM_PREFIX = "downstream."  # on a pretraining run: downstream.<job>.<metric>
PRETRAINED_ARTIFACT = "pretrained"  # artifact dir of the weights downstream jobs load
PRETRAINED_FILE = "pretrained.pt"  # the file in it (a task's export(), torch.save)
MODEL_NAME = "model"  # each finished run's MLflow logged model (runs:/<run>/model)
TAG_MODEL_LOG_ERROR = "attent.model_log_error"  # why a finished run has no logged model
CHECKPOINT_STATE_FILE = "state.pt"  # the file in each of a run's Ray Train checkpoints
# Per epoch also TRAIN_LOSS, SELECTED_RATIO, SAMPLES_BACKPROPAGATED, SAMPLES_FORWARDED,
# SUBSET_CHECKSUM, each loss component's loss and weight and, from the epoch's re-selection,
# SELECTION_HARDNESS, SELECTION_OVERLAP, SCORE_AGREEMENT (selection.metric_names)
NUM_TRAIN_SAMPLES = "num_train_samples"
OPTIMIZER_STEPS = "optimizer_steps"
GRAD_ACCUMULATION = "grad_accumulation"  # micro-batches per optimiser step (step: the epoch it applies from)
LEARNING_RATE = "learning_rate"  # per epoch: the rate of its last optimiser step (progress (e + 1) / E)
RANKS = "ranks"  # the workers training (step: the epoch from which; an elastic run's changes at its restarts)
RESTORED_AT_EPOCH = "restored_at_epoch"  # a worker group (re)started from a checkpoint: its first epoch (step = it)
# restored from a checkpoint taken inside that epoch (a preemption notice): the optimiser steps it had (step = the epoch)
RESTORED_AT_STEP = "restored_at_step"

# Time split (seconds, cumulative over epochs). What selection changes is the method's cost:
# training + scoring + selection. Evaluation, checkpointing and start-up are reported apart.
TIME_PARTS = ("train", "scoring", "selection", "eval", "checkpoint")
METHOD_TIME_PARTS = ("train", "scoring", "selection")


def time_metric(part: str) -> str:
    """``train`` -> ``time_train_s``."""
    return f"time_{part}_s"


def setup_metric(part: str) -> str:
    """``data`` -> ``time_setup_data_s``: one part of the worker's set-up (``SETUP_PARTS``)."""
    return f"time_setup_{part}_s"


def downstream_metric(job: str, name: str) -> str:
    """A downstream job's final metric as logged on its pretraining run:
    ``downstream_metric("semseg", "miou")`` -> ``downstream.semseg.miou``."""
    return f"{DOWNSTREAM_PREFIX}{job}.{name}"


TIME_METHOD = "time_method_s"  # training + scoring + selection
TIME_TOTAL = "time_total_s"  # every epoch's wall time, evaluation included
TIME_SETUP = "time_setup_s"  # worker: task, data and model set-up
# ... split: MLflow logger and system-metrics monitor, task and its data, model, the rest
# (optimiser, selector, loader, the checkpoint lookup, the first logs)
SETUP_PARTS = ("tracking", "data", "model", "other")
TIME_WALLCLOCK = "time_wallclock_s"  # driver: the whole run, Ray start-up included
TIME_RAY_INIT = "time_ray_init_s"  # driver: connecting to (or starting) Ray
TIME_WORKER_START = "time_worker_start_s"  # TorchTrainer.fit() until the workers run our code
TIME_STARTUP = "time_startup_s"  # before the first epoch: Ray init + worker start + set-up
TIME_TEARDOWN = "time_teardown_s"  # after the last epoch: final logs, checkpoint, shutdown
TIME_RAY_OVERHEAD = "time_ray_overhead_s"  # wall-clock minus the epochs
TIME_MODEL_LOG = "time_model_log_s"  # rank 0, at the end: logging the trained model in MLflow

# Empirical ANTK tracking (``antk:``, engine/antk.py): kernels on a fixed probe set, rank 0.
TIME_ANTK = "time_antk_s"  # cumulative kernel time: not in time_total_s nor time_method_s
ANTK_DRIFT_CONSECUTIVE = "antk_drift_consecutive"  # per tracked epoch: ||K_e - K_prev||_F / ||K_prev||_F
ANTK_DRIFT_TO_FINAL = "antk_drift_to_final"  # at the end, step = tracked epoch: ||K_e - K_T||_F / ||K_T||_F
ANTK_ALIGNMENT_TO_FINAL = "antk_alignment_to_final"  # at the end, step = tracked epoch: <K_e, K_T>_F / (|K_e| |K_T|)
ANTK_PARAMETERS = "antk_parameters"  # trainable parameters the kernel spans (LoRA only for LLMs)
ANTK_KERNELS_ARTIFACT = "antk/kernels.npz"  # epochs (0-based) [T], kernels [T, N, N], probe indices [N], seconds [T]
ANTK_HEATMAP_FIGURE = "figures/antk_kernels.png"  # heatmaps at antk.heatmap_epochs
ANTK_DRIFT_FIGURE = "figures/antk_drift.png"  # drift to the final kernel and between kernels, per epoch


def method_cost(metrics: Mapping[str, float]) -> float:
    """A run's (or epoch's) method cost from its metrics: ``time_method_s``, or for runs logged
    before it existed the sum of its parts; NaN where neither was logged."""

    def value(name: str) -> float:
        got = metrics.get(name)
        return float("nan") if got is None else float(got)

    logged = value(TIME_METHOD)
    if logged == logged:
        return logged
    return sum(value(time_metric(part)) for part in METHOD_TIME_PARTS)  # NaN if any part is


# Logged once at the end.
SAMPLE_SAVING = "sample_saving"  # 1 - back-propagated / (N x epochs)
MEAN_SELECTED_RATIO = "mean_selected_ratio"  # mean over epochs of selected_ratio
MAX_SELECTED_RATIO = "max_selected_ratio"

# What the dashboard shows first for every training run, after its downstream metrics
# (``is_downstream_metric``): the method's cost, the samples it trained on, the saving.
KEY_METRICS = (TIME_METHOD, SAMPLES_BACKPROPAGATED, SAMPLE_SAVING)
CURVE_METRICS = (TRAIN_LOSS, SELECTED_RATIO)  # per epoch, charted beside the eval_* curves
# MLflow's system metrics monitor, one per Ray node: system/node_<node rank>/<name>
SYSTEM_METRICS_PREFIX = "system/"
# charted first: CPU and GPU utilisation, system and GPU memory (cpu_utilization_percentage, gpu_0_...)
SYSTEM_METRICS_FIRST = ("utilization_percentage", "memory_usage_megabytes")  # name endings


def is_downstream_metric(name: str) -> bool:
    """A run's own evaluation (``eval_*``) or a downstream job's (``downstream.*``)."""
    return name.startswith(EVAL_PREFIX) or name.startswith(DOWNSTREAM_PREFIX)


LOWER_IS_BETTER_WORDS = ("loss", "time", "perplexity", "abs_rel", "sq_rel", "rmse")


def lower_is_better(metric_name: str) -> bool:
    """Losses, times, perplexity and depth errors (abs_rel, sq_rel, rmse); for a downstream
    job's metric (``downstream.<job>.<name>``) only its own name counts, not the job's."""
    if metric_name.startswith(DOWNSTREAM_PREFIX):
        metric_name = metric_name.removeprefix(DOWNSTREAM_PREFIX).partition(".")[2]
    return any(word in metric_name for word in LOWER_IS_BETTER_WORDS)


def system_metric(node_rank: int, name: str) -> str:
    """``system_metric(0, "cpu_utilization_percentage")`` -> ``system/node_0/cpu_utilization_percentage``."""
    return f"{SYSTEM_METRICS_PREFIX}{system_node_id(node_rank)}/{name}"


def system_node_id(node_rank: int) -> str:
    """The node part of system metric names, as MLflow's UI groups them (``node_<rank>``)."""
    return f"node_{node_rank}"


# --- datasets (MLflow run inputs) -------------------------------------------------------------
DATASET_CONTEXT_TAG = "mlflow.data.context"  # MLflow's input tag: what the run used the data for
DATASET_TRAIN, DATASET_EVAL = "train", "eval"  # its values here: trained on, and the test set
DATASET_VALIDATION = "validation"  # held out of the training pool for choices (eval_val_* metrics)
DATASET_SOURCE_LOCAL, DATASET_SOURCE_HUB = "local", "hugging_face"  # MLflow's source types


@dataclass(frozen=True)
class DatasetDescription:
    """One dataset a run reads, recorded as an MLflow run input (``Task.describe_data``)."""

    name: str  # e.g. "digits-train"
    source: str  # where it comes from: a folder or file, or a hub name
    context: str  # DATASET_TRAIN, DATASET_VALIDATION or DATASET_EVAL
    num_samples: int
    fingerprint: str = ""  # hash of the content where cheap; "" = of the fields above only
    source_type: str = DATASET_SOURCE_LOCAL  # or DATASET_SOURCE_HUB


# --- experiment tags the MLflow UI reads ------------------------------------------------------
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"  # earlier MLflow 3 UIs open the experiment by it
EXPERIMENT_KIND_TRAINING = "custom_model_development"
TAG_SHARED_VIEW_PREFIX = "mlflow.sharedViewState."  # + key: a runs-page view, opened by ?viewStateShareKey=key
TRAINING_VIEW_KEY = "attent-training"  # the dashboard's view of training runs

# --- run identity ---------------------------------------------------------------------------
# Config keys (flattened, prefix match on whole dot-separated parts) that do not change what is
# trained: seeds are averaged over, the rest is plumbing. Every other field is the identity.
IDENTITY_EXCLUDED = (
    "name",
    "seed",
    "mlflow",  # tracking URI, experiment, artifact options
    "ray.address",
    "ray.storage_path",
    "ray.max_failures",
    "ray.checkpoints_to_keep",
    "ray.placement_strategy",
    "fault",  # failure injection replays identical metrics
    "selection.preset",  # its effect is in the fields it fills
    "task.data_dir",  # where an offline mirror lives
    "antk",  # kernel tracking observes, trains nothing
)


def is_identity_key(key: str) -> bool:
    """Whether a flattened config key is part of a run's identity."""
    return not any(key == prefix or key.startswith(prefix + ".") for prefix in IDENTITY_EXCLUDED)


def identity_fields(flat_config: Mapping[str, Any]) -> dict[str, Any]:
    """The identity part of a flattened config, sorted by key."""
    return {k: flat_config[k] for k in sorted(flat_config) if is_identity_key(k)}


def identity_hash(flat_config: Mapping[str, Any]) -> str:
    """12 hex digits naming the configuration: runs with equal hashes differ only by seed or
    plumbing, so their metrics may be averaged."""
    canonical = json.dumps(identity_fields(flat_config), sort_keys=True, default=str)
    return hashlib.sha1(canonical.encode()).hexdigest()[:12]
