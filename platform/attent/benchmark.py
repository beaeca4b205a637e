"""Time-to-accuracy benchmark: every method on every workload, over seeds, one run at a time.

    benchmark:
      name: tta-small                        # MLflow experiment and parent run
      seeds: [0, 1, 2]
      threads: 1                             # torch threads per worker (Ray's CPUs per worker)
      workloads:
        - name: fmnist-vit
          base: ../experiments/fashion_mnist_vit.yaml     # relative to this file
          variant: vit                       # AtteNT's preset for the workload (vit | llm)
          overrides: {train.epochs: 12}      # on the base, for every method
          metric: eval_test_accuracy         # the per-epoch curve time-to-accuracy reads
          methods: {full: {}, attent: {}, random: {}, infobatch: {}}  # name -> extra overrides

Methods are named; ``METHODS`` says what each means on top of the workload's AtteNT variant, so
budgeted baselines share AtteNT's ratio and interval schedules (matched budgets). Runs go
through the same engine as ``attent train`` (a Ray Train run each, downstream jobs included),
strictly one after another in one Ray session, as MLflow children of the benchmark's parent run.
A finished run is not trained again: re-running the command after an interruption continues.
``analysis.time_to_accuracy`` then builds the report from MLflow alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from . import contract
from .config import (ConfigError, ExperimentConfig, build_experiment, load_section, nest_keys,
                     parse_overrides, read_yaml)
from .selection.config import deep_merge

_ATTENT = {"selection.preset": "{variant}"}
# What each method means, as overrides on the workload's experiment ("{variant}": its preset).
METHODS: dict[str, dict[str, Any]] = {
    contract.METHOD_FULL: {"selection.preset": None, "selection.method": "full"},
    contract.METHOD_ATTENT: _ATTENT,                                # the paper's variant as is
    "hard": {**_ATTENT, "selection.strategy": "hard"},              # same schedules, top-k
    "soft": {**_ATTENT, "selection.strategy": "soft"},              # same schedules, Gumbel-top-k
    "random": {**_ATTENT, "selection.strategy": "random"},          # same budget, uniform subsets
    "infobatch": {"selection.preset": None, "selection.method": "infobatch"},  # its paper defaults, its own budget
    # full data for round(AtteNT's mean planned ratio x E) epochs, its lr schedule over those epochs
    contract.METHOD_FULL_EQUAL_COST: {"selection.preset": None, "selection.method": "full"},
    # InfoBatch with the prune ratio that brings its mean kept ratio to AtteNT's budget, calibrated
    # at run time from the same seed's `infobatch` run (which must be in the workload)
    contract.METHOD_INFOBATCH_BUDGET: {"selection.preset": None, "selection.method": "infobatch"},
    "class_weight": {**_ATTENT, "selection.method": "class_weight"},
    "group_weight": {**_ATTENT, "selection.method": "group_weight"},  # needs selection.group_weights
    "gradnorm": {**_ATTENT, "selection.method": "gradnorm"},
}


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[A-Za-z0-9_\-]+$")
    base: str                                   # experiment YAML, relative to the benchmark file
    variant: str = "vit"                        # AtteNT's preset for this workload: vit | llm
    overrides: dict[str, Any] = {}              # key.path -> value, for every method
    metric: str = Field(..., pattern=r"^eval_")  # per-epoch curve metric (logged every epoch)
    seeds: Optional[list[int]] = Field(None, min_length=1)  # this workload's seeds; None: the benchmark's
    # method name -> extra overrides; a name is a key of METHODS, or one with a "+suffix" for a
    # variant of it (e.g. attent+stale: {selection.rescore_stale: true})
    methods: dict[str, dict[str, Any]]


class BenchmarkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.\-]+$")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    threads: int = Field(1, ge=1)               # torch threads per Ray worker, fixed for every run
    workloads: list[WorkloadSpec] = Field(..., min_length=1)


class BenchmarkRun(BaseModel):
    """One run of the benchmark: a workload, a method, a seed."""
    model_config = ConfigDict(arbitrary_types_allowed=True)
    workload: WorkloadSpec
    method: str
    experiment: ExperimentConfig
    attent_budget: float                        # AtteNT's planned mean selected ratio on the workload


def load_benchmark(path: str | Path, overrides: list[str] | None = None, *,
                   name: str | None = None) -> tuple[BenchmarkSpec, list[BenchmarkRun]]:
    """The spec in ``path`` and its runs in execution order (workload, seed, method: a seed's
    methods run back to back, so slow drifts of the machine hit them alike). ``overrides``
    (key.path=value) apply to every run; ``name`` renames the benchmark (a fresh one)."""
    path = Path(path)
    spec = load_section(path, "benchmark", BenchmarkSpec, name=name)
    cli = parse_overrides(overrides or [])
    runs = []
    for workload in spec.workloads:
        unknown = sorted(m for m in workload.methods if base_method(m) not in METHODS)
        if unknown:
            raise ConfigError(f"{path}: workload {workload.name!r}: unknown method(s) {unknown}; "
                              f"choose from {', '.join(METHODS)}")
        methods = {base_method(m) for m in workload.methods}
        if contract.METHOD_INFOBATCH_BUDGET in methods and "infobatch" not in workload.methods:
            raise ConfigError(f"{path}: workload {workload.name!r}: {contract.METHOD_INFOBATCH_BUDGET} is "
                              "calibrated from the `infobatch` run of the same seed: add `infobatch: {}`")
        base = read_yaml((path.parent / workload.base).resolve())
        # a seed's methods in the file's order, calibrated ones after the runs they read
        order = sorted(workload.methods, key=lambda m: base_method(m) == contract.METHOD_INFOBATCH_BUDGET)
        for seed in workload.seeds or spec.seeds:
            for method in order:
                source = f"{path} {workload.name}/{method}"
                runs.append(BenchmarkRun(
                    workload=workload, method=method,
                    experiment=_experiment(spec, workload, method, workload.methods[method], seed, base, cli, source),
                    attent_budget=attent_budget(spec, workload, seed, base, cli, source)))
    return spec, runs


def _experiment(spec: BenchmarkSpec, workload: WorkloadSpec, method: str, extra: dict[str, Any], seed: int,
                base: dict[str, Any], cli: dict[str, Any], source: str) -> ExperimentConfig:
    meaning = {k: (v.format(variant=workload.variant) if isinstance(v, str) else v)
               for k, v in METHODS[base_method(method)].items()}
    fixed = {"ray.cpus_per_worker": spec.threads, "mlflow.experiment": spec.name,
             "name": f"{spec.name}-{workload.name}-{method.replace('+', '-')}-s{seed}", "seed": seed}
    data = base
    for layer in (workload.overrides, meaning, extra, fixed):
        data = deep_merge(data, nest_keys(layer))
    data = deep_merge(data, cli)
    if base_method(method) == contract.METHOD_FULL_EQUAL_COST:
        attent = _experiment(spec, workload, contract.METHOD_ATTENT, workload.methods.get(contract.METHOD_ATTENT, {}),
                             seed, base, cli, source)
        epochs = attent.selection.mean_planned_ratio(attent.train.epochs) * attent.train.epochs
        data = deep_merge(data, {"train": {"epochs": max(1, round(epochs))}})
    return build_experiment(data, source)


def attent_budget(spec: BenchmarkSpec, workload: WorkloadSpec, seed: int, base: dict[str, Any],
                  cli: dict[str, Any], source: str) -> float:
    """AtteNT's planned budget on the workload: its mean selected ratio over the epochs (with the
    workload's `attent` overrides when it lists the method)."""
    attent = _experiment(spec, workload, contract.METHOD_ATTENT, workload.methods.get(contract.METHOD_ATTENT, {}),
                         seed, base, cli, source)
    return attent.selection.mean_planned_ratio(attent.train.epochs)


def calibrate_infobatch(run: BenchmarkRun, reference: ExperimentConfig, budget: float) -> ExperimentConfig:
    """The run with the prune ratio that brings InfoBatch to ``budget``, from the kept ratios of
    ``reference`` (the same seed's InfoBatch run at its defaults, finished)."""
    from .engine.tracking import client_for, latest_run
    from .selection.baselines import infobatch_prune_for_budget
    done = latest_run(reference)
    if done is None or done.info.status != "FINISHED":
        raise ConfigError(f"{run.experiment.name}: the InfoBatch run it calibrates from ({reference.name}) did not finish")
    history = client_for(reference.mlflow.tracking_uri).get_metric_history(done.info.run_id, contract.SELECTED_RATIO)
    kept = [m.value for m in sorted(history, key=lambda m: m.step)]
    sel = reference.selection
    prune = infobatch_prune_for_budget(budget, kept, sel.infobatch_prune, reference.train.epochs, sel.infobatch_final)
    cfg = run.experiment
    return cfg.model_copy(update={"selection": cfg.selection.model_copy(update={"infobatch_prune": round(prune, 4)})})


def base_method(name: str) -> str:
    """``attent+stale`` -> ``attent``: a named variant of a method."""
    return name.split("+", 1)[0]


def describe(spec: BenchmarkSpec, runs: list[BenchmarkRun]) -> str:
    lines = [f"benchmark {spec.name!r}: {len(runs)} runs, seeds {spec.seeds} unless a workload says, "
             f"{spec.threads} thread(s) per worker, one run at a time"]
    for run in runs:
        cfg = run.experiment
        lines.append(f"  {run.workload.name:<12} {run.method:<12} seed {cfg.seed}: {cfg.train.epochs} epochs, "
                     f"{cfg.selection.label(cfg.train.epochs)}"
                     + (f", downstream {[job.name for job in cfg.downstream]}" if cfg.downstream else ""))
    return "\n".join(lines)


def run_benchmark(path: str | Path, overrides: list[str] | None = None, *, out_dir: str | Path = "reports",
                  name: str | None = None, console=None) -> Path:
    """Every run of the benchmark, one at a time, then its report; returns the report folder.
    ``console``: the driver's (``engine.progress.Console``; default: everything Ray prints)."""
    spec, runs = load_benchmark(path, overrides, name=name)
    runs = [r.model_copy(update={"experiment": r.experiment.resolved()}) for r in runs]
    from .engine.preflight import check_experiment
    check_experiment(*[run.experiment for run in runs])  # every refusal before any worker starts
    print(describe(spec, runs), flush=True)

    from .engine.driver import run_pipeline
    from .engine.tracking import latest_run
    uri = runs[0].experiment.mlflow.tracking_uri
    parent = _parent_run(spec, uri)
    try:
        for number, run in enumerate(runs, 1):
            cfg = run.experiment
            done = latest_run(cfg)
            if done is not None and done.info.status == "FINISHED":
                print(f"[bench] {number}/{len(runs)} {cfg.name}: finished earlier, kept", flush=True)
                continue
            if base_method(run.method) == contract.METHOD_INFOBATCH_BUDGET:
                reference = next(r.experiment for r in runs if r.workload is run.workload
                                 and r.method == "infobatch" and r.experiment.seed == cfg.seed)
                cfg = calibrate_infobatch(run, reference, run.attent_budget)
                print(f"[bench] {cfg.name}: InfoBatch prune {cfg.selection.infobatch_prune:g} "
                      f"for AtteNT's budget {run.attent_budget:.3f}", flush=True)
            print(f"[bench] {number}/{len(runs)} {cfg.name}", flush=True)
            run_pipeline(cfg, parent_run_id=parent, role=contract.ROLE_TRIAL,
                         extra_tags={contract.TAG_BENCH_WORKLOAD: run.workload.name,
                                     contract.TAG_BENCH_METHOD: run.method,
                                     contract.TAG_BENCH_METRIC: run.workload.metric,
                                     # the experiment names the benchmark: the run, what tells it apart
                                     contract.TAG_RUN_NAME: f"{run.method} s{cfg.seed} {run.workload.name}"},
                         **({"console": console} if console is not None else {}))
    except BaseException:  # the parent says so; running the command again continues
        from .engine.tracking import client_for
        client_for(uri).set_terminated(parent, "FAILED")
        raise
    from analysis.time_to_accuracy import build_time_to_accuracy_report
    return build_time_to_accuracy_report(spec.name, tracking_uri=uri, out_dir=Path(out_dir) / spec.name)


def _parent_run(spec: BenchmarkSpec, tracking_uri: str) -> str:
    """The benchmark's MLflow parent run (reused when the command runs again)."""
    from .engine.tracking import client_for, driver_tags, open_experiment, reopen_run
    client = client_for(tracking_uri)
    experiment_id = open_experiment(client, spec.name, tracking_uri)
    found = client.search_runs([experiment_id], f"tags.`{contract.TAG_ROLE}` = '{contract.ROLE_BENCHMARK}'",
                               max_results=1, order_by=["attributes.start_time DESC"])
    if found:
        reopen_run(client, found[0].info.run_id)
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=spec.name,
                            tags={contract.TAG_ROLE: contract.ROLE_BENCHMARK, **driver_tags()})
    client.log_dict(run.info.run_id, spec.model_dump(mode="json"), "benchmark.json")
    return run.info.run_id
