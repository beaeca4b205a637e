"""Ray Tune sweeps: a grid of selection settings x seeds on top of one base experiment.

Each trial is a Tune *function trainable* that launches the Train engine's TorchTrainer (the
Train V2 pattern): a trial may itself use several workers or GPUs, and Train's per-epoch reports
reach Tune through ``TuneReportCallback``. MLflow gets one parent run per sweep and one child run
per trial (linked by the parent run id, which works across Ray processes).

    sweep:
      name: ablation-digits
      base: ../digits_vit.yaml          # experiment YAML, relative to this file
      overrides: {train.epochs: 4}      # applied to the base for every trial
      grid:                             # cartesian product of key.path -> values
        selection.strategy: [random, hard, soft]
      trials:                           # extra trials outside the grid (e.g. the baseline row)
        - {selection.preset: null, selection.method: full}
      seeds: [0, 1, 2]
      max_concurrent: 2                 # null: as many as the cluster's CPUs allow

Trials launch seed-major (``launch_order``): every configuration of a seed, full data's included,
before any of the next seed, each seed's block rotated to start elsewhere, so that a slow drift of
the machine over a long sweep falls on every configuration alike, not on one of them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from . import contract
from .config import (
    ConfigError,
    ExperimentConfig,
    build_experiment,
    load_section,
    nest_keys,
    parse_overrides,
    read_yaml,
    sqlite_file,
)
from .selection.config import deep_merge

T = TypeVar("T")


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.\-]+$")  # Tune experiment and MLflow parent run name
    base: str  # base experiment YAML (relative to the sweep file)
    overrides: dict[str, Any] = {}  # key.path -> value, for every trial
    grid: dict[str, list[Any]] = {}  # key.path -> values; cartesian product
    trials: list[dict[str, Any]] = []  # extra trials (key.path -> value each)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    max_concurrent: int | None = Field(None, ge=1)  # None: what the cluster's CPUs allow


class Sweep(BaseModel):
    """A validated sweep: its spec and the experiment of every trial."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    spec: SweepSpec
    base: ExperimentConfig
    trials: list[tuple[str, ExperimentConfig]]  # (trial id, experiment), in launch order


def load_sweep(path: str | Path, overrides: list[str] | None = None, *, name: str | None = None) -> Sweep:
    """The sweep in ``path``; ``overrides`` apply to its base experiment, ``name`` renames it."""
    path = Path(path)
    spec = load_section(path, "sweep", SweepSpec, name=name)
    cli_overrides = parse_overrides(overrides or [])
    base_data = deep_merge(
        read_yaml((path.parent / spec.base).resolve()), deep_merge(nest_keys(spec.overrides), cli_overrides)
    )
    if "mlflow.experiment" not in spec.overrides and "experiment" not in cli_overrides.get("mlflow", {}):
        # A sweep is its own MLflow experiment (what `attent report --experiment` reads),
        # whatever experiment its base file names.
        base_data.setdefault("mlflow", {})["experiment"] = spec.name
    base = build_experiment(base_data, f"{path} (base {spec.base})")
    variants = [dict(zip(spec.grid, values)) for values in itertools.product(*spec.grid.values())] if spec.grid else []
    variants += spec.trials
    if not variants:
        variants = [{}]
    trials = []
    for i, seed in launch_order(len(variants), spec.seeds):
        trial_id = f"t{i:02d}-s{seed}"
        data = deep_merge(base_data, nest_keys(variants[i]))
        data.update(name=f"{spec.name}-{trial_id}", seed=seed)
        trials.append((trial_id, build_experiment(data, f"{path} trial {trial_id} {variants[i]}")))
    return Sweep(spec=spec, base=base, trials=trials)


def seed_block(items: list[T], block: int, blocks: int) -> list[T]:
    """``items`` as the ``block``-th of ``blocks`` seed blocks runs them: rotated to start at item
    ``block * len(items) // blocks``, so that over the seeds each item takes the early and the late
    places of a block alike (none is always first or last) and a drift of the machine is shared."""
    if not items:
        return []
    start = block * len(items) // blocks % len(items)
    return items[start:] + items[:start]


def launch_order(configurations: int, seeds: list[int]) -> list[tuple[int, int]]:
    """(configuration index, seed) of every trial in launch order: seed-major, every configuration
    of a seed before any of the next, each seed's block rotated by ``seed_block``."""
    return [(i, seed) for k, seed in enumerate(seeds) for i in seed_block(list(range(configurations)), k, len(seeds))]


def is_sweep_file(path: str | Path) -> bool:
    """A sweep file holds a single top-level key ``sweep``."""
    return set(read_yaml(path)) == {"sweep"}


def describe_sweep(sweep: Sweep) -> str:
    """What `attent validate` prints for a sweep: every trial's experiment, one line each."""
    spec = sweep.spec
    lines = [
        f"sweep {spec.name!r}: {len(sweep.trials)} trials ({len(sweep.trials) // len(spec.seeds)} "
        f"configurations x {len(spec.seeds)} seed(s)), base {spec.base}, "
        f"max_concurrent {spec.max_concurrent or 'cluster CPUs'}; in launch order"
    ]
    for trial_id, cfg in sweep.trials:
        lines.append(
            f"  {trial_id}: {cfg.task.name}, {cfg.train.epochs} epochs, "
            f"{cfg.selection.label(cfg.train.epochs)}, {cfg.ray.num_workers} worker(s)"
        )
    return "\n".join(lines)


def run_trial(config: dict[str, Any], tracking_uri: str | None = None) -> None:
    """The Tune function trainable: one trial = one Train run = one MLflow child run (plus its
    downstream jobs, children of that run). ``tracking_uri``: the sweep's own tracking server,
    which replaces the trial's SQLite store (given apart from the config, so that a resumed
    sweep's new server reaches the restored trials too)."""
    trial = config["trial"]
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from .engine.driver import run_downstream, run_pipeline
    from .engine.tracking import latest_run

    cfg = ExperimentConfig.model_validate(trial["experiment"])
    if tracking_uri:
        cfg = cfg.model_copy(update={"mlflow": cfg.mlflow.model_copy(update={"tracking_uri": tracking_uri})})
    done = latest_run(cfg)
    if done is not None and done.info.status == "FINISHED":
        # Finished, but the driver died before Tune saved that: finish its downstream jobs and
        # report, do not train again.
        downstream = run_downstream(cfg, done.info.run_id) if cfg.downstream else {}
        tune.report({**done.data.metrics, **downstream})
        return
    local = cfg.ray.num_workers == 0  # Ray Train's local mode: the trial trains in this process
    result = run_pipeline(
        cfg,
        parent_run_id=trial["parent_run_id"],
        role="trial",
        extra_tags={contract.TAG_SWEEP: trial["sweep"], contract.TAG_TRIAL: trial["id"]},
        callbacks=None if local else [TuneReportCallback()],
        on_epoch=tune.report if local else None,
    )
    if result.downstream:
        tune.report({**result.training.metrics, **result.downstream})


TRIAL_DRIVER_RESOURCES = {"memory": 256 * 1024**2}  # an idle Python process; its workers ask for CPUs


def trial_resources(base: ExperimentConfig) -> dict[str, float]:
    """What a trial's own process asks Tune for. With Train workers it needs no CPU (they ask for
    theirs), but Tune refuses an empty request: the memory of an idle Python process. In Ray
    Train's local mode it trains itself: one worker's bundle (and Ray gives it as many threads)."""
    if base.ray.num_workers:
        return TRIAL_DRIVER_RESOURCES
    from .engine.preflight.resources import worker_bundle

    return {**worker_bundle(base), **TRIAL_DRIVER_RESOURCES}


SWEEP_SERVER_LOG = "mlflow-server.log"  # beside the SQLite file: the sweep's own tracking server's output
# Set to log concurrent trials straight into SQLite, without the sweep's server (to measure what it loses).
DIRECT_SQLITE_ENV = "ATTENT_SWEEP_DIRECT_SQLITE"


def run_sweep(path: str | Path, *, resume: bool = False, overrides: list[str] | None = None, name: str | None = None):
    """Run (or, with ``resume``, finish) a sweep: checks, Ray, the MLflow parent run, then Tune."""
    sweep = load_sweep(path, overrides, name=name)  # a bad file is refused before Ray is imported (seconds)
    base = sweep.base.resolved()
    trials = [(tid, cfg.resolved()) for tid, cfg in sweep.trials]
    from .engine.preflight import check_experiment

    check_experiment(*(cfg for _, cfg in trials))  # store, resources, data: before Ray starts
    tune_path = sweep_location(base.ray.storage_path, sweep.spec.name)
    _check_resume(tune_path, sweep.spec.name, resume)
    from .engine import tracking
    from .engine.driver import ensure_ray
    from .engine.preflight.cluster import check_cluster_resources

    ensure_ray(base)  # before the parent run: the cluster check needs Ray
    check_cluster_resources(*(cfg for _, cfg in trials), driver=TRIAL_DRIVER_RESOURCES)
    parent_id = _parent_run(base, sweep.spec.name, tune_path)  # creates the experiment, store-side
    ok = False
    try:
        start = time.perf_counter()
        concurrency = _concurrency(sweep)
        with _trial_tracking(base, concurrency) as tracking_uri:
            results = _tuner(sweep, trials, parent_id, tune_path, resume, concurrency, tracking_uri).fit()
        failed = [r for r in results if r.error is not None]
        ok = not failed
        elapsed = time.perf_counter() - start
        client = tracking.client_for(base.mlflow.tracking_uri)
        client.log_metric(parent_id, "sweep_wallclock_s", elapsed)
        client.log_metric(parent_id, "trials_failed", len(failed))
        print(
            f"[attent] sweep {sweep.spec.name}: {len(results) - len(failed)}/{len(results)} trials finished "
            f"in {elapsed:.0f}s",
            flush=True,
        )
        return results
    finally:
        tracking.finish_run(base.mlflow.tracking_uri, parent_id, ok)


def _check_resume(tune_path: str, name: str, resume: bool) -> None:
    from ray import tune

    if resume and not tune.Tuner.can_restore(tune_path):
        raise ConfigError(f"nothing to resume at {tune_path}: run the sweep without --resume first")
    if not resume and _exists(tune_path):
        raise ConfigError(
            f"{tune_path} already holds sweep {name!r}: pass --resume to continue it, or rename the sweep"
        )


def _concurrency(sweep: Sweep) -> int:
    """Trials at a time: max_concurrent, else as many as the cluster's CPUs hold."""
    import ray

    per_trial = max(1, sweep.base.ray.num_workers) * sweep.base.ray.cpus_per_worker
    return sweep.spec.max_concurrent or max(1, int(ray.cluster_resources().get("CPU", 1) // per_trial))


@contextlib.contextmanager
def _trial_tracking(base: ExperimentConfig, concurrency: int) -> Iterator[str | None]:
    """Concurrent trials on a SQLite store log through a tracking server started here over that
    file, for the sweep's duration: SQLite refuses a writer while another holds its lock
    ("database is locked", which loses that write), the server's client retries (README,
    benchmarks/results/tracking_load/tracking_load.md). Yields its URL; None when no server is needed."""
    from . import server

    uri = base.mlflow.tracking_uri
    direct = os.environ.get(DIRECT_SQLITE_ENV, "").strip().lower() in ("1", "true", "yes")
    if concurrency <= 1 or not uri.startswith("sqlite:") or direct:
        yield None
        return
    _refuse_sqlite_across_nodes(uri)
    database = sqlite_file(uri)
    spec = server.ServerSpec(
        uri, str(database.parent / server.DEFAULT_ARTIFACTS), port=server.free_port(), workers=1
    )  # one process on the sweep's machine: its threads serve the trials
    log = database.parent / SWEEP_SERVER_LOG
    print(
        f"[attent] {concurrency} concurrent trials on SQLite: they log through a tracking server on "
        f"{spec.url} over {database} (log {log}); `attent server` serves several sweeps",
        flush=True,
    )
    with server.serving(spec, log) as url:
        yield url


def _refuse_sqlite_across_nodes(uri: str) -> None:
    """A SQLite file lives on one machine: trials on other nodes cannot reach it."""
    import ray

    if not ray.is_initialized():  # no cluster to span
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1:
        raise ConfigError(
            f"mlflow.tracking_uri {uri} is a SQLite file on this machine, but the Ray cluster "
            f"has {len(nodes)} nodes whose trials must all reach it: run `attent server --host "
            f"<this node's private IP>` here (add --backend-store-uri postgresql://… for a lasting store) and set "
            f"mlflow.tracking_uri (or $MLFLOW_TRACKING_URI) to the URL it prints"
        )


def sweep_location(storage_path: str, name: str) -> str:
    """Where Tune keeps the sweep: a string join, as Path() would fold the '//' of s3:// or gs://."""
    return f"{storage_path.rstrip('/')}/{name}"


def _exists(location: str) -> bool:
    """Whether a local path or a storage URI (s3://, gs://: pyarrow's file systems, as Tune's) exists."""
    if "://" not in location:
        return Path(location).exists()
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(location)
    return filesystem.get_file_info(path).type != fs.FileType.NotFound


def _tuner(
    sweep: Sweep,
    trials: list[tuple[str, ExperimentConfig]],
    parent_id: str,
    tune_path: str,
    resume: bool,
    concurrency: int,
    tracking_uri: str | None = None,
):
    """The Tune grid of trials (one per trial id), new or restored from ``tune_path``. One
    ``grid_search`` over the trials' list: Tune launches them in its order, ``launch_order``'s."""
    from ray import tune

    param_space = {
        "trial": tune.grid_search(
            [
                {
                    "id": tid,
                    "experiment": cfg.model_dump(mode="json"),
                    "parent_run_id": parent_id,
                    "sweep": sweep.spec.name,
                }
                for tid, cfg in trials
            ]
        )
    }
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, tracking_uri=tracking_uri), trial_resources(sweep.base)
    )
    if resume:
        return tune.Tuner.restore(
            tune_path, trainable=trainable, resume_unfinished=True, resume_errored=True, param_space=param_space
        )
    print(
        f"[attent] sweep {sweep.spec.name}: {len(trials)} trials, up to {concurrency} at a time; "
        f"MLflow parent run {parent_id}",
        flush=True,
    )
    return tune.Tuner(
        trainable,
        param_space=param_space,
        # reuse_actors: a trial's process trains the next trial too (every trial's resources are
        # the same), so each pays its imports (torch, timm, MLflow) once, not once per trial
        tune_config=tune.TuneConfig(
            max_concurrent_trials=concurrency,
            reuse_actors=True,
            trial_dirname_creator=lambda t: t.config["trial"]["id"],
            trial_name_creator=lambda t: t.config["trial"]["id"],
        ),
        run_config=tune.RunConfig(name=sweep.spec.name, storage_path=tune_path.rsplit("/", 1)[0], verbose=1),
    )


def _parent_run(base: ExperimentConfig, name: str, key: str) -> str:
    """The sweep's MLflow parent run: reopened on --resume, created otherwise."""
    from .engine import tracking

    client = tracking.client_for(base.mlflow.tracking_uri)
    experiment_id = tracking.open_experiment(client, base.mlflow.experiment, base.mlflow.tracking_uri)
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{contract.TAG_SWEEP_KEY}` = '{key}'", max_results=1
    )
    if found:
        tracking.reopen_run(client, found[0].info.run_id)
        return found[0].info.run_id
    tags = {
        contract.TAG_ROLE: contract.ROLE_SWEEP,
        contract.TAG_SWEEP: name,
        contract.TAG_SWEEP_KEY: key,
        contract.TAG_RUN_NAME: name,
        contract.TAG_TASK: base.task.name,
        contract.TAG_GIT_COMMIT: tracking.git_commit(),
        **tracking.driver_tags(),
    }
    run = client.create_run(experiment_id, run_name=name, tags=tags)
    client.log_text(run.info.run_id, tracking.yaml_dump(base), "base_config.yaml")
    return run.info.run_id
