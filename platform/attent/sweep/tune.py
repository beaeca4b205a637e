"""A sweep run on Ray Tune: one Tune *function trainable* per trial, each launching the Train engine's
TorchTrainer (the Train V2 pattern): a trial may itself use several workers or GPUs, and Train's
per-epoch reports reach Tune through ``TuneReportCallback``. MLflow gets one parent run per sweep and
one child run per trial (linked by the parent run id, which works across Ray processes). The sweep
file and its trials are ``attent.sweep.spec``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import contract
from ..engine.tracking_defaults import DEFAULT_ARTIFACTS
from ..experiment.schema import ConfigError, ExperimentConfig
from ..experiment.uris import sqlite_file
from .spec import Sweep, load_sweep

if TYPE_CHECKING:
    from ..engine.tracking import TrackingSession


def run_trial(config: dict[str, Any], tracking_uri: str | None = None) -> None:
    """The Tune function trainable: one trial = one Train run = one MLflow child run (plus its
    downstream jobs, children of that run). ``tracking_uri``: the sweep's own tracking server,
    which replaces the trial's SQLite store (given apart from the config, so that a resumed
    sweep's new server reaches the restored trials too)."""
    trial = config["trial"]
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from ..engine.driver import run_downstream, run_pipeline
    from ..engine.tracking import TrackingSession

    cfg = ExperimentConfig.model_validate(trial["experiment"])
    if tracking_uri:
        cfg = cfg.model_copy(update={"mlflow": cfg.mlflow.model_copy(update={"tracking_uri": tracking_uri})})
    cfg = cfg.resolved()  # resolved already in the sweep's driver: the paths stay as they are
    tracking = TrackingSession.of(cfg)  # the trial's one session, handed on to its run and jobs
    done = tracking.latest_run(cfg)
    if done is not None and done.info.status == "FINISHED":
        # Finished, but the driver died before Tune saved that: finish its downstream jobs and
        # report, do not train again.
        downstream = run_downstream(cfg, done.info.run_id, tracking=tracking) if cfg.downstream else {}
        tune.report({**done.data.metrics, **downstream})
        return
    local = cfg.ray.num_workers == 0  # Ray Train's local mode: the trial trains in this process
    result = run_pipeline(
        cfg,
        tracking,
        parent_run_id=trial["parent_run_id"],
        role="trial",
        extra_tags={contract.TAG_SWEEP: trial["sweep"], contract.TAG_TRIAL: trial["id"]},
        callbacks=None if local else [TuneReportCallback()],
        on_epoch=tune.report if local else None,
    )
    if result.downstream:
        tune.report({**result.training.metrics, **result.downstream})


TRIAL_DRIVER_RESOURCES = {"memory": 256 * 1024**2}  # an idle Python process; its workers ask for CPUs


def trial_resources(cfg: ExperimentConfig) -> dict[str, float]:
    """What a trial's own process asks Tune for, from the trial's own ``ray:`` section (a grid may
    vary it). With Train workers it needs no CPU (they ask for theirs), but Tune refuses an empty
    request: the memory of an idle Python process. In Ray Train's local mode it trains itself: one
    worker's bundle (and Ray gives it as many threads)."""
    if cfg.ray.num_workers:
        return TRIAL_DRIVER_RESOURCES
    from ..engine.preflight.resources import worker_bundle

    return {**worker_bundle(cfg), **TRIAL_DRIVER_RESOURCES}


def concurrency(max_concurrent: int | None, trials: list[ExperimentConfig], cluster: dict[str, float]) -> int:
    """Trials at a time: ``max_concurrent``, else as many of the largest trial (its workers' CPUs,
    GPUs and custom resources, each trial's own) as the cluster's resources hold, at least one."""
    if max_concurrent:
        return max_concurrent
    from ..engine.preflight.resources import worker_bundle

    largest: dict[str, float] = {}
    for cfg in trials:
        for name, amount in worker_bundle(cfg).items():
            largest[name] = max(largest.get(name, 0.0), amount * max(1, cfg.ray.max_workers))
    fits = [int(cluster.get(name, 0.0) // amount) for name, amount in largest.items() if amount > 0]
    return max(1, min(fits, default=1))


SWEEP_SERVER_LOG = "mlflow-server.log"  # beside the SQLite file: the sweep's own tracking server's output
# Set to log concurrent trials straight into SQLite, without the sweep's server (to measure what it loses).
DIRECT_SQLITE_ENV = "ATTENT_SWEEP_DIRECT_SQLITE"


AUTO = "auto"  # --resume=auto: carry the sweep on where its storage holds it, else start it


def run_sweep(
    path: str | Path, *, resume: bool | str = False, overrides: list[str] | None = None, name: str | None = None
):
    """Run (or, with ``resume``, finish) the sweep in ``path``: ``run_loaded_sweep`` of the file."""
    sweep = load_sweep(path, overrides, name=name)  # a bad file is refused before Ray is imported (seconds)
    return run_loaded_sweep(sweep, resume=resume)


def run_loaded_sweep(sweep: Sweep, *, resume: bool | str = False):
    """Run (or, with ``resume``, finish) a sweep: checks, Ray, the MLflow parent run, then Tune.

    Args:
        sweep: the sweep and its trials' experiments (``load_sweep``'s, or a rehearsal's stand-in).
        resume: continue the sweep Tune keeps under the base's storage path; ``"auto"``: continue it
            where it is there, else start it (a job's command, the same on its first try and its retries).

    Returns:
        Tune's results, one per trial.
    """
    base = sweep.base.resolved()
    trials = [(tid, cfg.resolved()) for tid, cfg in sweep.trials]
    from ..engine.preflight import check_experiment

    check_experiment(*(cfg for _, cfg in trials))  # store, resources, data: before Ray starts
    tune_path = sweep_location(base.ray.storage_path, sweep.spec.name)
    if resume == AUTO:
        from ray import tune

        resume = tune.Tuner.can_restore(tune_path)
    _check_resume(tune_path, sweep.spec.name, resume)
    from ..engine import tracking
    from ..engine.driver import ensure_ray
    from ..engine.preflight.cluster import check_cluster_resources
    from ..engine.preflight.nodes import check_shared_across_nodes

    ensure_ray(base)  # before the parent run: the cluster checks need Ray
    check_cluster_resources(*(cfg for _, cfg in trials), driver=TRIAL_DRIVER_RESOURCES)
    check_shared_across_nodes(base, *(cfg for _, cfg in trials))  # several nodes: one store and storage for all
    store = tracking.TrackingSession.of(base)  # the sweep driver's one client, for its parent run
    parent_id = _parent_run(store, base, sweep.spec.name, tune_path)  # creates the experiment, store-side
    ok = False
    try:
        start = time.perf_counter()
        import ray

        at_once = concurrency(sweep.spec.max_concurrent, [cfg for _, cfg in trials], ray.cluster_resources())
        with _trial_tracking(base, at_once) as tracking_uri:
            results = _tuner(sweep, trials, parent_id, tune_path, resume, at_once, tracking_uri).fit()
        failed = [r for r in results if r.error is not None]
        ok = not failed
        elapsed = time.perf_counter() - start
        store.client.log_metric(parent_id, "sweep_wallclock_s", elapsed)
        store.client.log_metric(parent_id, "trials_failed", len(failed))
        print(
            f"[attent] sweep {sweep.spec.name}: {len(results) - len(failed)}/{len(results)} trials finished "
            f"in {elapsed:.0f}s",
            flush=True,
        )
        return results
    finally:
        store.run(parent_id).finish(ok)


def _check_resume(tune_path: str, name: str, resume: bool) -> None:
    from ray import tune

    if resume and not tune.Tuner.can_restore(tune_path):
        raise ConfigError(f"nothing to resume at {tune_path}: run the sweep without --resume first")
    if not resume and _exists(tune_path):
        raise ConfigError(
            f"{tune_path} already holds sweep {name!r}: pass --resume to continue it, or rename the sweep"
        )


@contextlib.contextmanager
def _trial_tracking(base: ExperimentConfig, concurrency: int) -> Iterator[str | None]:
    """Concurrent trials on a SQLite store log through a tracking server started here over that
    file, for the sweep's duration: SQLite refuses a writer while another holds its lock
    ("database is locked", which loses that write), the server's client retries (README,
    benchmarks/results/tracking_load/tracking_load.md). Yields its URL; None when no server is needed."""
    from ..server import app as server

    uri = base.mlflow.tracking_uri
    direct = os.environ.get(DIRECT_SQLITE_ENV, "").strip().lower() in ("1", "true", "yes")
    if concurrency <= 1 or not uri.startswith("sqlite:") or direct:
        yield None
        return
    database = sqlite_file(uri)  # on one node: preflight.nodes refused SQLite on several
    spec = server.ServerSpec(
        uri, str(database.parent / DEFAULT_ARTIFACTS), port=server.free_port(), workers=1
    )  # one process on the sweep's machine: its threads serve the trials
    log = database.parent / SWEEP_SERVER_LOG
    print(
        f"[attent] {concurrency} concurrent trials on SQLite: they log through a tracking server on "
        f"{spec.url} over {database} (log {log}); `attent server` serves several sweeps",
        flush=True,
    )
    with server.serving(spec, log) as url:
        yield url


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
    from ray.tune.execution.placement_groups import resource_dict_to_pg_factory

    # each trial's own resources (a grid over ray.num_workers or ray.cpus_per_worker changes them)
    resources = {tid: trial_resources(cfg) for tid, cfg in trials}
    groups = {tid: resource_dict_to_pg_factory(bundle) for tid, bundle in resources.items()}
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, tracking_uri=tracking_uri), lambda config: groups[config["trial"]["id"]]
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
        # reuse_actors: a trial's process trains the next trial that asks the same resources (Tune
        # keeps its idle processes by request), so each pays its imports (torch, timm, MLflow) once
        tune_config=tune.TuneConfig(
            max_concurrent_trials=concurrency,
            reuse_actors=True,
            trial_dirname_creator=lambda t: t.config["trial"]["id"],
            trial_name_creator=lambda t: t.config["trial"]["id"],
        ),
        run_config=tune.RunConfig(name=sweep.spec.name, storage_path=tune_path.rsplit("/", 1)[0], verbose=1),
    )


def _parent_run(store: TrackingSession, base: ExperimentConfig, name: str, key: str) -> str:
    """The sweep's MLflow parent run: reopened on --resume, created otherwise. ``store``: the
    sweep driver's ``TrackingSession`` of ``base``'s store and experiment."""
    from ..engine import tracking

    client, experiment_id = store.client, store.open_experiment()
    store.close_runs_of_dead_drivers()
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
