"""The benchmark runner: the selection stage (each workload's choices, on validation), then every
verdict run, strictly one after another, each through the engine as ``attent train`` runs it and
recorded as an MLflow child of the benchmark's parent run; then the report.

Two executors, one runner, the same MLflow runs:

* ``ray`` (the default): every run a Ray Train run with the spec's workers, in one Ray session
  (the local Ray the engine starts, or the cluster at ``ray.address`` / $RAY_ADDRESS);
* ``local``: every run in this process on one device, Ray Train's local mode
  (``ray.num_workers=0``, and ``ray.use_gpu`` when a CUDA device is visible): no Ray cluster is
  started. On a bare GPU node the store is a SQLite file (``sqlite:///mlflow.db`` where the command
  runs, or $MLFLOW_TRACKING_URI), which ``attent report --tracking-uri`` reads wherever it is copied.

A finished run is kept, so running the command again continues where it stopped (the choices are
made again from the same finished candidates). A run that is the same computation as a run already
made in its stage for its workload and seed (full data at equal cost landing on the equal-samples
epochs; the chosen learning rate's run among the next choice's epochs) is not trained twice: the
earlier run's metrics are recorded into its own MLflow run, tagged ``attent.same_run_as`` with the
earlier run's id. ``budget_s``: a seed starts only when it would end within the budget (seconds
since the command started, plus the longest seed of its workload so far); running the command
again goes on from there.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import contract
from ..contract import base_method
from ..experiment.schema import ExperimentConfig
from .calibration import (
    calibrate_equal_cost,
    calibrate_infobatch,
    choice_record,
    choose,
    computation,
    validation_finals,
)
from .spec import (
    CALIBRATED_FROM,
    EQUAL_COST_ARMS,
    BenchmarkRun,
    BenchmarkSpec,
    describe,
    load_benchmark,
    selection_runs,
)

if TYPE_CHECKING:
    from ..engine.tracking import TrackingSession

EXECUTORS = ("ray", "local")


def executor_overrides(executor: str, overrides: list[str] | None) -> list[str]:
    """The command line's overrides and the executor's, which win: ``local`` trains in this
    process (``ray.num_workers=0``) on the GPU if one is visible, unless ``ray.use_gpu`` is given."""
    overrides = list(overrides or [])
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}: one of {', '.join(EXECUTORS)}")
    if executor == "ray":
        return overrides
    if not any(o.split("=", 1)[0].strip() == "ray.use_gpu" for o in overrides):
        import torch

        overrides.append(f"ray.use_gpu={str(torch.cuda.is_available()).lower()}")
    return [*overrides, "ray.num_workers=0"]


class SeedBudget:
    """Whether a seed may start: only when the seconds since the command started plus the longest
    seed of its workload so far (the wall-clock of its verdict runs, those kept from an earlier
    command included; a run recorded from another took none) stay within ``budget_s``."""

    def __init__(self, budget_s: float = float("inf")):
        self.budget_s, self.started = budget_s, time.perf_counter()
        self.seconds: dict[tuple[str, int], float] = {}

    def add(self, run: BenchmarkRun, seconds: float) -> None:
        if run.stage == contract.BENCH_STAGE_VERDICT:
            key = (run.workload.name, run.experiment.seed)
            self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def refusal(self, workload: str, seed: int) -> str | None:
        """Why ``seed`` of ``workload`` may not start now, or None."""
        longest = max((s for (w, _), s in self.seconds.items() if w == workload), default=0.0)
        spent = time.perf_counter() - self.started
        if spent + longest <= self.budget_s:
            return None
        return (
            f"seed {seed} of {workload} would end past the budget of {self.budget_s:.0f} s ({spent:.0f} s "
            f"spent, the longest seed took {longest:.0f} s)"
        )


class Session:
    """One command's runs: each trained, kept (finished earlier) or recorded from the same
    computation, as a child of ``parent``, all through ``tracking``, the command's one tracking
    session (the benchmark's store and experiment, which every run of it logs into)."""

    def __init__(self, parent: str, console, budget: SeedBudget, tracking: TrackingSession):
        self.parent, self.console, self.budget, self.tracking = parent, console, budget, tracking
        self.made: list[tuple[BenchmarkRun, ExperimentConfig]] = []  # runs done, with their final configuration

    def train(self, run: BenchmarkRun, counter: str, runs: list[BenchmarkRun]) -> None:
        """``run``, unless it finished earlier; a calibrated arm is calibrated first from the
        runs of its seed; the same computation as an earlier run is recorded, not trained."""
        done = self.latest_run(run.experiment)
        if done is not None and done.info.status == contract.STATUS_FINISHED:
            print(f"[bench] {counter} {run.experiment.name}: finished earlier, kept", flush=True)
            self.made.append((run, calibrated(run, runs, quiet=True)))
            if contract.TAG_SAME_RUN_AS not in done.data.tags:
                self.budget.add(run, done.data.metrics.get(contract.TIME_WALLCLOCK, 0.0))
            return
        cfg = calibrated(run, runs)
        tags = {
            contract.TAG_BENCH_WORKLOAD: run.workload.name,
            contract.TAG_BENCH_METHOD: run.arm,
            contract.TAG_BENCH_METRIC: run.workload.metric,
            contract.TAG_BENCH_STAGE: run.stage,
            # the experiment names the benchmark: the run, what tells it apart
            contract.TAG_RUN_NAME: f"{run.arm if run.candidate is None else f'select {run.arm}'} "
            f"s{cfg.seed} {run.workload.name}",
        }
        earlier = None if done is not None else self.same_computation(run, cfg)  # an unfinished run trains on
        if earlier is not None:
            same, source = earlier
            print(
                f"[bench] {counter} {cfg.name}: the same computation as {same.arm} "
                f"(run {source.info.run_id}), recorded again, not trained",
                flush=True,
            )
            record_same_run(cfg, source, self.parent, tags, self.tracking)
            self.made.append((run, cfg))
            return
        print(f"[bench] {counter} {cfg.name}", flush=True)
        from ..engine.driver import run_pipeline

        started = time.perf_counter()
        run_pipeline(
            cfg,
            self.tracking,
            parent_run_id=self.parent,
            role=contract.ROLE_TRIAL,
            extra_tags=tags,
            **({"console": self.console} if self.console is not None else {}),
        )
        self.budget.add(run, time.perf_counter() - started)
        self.made.append((run, cfg))

    def latest_run(self, cfg: ExperimentConfig):
        """The newest MLflow run of ``cfg`` (``engine.tracking.latest_run``), through the session."""
        from ..engine.tracking import latest_run

        return latest_run(cfg, self.tracking)

    def same_computation(self, run: BenchmarkRun, cfg: ExperimentConfig):
        """(the earlier run, its finished MLflow run) of this stage, workload and seed that computes
        what ``cfg`` computes, or None."""
        mine = computation(cfg)
        for earlier, earlier_cfg in self.made:
            if (earlier.stage, earlier.workload.name) == (run.stage, run.workload.name) and computation(
                earlier_cfg
            ) == mine:
                found = self.latest_run(earlier_cfg)
                if found is not None and found.info.status == contract.STATUS_FINISHED:
                    return earlier, found
        return None


def calibrated(run: BenchmarkRun, runs: list[BenchmarkRun], quiet: bool = False) -> ExperimentConfig:
    """The run's configuration, calibrated from the finished runs of its seed where its arm is."""
    cfg, arm = run.experiment, base_method(run.arm)

    def same_seed(name: str) -> ExperimentConfig:
        return next(
            r.experiment for r in runs if r.workload is run.workload and r.arm == name and r.experiment.seed == cfg.seed
        )

    if arm == contract.METHOD_INFOBATCH_BUDGET:
        cfg = calibrate_infobatch(run, same_seed("infobatch"), run.attent_budget)
        said = f"InfoBatch prune {cfg.selection.infobatch_prune:g} for AtteNT's budget {run.attent_budget:.3f}"
    elif arm in EQUAL_COST_ARMS:
        reference, attent = CALIBRATED_FROM[arm]
        cfg = calibrate_equal_cost(run, same_seed(reference), same_seed(attent))
        what = "full data" if reference == contract.METHOD_FULL else "Random"
        said = f"{cfg.train.epochs} epochs of {what} for AtteNT's measured method cost"
    else:
        return cfg
    if not quiet:
        print(f"[bench] {cfg.name}: {said}", flush=True)
    return cfg


def record_same_run(
    cfg: ExperimentConfig, source, parent: str, tags: dict[str, str], tracking: TrackingSession | None = None
) -> str:
    """A new MLflow run of ``cfg`` (its name, parameters and configuration) holding every metric
    history of ``source``, the finished run of the same computation, and tagged with its id."""
    from mlflow.entities import Metric

    from ..engine.tracking import TrackingSession

    tracking = TrackingSession.serving(tracking, cfg)
    client = tracking.client
    run_id, _ = tracking.start_or_resume_run(
        cfg,
        role=contract.ROLE_TRIAL,
        parent_run_id=parent,
        extra_tags={**tags, contract.TAG_SAME_RUN_AS: source.info.run_id},
    )
    ok = False
    try:
        points = [
            Metric(m.key, m.value, m.timestamp, m.step)
            for key in source.data.metrics
            for m in client.get_metric_history(source.info.run_id, key)
        ]
        for start in range(0, len(points), 1000):  # MLflow takes at most 1,000 metrics per batch
            client.log_batch(run_id, metrics=points[start : start + 1000])
        ok = True
    finally:
        tracking.run(run_id).finish(ok)
    return run_id


def run_benchmark(
    path: str | Path,
    overrides: list[str] | None = None,
    *,
    out_dir: str | Path = "reports",
    name: str | None = None,
    console=None,
    workloads: list[str] | None = None,
    executor: str = "ray",
    budget_s: float = float("inf"),
) -> Path | None:
    """The selection stage, then every verdict run, one at a time, then the report; returns the
    report folder, or None when ``budget_s`` stopped it (or the report's libraries are missing
    here). ``console``: the driver's (``engine.progress.Console``; default: everything Ray prints).
    ``workloads``: only these (a long workload run on its own; the reports then cover the
    workloads the store holds). ``executor``: ``ray`` or ``local`` (the module's docstring)."""
    overrides = executor_overrides(executor, overrides)
    spec, runs = load_benchmark(path, overrides, name=name, workloads=workloads)
    candidates = [
        run
        for workload in spec.workloads
        for tune in workload.tune
        for run in selection_runs(path, workload, tune, [], overrides, name=name)
    ]
    from ..engine.preflight import check_experiment

    experiments = [run.experiment for run in resolved(candidates + runs)]
    check_experiment(*experiments)  # every refusal before any run starts
    if executor == "ray":  # before the parent run: the cluster checks need Ray
        from ..engine.driver import ensure_ray
        from ..engine.preflight.nodes import check_shared_across_nodes

        ensure_ray(experiments[0])
        check_shared_across_nodes(*experiments)  # several nodes: one store and storage for every run
    uri = resolved(runs[:1])[0].experiment.mlflow.tracking_uri
    from ..engine.tracking import TrackingSession

    tracking = TrackingSession(uri, spec.name)  # the command's one: its runs are the experiment's
    parent = _parent_run(spec, tracking)
    session = Session(parent, console, SeedBudget(budget_s), tracking)
    try:
        stopped = run_workloads(path, spec, overrides, name, workloads, session)
    except BaseException:  # the parent says so; running the command again continues
        tracking.client.set_terminated(parent, "FAILED")
        raise
    how = f"attent report --experiment {spec.name} --tracking-uri {uri}"
    if stopped:
        tracking.client.set_terminated(parent, contract.STATUS_KILLED)
        print(f"[bench] {stopped}: not started. Run the command again to go on; the report: {how}", flush=True)
        return None
    return write_report(spec, uri, out_dir, how)


def run_workloads(
    path, spec: BenchmarkSpec, overrides: list[str], name: str | None, workloads: list[str] | None, session: Session
) -> str | None:
    """Each workload's selection stage, then its verdict runs, a seed at a time while the budget
    allows; returns why the budget refused a seed, or None when every run is done."""
    choices: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    for workload in spec.workloads:  # each one's verdict is in before the next one's selection starts
        choices[workload.name] = select(path, workload, overrides, name, session, records)
        _, runs = load_benchmark(path, overrides, name=name, choices=choices, workloads=workloads)
        runs = resolved([run for run in runs if run.workload.name == workload.name])
        print(describe(spec, runs, chosen=True), flush=True)
        for number, run in enumerate(runs, 1):
            if number == 1 or runs[number - 2].experiment.seed != run.experiment.seed:
                stopped = session.budget.refusal(workload.name, run.experiment.seed)
                if stopped:
                    return stopped
            session.train(run, f"{workload.name} {number}/{len(runs)}", runs)
    return None


def write_report(spec: BenchmarkSpec, uri: str, out_dir: str | Path, how: str) -> Path | None:
    """The benchmark's report from the store at ``uri``, into ``out_dir``; returns its folder, or
    None when the report's libraries are missing here (``how`` says how to make it elsewhere)."""
    try:
        # the report `attent report` rebuilds, by the same rules
        from attent.analysis.time_to_accuracy.report import benchmark_report
    except ModuleNotFoundError as missing:  # a bare GPU node: the store travels, the report is made elsewhere
        if (missing.name or "attent").split(".")[0] == "attent":
            raise
        print(f"[bench] every run is in {uri}; the report needs {missing.name}, not installed here: {how}", flush=True)
        return None
    out, _ = benchmark_report(spec.name, uri, out_dir, spec=spec.model_dump(mode="json"))
    return out


def resolved(runs: list[BenchmarkRun]) -> list[BenchmarkRun]:
    return [r.model_copy(update={"experiment": r.experiment.resolved()}) for r in runs]


def select(
    path, workload, overrides: list[str], name: str | None, session: Session, records: list[dict[str, Any]]
) -> list:
    """The workload's selection stage: each choice in turn, its candidates trained on the
    selection seeds and judged on validation, added to ``records`` (every workload's so far) and
    recorded on the parent run; returns the workload's choices."""
    chosen = []
    for tune in workload.tune:
        tried = resolved(selection_runs(path, workload, tune, chosen, overrides, name=name))
        print(
            f"[bench] {workload.name}: choosing {tune.key} among {tune.values} by {tune.arm}'s "
            f"{workload.selection_metric()} ({len(tried)} runs)",
            flush=True,
        )
        for number, run in enumerate(tried, 1):
            session.train(run, f"select {number}/{len(tried)}", tried)
        value, scores = choose(
            tune,
            validation_finals(tried, workload.selection_metric()),
            contract.lower_is_better(workload.selection_metric()),
        )
        chosen.append((tune, value))
        records.append(choice_record(workload, tune, value, scores, seeds=[r.experiment.seed for r in tried]))
        print(
            f"[bench] {workload.name}: {tune.key} = {value} chosen on validation "
            f"({', '.join(f'{k}: {v:.4f}' for k, v in scores.items())})"
            + ("; it is an end of the candidates: a value beyond it may do better" if records[-1]["at_edge"] else ""),
            flush=True,
        )
        session.tracking.client.log_dict(session.parent, records, contract.BENCH_CHOICES_FILE)
    return chosen


def _parent_run(spec: BenchmarkSpec, tracking: TrackingSession) -> str:
    """The benchmark's MLflow parent run (reused when the command runs again)."""
    from ..engine.tracking import driver_tags, reopen_run

    client, experiment_id = tracking.client, tracking.open_experiment()
    tracking.close_runs_of_dead_drivers()
    found = client.search_runs(
        [experiment_id],
        f"tags.`{contract.TAG_ROLE}` = '{contract.ROLE_BENCHMARK}'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    if found:
        reopen_run(client, found[0].info.run_id)
        return found[0].info.run_id
    run = client.create_run(
        experiment_id, run_name=spec.name, tags={contract.TAG_ROLE: contract.ROLE_BENCHMARK, **driver_tags()}
    )
    client.log_dict(run.info.run_id, spec.model_dump(mode="json"), contract.BENCH_SPEC_FILE)
    return run.info.run_id
