"""A file's stand-in: the run an experiment or sweep file describes, at a size any machine trains in
seconds, with every stage of the full run kept (its data sources and loaders, its architecture family,
its selection's scoring passes and re-selections, a checkpoint and a resume from it, its downstream and
evaluation jobs, its tracking store). Derived from the file each time, never kept as a second file.

No Ray and no torch here: ``attent rehearse`` derives and prints every stand-in before anything starts.
"""

from __future__ import annotations

import math
from typing import Any

from ..experiment.schema import ExperimentConfig, FaultConfig, build_experiment
from ..selection.config import deep_merge
from ..sweep.spec import Sweep
from ..tasks.config import STAND_IN

SUFFIX = "-rehearsal"  # on run, sweep, MLflow experiment and registered model names: the real run's stay free
EPOCHS = 4  # enough for a scoring pass, a selection, a re-selection and an evaluation between them
WORKERS = 2  # data-parallel ranks: the all-reduces and the agreed counts of a multi-worker run
BATCH = 4  # samples per worker and micro-step
FAULT_AFTER_EPOCH = 1  # a worker dies once after this epoch's checkpoint: the run resumes from it
SETTING_EPOCHS = 2  # a sweep's other trials: a scoring pass, a selection, a re-selection, an evaluation
SETTING_SAMPLES = STAND_IN.train_samples // 2  # and on half the samples: the same stages, half the steps
SIZE_UNKNOWN = {"expected_train_samples": None}  # the full data's size, which a stand-in does not have


def standin_experiment(cfg: ExperimentConfig, *, use_gpu: bool, epochs: int = EPOCHS) -> ExperimentConfig:
    """``cfg`` at the stand-in size, under its own names.

    Args:
        cfg: the file's experiment (a sweep's trial included), as loaded.
        use_gpu: whether its workers get a GPU each (the file's choice, where the cluster has them).
        epochs: its length; a sweep's longer controls keep their ratio to the base.

    Returns:
        The experiment a rehearsal runs: a checkpoint every epoch, one worker failure after epoch
        ``FAULT_AFTER_EPOCH`` and the resume from its checkpoint, the task's stand-in fields
        (``TaskConfig.rehearsal_fields``), each downstream job at the same size.
    """
    ray, train = cfg.ray, cfg.train
    workers: int | list[int] = [1, WORKERS] if ray.elastic else min(ray.max_workers, WORKERS)
    width = max(1, WORKERS if ray.elastic else workers)
    batch = min(train.batch_size, BATCH)
    changes: dict[str, Any] = {
        "name": cfg.name + SUFFIX,
        "task": cfg.task.rehearsal_fields() | SIZE_UNKNOWN,
        "train": _train_fields(train.model_dump(mode="json"), batch, width, epochs),
        "ray": {
            "num_workers": workers,
            "use_gpu": ray.use_gpu and use_gpu,
            "cpus_per_worker": 1,
            "checkpoint_every": 1,
            "max_failures": max(ray.max_failures, 1),
        },
        "mlflow": {"experiment": cfg.mlflow.experiment + SUFFIX},
        "fault": {"fail_once_after_epoch": FAULT_AFTER_EPOCH if epochs > FAULT_AFTER_EPOCH + 1 else None},
        "antk": {"probe_size": min(cfg.antk.probe_size, STAND_IN.test_samples)},
        "downstream": [_standin_job(cfg, job) for job in cfg.downstream],
    }
    if cfg.mlflow.registered_model:
        changes["mlflow"]["registered_model"] = cfg.mlflow.registered_model + SUFFIX
    if cfg.selection.interval.kind == "cycles":
        changes["selection"] = {"interval": _cycles_fields(cfg.selection, epochs)}
    data = deep_merge(cfg.model_dump(mode="json"), changes)
    data["downstream"] = changes["downstream"]  # a list: replaced, not merged
    return build_experiment(data, f"the stand-in of {cfg.name}")


def _train_fields(train: dict[str, Any], batch: int, width: int, epochs: int) -> dict[str, Any]:
    """A ``train:`` section at the stand-in size: gradient accumulation kept where the file has it."""
    fields = {"epochs": epochs, "batch_size": batch, "eval_every": max(1, epochs // 2)}
    if train.get("global_batch_size"):
        fields["global_batch_size"] = batch * width * 2
    if train.get("scoring_batch_size"):
        fields["scoring_batch_size"] = min(train["scoring_batch_size"], 2 * batch)
    if train.get("loader_workers"):
        fields["loader_workers"] = 1  # a loader process: its start and its hand-over, at the least cost
    return fields


def _cycles_fields(selection, epochs: int) -> dict[str, Any]:
    """The cycles reading in ``epochs``: the warm-up kept, then as many cycles (at most the file's) as leave
    each at least two epochs, each opening with its subset epochs (at most the cycle's but one) and ending on
    all data; one cycle of one subset epoch where a single epoch is left. 4 epochs of 10 cycles of 5 -> 10
    subset epochs: the warm-up, then one cycle of 2 subset epochs (a pick, a re-draw or a kept pick) and one
    epoch on all data."""
    interval = selection.interval
    after_warmup = max(1, epochs - selection.warmup_epochs)
    cycles = min(interval.cycles, max(1, after_warmup // 2))
    longest = max(1, after_warmup // cycles - 1)
    return {"cycles": cycles, "start": min(interval.start, longest), "end": min(interval.end, longest)}


def _standin_job(cfg: ExperimentConfig, job) -> dict[str, Any]:
    """A downstream job at the stand-in size: its own data, the stand-in encoder it inherits."""
    run = cfg.downstream_experiment(job, pretrained=None)
    fields = {key: value for key, value in run.task.rehearsal_fields().items() if key != "model"} | SIZE_UNKNOWN
    workers = None if job.num_workers is None else min(job.num_workers, WORKERS)  # the job's own, where it has them
    width = max(1, WORKERS if run.ray.elastic else min(run.ray.max_workers, WORKERS))
    train = _train_fields(job.train.model_dump(mode="json"), min(job.train.batch_size, BATCH), width, 1)
    return {
        "name": job.name,
        "num_workers": workers,
        "task": {**job.task, **fields},
        "train": deep_merge(job.train.model_dump(mode="json"), train),
    }


def standin_sweep(sweep: Sweep, *, use_gpu: bool, whole_first: bool = True) -> Sweep:
    """The sweep's covering trials (``covering_trials``) at the stand-in size, under its own name.

    Args:
        sweep: the file's sweep, as loaded.
        use_gpu: whether each trial's workers get a GPU each.
        whole_first: whether the first trial has the failure, the resume and the downstream jobs
            (False where the base experiment is rehearsed on its own).

    Returns:
        A sweep of one seed whose trials set, between them, every value of every kind the file
        sets (its methods, strategies, schedule kinds, models, data sets, longer controls). The
        first trial (``whole_first``) has the workers, their failure and the downstream jobs; the
        others train and evaluate in Ray Train's local mode (the trial's own process) for
        ``SETTING_EPOCHS`` on ``SETTING_SAMPLES`` with no loader process, as what more workers,
        epochs, samples and loader processes would add is the same stages again.
    """
    spec = sweep.spec.model_copy(update={"name": sweep.spec.name + SUFFIX, "seeds": sweep.spec.seeds[:1]})
    base = standin_experiment(sweep.base, use_gpu=use_gpu)
    mlflow = base.mlflow.model_copy(update={"experiment": spec.name})  # a sweep is its own MLflow experiment
    trials = []
    for index, (trial_id, cfg) in enumerate(covering_trials(sweep)):
        whole = index == 0 and whole_first  # the workers, their failure, the resume, the downstream jobs
        length = EPOCHS if whole else SETTING_EPOCHS
        epochs = math.ceil(length * cfg.train.epochs / sweep.base.train.epochs)
        stand_in = standin_experiment(cfg, use_gpu=use_gpu, epochs=epochs)
        update = {"name": f"{spec.name}-{trial_id}", "mlflow": mlflow}
        if not whole:
            # Ray Train's local mode, its settings only, on the CPUs its workers would have had (torch's threads)
            ray = stand_in.ray.model_copy(update={"num_workers": 0, "cpus_per_worker": WORKERS})
            task = stand_in.task.model_copy(update={"train_limit": SETTING_SAMPLES})
            train = stand_in.train.model_copy(update={"loader_workers": 0})  # the whole trial's start them
            update |= {"fault": FaultConfig(), "downstream": [], "ray": ray, "task": task, "train": train}
        trials.append((trial_id, stand_in.model_copy(update=update)))
    settings = {trial_id: sweep.settings[trial_id] for trial_id, _ in trials}
    return Sweep(spec=spec, base=base.model_copy(update={"mlflow": mlflow}), trials=trials, settings=settings)


def covering_trials(sweep: Sweep) -> list[tuple[str, Any]]:
    """The first seed's trials, fewest first, until every setting the file makes is made by one.

    A setting is a key and the kind of its value: numbers do not count (seven ratios are one
    stage), names and schedule kinds do (Hard and Soft, cosine and incremental, two models); so do
    each trial's method and strategy (a trial of the base's settings, ``{}``, is AtteNT's arm).

    Args:
        sweep: the file's sweep.

    Returns:
        (trial id, experiment) pairs in launch order.
    """
    first = sweep.spec.seeds[0]
    candidates = [(tid, cfg) for tid, cfg in sweep.trials if cfg.seed == first]
    kinds = {
        tid: {(key, _kind(value)) for key, value in sweep.settings[tid].items()}
        | {("method", cfg.selection.method), ("strategy", str(cfg.selection.strategy))}  # a trial of the base too
        for tid, cfg in candidates
    }
    wanted = set().union(*kinds.values()) if kinds else set()
    chosen: list[str] = []
    while wanted or not chosen:
        best = max(candidates, key=lambda pair: len(kinds[pair[0]] & wanted))[0]
        chosen.append(best)
        wanted -= kinds[best]
    return [(tid, cfg) for tid, cfg in candidates if tid in chosen]


def _kind(value: Any) -> str:
    """A setting's value with its numbers left out: what makes a trial's stages differ."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return repr(value)
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_kind(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_kind(v) for v in value) + "]"
    return type(value).__name__


def remap_experiment(cfg: ExperimentConfig, roots: tuple[str, ...], folder: str | None) -> ExperimentConfig:
    """``cfg`` with its paths under the cluster's ``roots`` moved under ``folder`` (``remap_shared``);
    ``cfg`` itself where no folder stands for the shared storage."""
    if folder is None:
        return cfg
    return build_experiment(remap_shared(cfg.model_dump(mode="json"), roots, folder), cfg.name)


def remap_shared(data: Any, roots: tuple[str, ...], folder: str) -> Any:
    """``data`` with every path under one of ``roots`` moved under ``folder``: a laptop's or a CI's
    folder standing for the cluster's shared storage.

    Args:
        data: a file's sections (nested dicts, lists, strings).
        roots: absolute paths the cluster mounts (e.g. ``/shared``).
        folder: the folder standing for them; each root's contents lie under ``folder/<root's name>``.

    Returns:
        The same structure, remapped.

    >>> remap_shared({"a": ["/shared/x", "/etc/y"]}, ("/shared",), "/tmp/s")
    {'a': ['/tmp/s/shared/x', '/etc/y']}
    """
    if isinstance(data, dict):
        return {key: remap_shared(value, roots, folder) for key, value in data.items()}
    if isinstance(data, list):
        return [remap_shared(value, roots, folder) for value in data]
    if isinstance(data, str):
        for root in roots:
            if data == root or data.startswith(root.rstrip("/") + "/"):
                return folder.rstrip("/") + "/" + data.lstrip("/")
    return data
