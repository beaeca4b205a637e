"""``attent rehearse``: each file's stand-in (``standin``) run end to end where the file would run, its
unreachable parts named first, one line each, before any worker starts.

    attent rehearse experiments/multimae_gpu.yaml experiments/sweeps/milestone_llama2_metamath_gpu.yaml
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..experiment.files import load_experiment
from ..experiment.schema import ExperimentConfig, PreflightError
from ..sweep.spec import Sweep, is_sweep_file, load_sweep
from . import standin

MODELS_FOLDER = "attent-rehearsal-models"  # under the storage path: stand-in weights every node reads


@dataclass
class Rehearsal:
    """One file's rehearsal: its stand-in experiment, or its stand-in sweep."""

    path: str
    experiment: ExperimentConfig | None = None
    sweep: Sweep | None = None
    problems: list[str] = field(default_factory=list)  # what cannot be reached, a line each

    def experiments(self) -> list[ExperimentConfig]:
        return [self.experiment] if self.experiment else [cfg for _, cfg in self.sweep.trials]

    @property
    def name(self) -> str:
        return self.experiment.name if self.experiment else self.sweep.spec.name


def derive(
    path: str,
    overrides: list[str],
    *,
    use_gpu: bool,
    shared: tuple[tuple[str, ...], str | None],
    rehearsed: frozenset[Path] = frozenset(),
) -> Rehearsal:
    """The stand-in of the file at ``path`` (``overrides`` on the file first, then its paths under the
    cluster's shared roots moved to the folder standing for them, ``shared``). A sweep whose base file
    is among ``rehearsed`` (rehearsed whole by the same command) leaves the failure, the resume and
    the downstream jobs to that rehearsal."""
    roots, folder = shared
    if not is_sweep_file(path):
        cfg = standin.remap_experiment(load_experiment(path, overrides), roots, folder)
        return Rehearsal(path, experiment=standin.standin_experiment(cfg, use_gpu=use_gpu).resolved())
    sweep = load_sweep(path, overrides)
    trials = [(tid, standin.remap_experiment(cfg, roots, folder)) for tid, cfg in sweep.trials]
    sweep = sweep.model_copy(update={"base": standin.remap_experiment(sweep.base, roots, folder), "trials": trials})
    base_file = (Path(path).parent / sweep.spec.base).resolve()
    stand_in = standin.standin_sweep(sweep, use_gpu=use_gpu, whole_first=base_file not in rehearsed)
    resolved = [(tid, cfg.resolved()) for tid, cfg in stand_in.trials]
    return Rehearsal(path, sweep=stand_in.model_copy(update={"trials": resolved, "base": stand_in.base.resolved()}))


def reach(rehearsal: Rehearsal) -> Rehearsal:
    """``rehearsal`` with its tasks' stand-in models made and every problem named: the checks a run
    makes before Ray starts (``preflight.experiment_checks``: the tracking store, the data), then
    each model, each once. Nothing runs on a worker."""
    from ..engine.preflight import experiment_checks
    from ..tasks.registry import task_class

    cfgs, made = rehearsal.experiments(), {}

    def attempt(what: str, check, *args) -> Any:
        try:
            return check(*args)
        except Exception as exc:  # noqa: BLE001 -- every problem a line, then the next check
            line = f"{rehearsal.path}: {what}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            if line not in rehearsal.problems:
                rehearsal.problems.append(line)
            return None

    for what, check in experiment_checks(*cfgs):
        attempt(what, check)
    for index, cfg in enumerate(cfgs):
        key = cfg.task.model_dump_json()
        if key not in made:
            folder = Path(cfg.ray.storage_path) / MODELS_FOLDER
            made[key] = attempt("model", task_class(cfg.task.name).prepare_rehearsal, cfg.task, folder)
        if made[key]:
            cfgs[index] = cfg.model_copy(update={"task": cfg.task.model_copy(update=made[key])})
    if rehearsal.experiment:
        rehearsal.experiment = cfgs[0]
    else:
        trials = [(tid, cfg) for (tid, _), cfg in zip(rehearsal.sweep.trials, cfgs)]
        rehearsal.sweep = rehearsal.sweep.model_copy(update={"trials": trials})
    return rehearsal


def rehearse(paths: list[str], overrides: list[str], *, shared_folder: str | None, out: Path, console) -> int:
    """Rehearse each file: derive, reach, then run each end to end (training, the checkpoint and the
    resume, downstream jobs, evaluations, MLflow, a sweep's report).

    Args:
        paths: experiment or sweep files.
        overrides: ``key.path=value`` for each file (a sweep's: for its base).
        shared_folder: a folder standing for the cluster's shared storage (None: the cluster's own).
        out: where the sweeps' reports go.
        console: the CLI's progress line.

    Returns:
        0 when every file's rehearsal finished.

    Raises:
        PreflightError: a file's parts cannot be reached, each named on a line, before any worker.
    """
    from ..experiment.cluster_layout import SHARED

    shared = ((SHARED,), shared_folder)
    experiments = frozenset(Path(path).resolve() for path in paths if not is_sweep_file(path))
    rehearsals = [reach(derive(path, overrides, use_gpu=True, shared=shared, rehearsed=experiments)) for path in paths]
    problems = [line for r in rehearsals for line in r.problems]
    if problems:
        print("\n".join(problems), flush=True)
        raise PreflightError(
            f"{len(problems)} part(s) of {len({line.split(':')[0] for line in problems})} file(s) cannot be reached "
            "(listed above): nothing was run or recorded"
        )
    import ray

    from ..engine.driver import ensure_ray

    ensure_ray(rehearsals[0].experiments()[0])
    if not ray.cluster_resources().get("GPU"):  # the file's GPUs where the cluster has them, else its CPUs
        rehearsals = [_on_cpus(r) for r in rehearsals]
    for r in rehearsals:
        start = time.perf_counter()
        summary = _run(r, out, console)
        print(f"[attent] rehearsed {r.path} as {r.name} in {time.perf_counter() - start:.0f}s: {summary}", flush=True)
    return 0


def _on_cpus(rehearsal: Rehearsal) -> Rehearsal:
    """``rehearsal`` with every worker on CPUs, and a run's downstream jobs after its first in Ray Train's
    local mode: the first runs the downstream path on the run's workers, the others their own tasks and
    data without starting a worker group each (on a GPU cluster a job's process may have no GPU)."""

    def cpu(cfg: ExperimentConfig) -> ExperimentConfig:
        downstream = [job.model_copy(update={"num_workers": 0}) if i else job for i, job in enumerate(cfg.downstream)]
        return cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"use_gpu": False}), "downstream": downstream})

    if rehearsal.experiment:
        rehearsal.experiment = cpu(rehearsal.experiment)
    else:
        sweep = rehearsal.sweep
        trials = [(tid, cpu(cfg)) for tid, cfg in sweep.trials]
        rehearsal.sweep = sweep.model_copy(update={"trials": trials, "base": cpu(sweep.base)})
    return rehearsal


def _run(rehearsal: Rehearsal, out: Path, console) -> str:
    """One file's stand-in, run from a clean start (an earlier rehearsal's checkpoints removed)."""
    from ..engine.driver import run_pipeline
    from ..sweep.tune import run_loaded_sweep, sweep_location

    for cfg in rehearsal.experiments():
        _remove_local(f"{cfg.ray.storage_path.rstrip('/')}/{cfg.name}")
    if rehearsal.experiment:
        pipeline = run_pipeline(rehearsal.experiment, console=console)
        m = pipeline.training.metrics
        evals = ", ".join(f"{k[5:]} {v:.4g}" for k, v in sorted(m.items()) if k.startswith("eval_"))
        return f"MLflow run {pipeline.training.run_id}; {evals}; {len(pipeline.downstream)} downstream metric(s)"
    sweep = rehearsal.sweep
    _remove_local(sweep_location(sweep.base.ray.storage_path, sweep.spec.name))
    results = run_loaded_sweep(sweep)
    failed = [r for r in results if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(results)} trials of {sweep.spec.name} failed: {failed[0].error}")
    report = _report(sweep, out)
    return f"{len(results)} trials (every kind of setting the file makes, seed {sweep.spec.seeds[0]}); report {report}"


def _report(sweep: Sweep, out: Path) -> Path:
    """`attent report` of the sweep's experiment, as a user runs it after the full sweep."""
    import argparse

    from ..analysis import command as report

    args = argparse.Namespace(
        experiment=sweep.spec.name,
        out=str(out),
        tracking_uri=sweep.base.mlflow.tracking_uri,
        kinds=None,
        margin=None,
        no_log_to_parent=False,
        sources=[],
        size=[],
    )
    report.run(args)
    return out / sweep.spec.name


def _remove_local(location: str) -> None:
    """An earlier rehearsal's folder (only a rehearsal's: its name ends in the suffix's mark)."""
    if "://" not in location and standin.SUFFIX in Path(location).name:
        shutil.rmtree(location, ignore_errors=True)
