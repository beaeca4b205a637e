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
from typing import Any

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
    "infobatch": {"selection.preset": None, "selection.method": "infobatch"},  # its own budget
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
        base = read_yaml((path.parent / workload.base).resolve())
        for seed in spec.seeds:
            for method, extra in workload.methods.items():
                runs.append(BenchmarkRun(workload=workload, method=method, experiment=_experiment(
                    spec, workload, method, extra, seed, base, cli, source=f"{path} {workload.name}/{method}")))
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
    return build_experiment(deep_merge(data, cli), source)


def base_method(name: str) -> str:
    """``attent+stale`` -> ``attent``: a named variant of a method."""
    return name.split("+", 1)[0]


def describe(spec: BenchmarkSpec, runs: list[BenchmarkRun]) -> str:
    lines = [f"benchmark {spec.name!r}: {len(runs)} runs, {len(spec.seeds)} seed(s), "
             f"{spec.threads} thread(s) per worker, one run at a time"]
    for run in runs:
        cfg = run.experiment
        lines.append(f"  {run.workload.name:<12} {run.method:<12} seed {cfg.seed}: {cfg.train.epochs} epochs, "
                     f"{cfg.selection.label(cfg.train.epochs)}"
                     + (f", downstream {[job.name for job in cfg.downstream]}" if cfg.downstream else ""))
    return "\n".join(lines)


def run_benchmark(path: str | Path, overrides: list[str] | None = None, *, out_dir: str | Path = "reports",
                  name: str | None = None) -> Path:
    """Every run of the benchmark, one at a time, then its report; returns the report folder."""
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
            print(f"[bench] {number}/{len(runs)} {cfg.name}", flush=True)
            run_pipeline(cfg, parent_run_id=parent, role=contract.ROLE_TRIAL,
                         extra_tags={contract.TAG_BENCH_WORKLOAD: run.workload.name,
                                     contract.TAG_BENCH_METHOD: run.method,
                                     contract.TAG_BENCH_METRIC: run.workload.metric})
    except BaseException:  # the parent says so; running the command again continues
        from .engine.tracking import client_for
        client_for(uri).set_terminated(parent, "FAILED")
        raise
    from analysis.time_to_accuracy import build_time_to_accuracy_report
    return build_time_to_accuracy_report(spec.name, tracking_uri=uri, out_dir=Path(out_dir) / spec.name)


def _parent_run(spec: BenchmarkSpec, tracking_uri: str) -> str:
    """The benchmark's MLflow parent run (reused when the command runs again)."""
    from .engine.tracking import client_for, ensure_experiment
    client = client_for(tracking_uri)
    experiment_id = ensure_experiment(client, spec.name, tracking_uri)
    found = client.search_runs([experiment_id], f"tags.`{contract.TAG_ROLE}` = '{contract.ROLE_BENCHMARK}'",
                               max_results=1, order_by=["attributes.start_time DESC"])
    if found:
        client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=spec.name, tags={contract.TAG_ROLE: contract.ROLE_BENCHMARK})
    client.log_dict(run.info.run_id, spec.model_dump(mode="json"), "benchmark.json")
    return run.info.run_id
