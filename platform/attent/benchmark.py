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
          metric: eval_test_accuracy         # the per-epoch curve time-to-accuracy reads (the verdict's)
          tune:                              # the selection stage, on validation, in this order
            - {method: full, key: train.epochs, values: [8, 16, 32]}            # E, for every method
            - {method: attent, key: selection.temperature, values: [1, 4, 16]}  # then AtteNT's T
          methods: {full: {}, full_long: {}, full_equal_cost: {}, attent: {}, random: {}}

Methods are named; ``METHODS`` says what each means on top of the workload's AtteNT variant, so
budgeted baselines share AtteNT's ratio and interval schedules (matched budgets).

Two stages. The **selection stage** makes every choice that is made by looking at results (a
knob's value per ``tune`` entry: full data's epoch count E, Soft's temperature): it trains the
candidates on the selection seeds and picks the best final value of the workload's validation
metric (``eval_val_*``: a split drawn from the training pool; no test metric is read), records
the choices on the parent run (``choices.json``) and freezes them. The **verdict stage** then
trains every method with the choices applied, and only its runs' test metric gives the verdict. Runs go
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
    # full data for 2E epochs, its lr schedule over them: the control that shows a plateau at E
    contract.METHOD_FULL_LONG: {"selection.preset": None, "selection.method": "full"},
    # full data for the epochs whose measured method cost matches the same seed's AtteNT run,
    # calibrated at run time from that run and full data's (both must be in the workload)
    contract.METHOD_FULL_EQUAL_COST: {"selection.preset": None, "selection.method": "full"},
    # full data for round(AtteNT's mean planned ratio x E) epochs: equal samples, not equal cost
    contract.METHOD_FULL_EQUAL_SAMPLES: {"selection.preset": None, "selection.method": "full"},
    # InfoBatch with the prune ratio that brings its mean kept ratio to AtteNT's budget, calibrated
    # at run time from the same seed's `infobatch` run (which must be in the workload)
    contract.METHOD_INFOBATCH_BUDGET: {"selection.preset": None, "selection.method": "infobatch"},
    "class_weight": {**_ATTENT, "selection.method": "class_weight"},
    "group_weight": {**_ATTENT, "selection.method": "group_weight"},  # needs selection.group_weights
    "gradnorm": {**_ATTENT, "selection.method": "gradnorm"},
}


class TuneSpec(BaseModel):
    """One choice of the selection stage: a knob's value, picked on validation."""
    model_config = ConfigDict(extra="forbid")
    key: str = Field(..., pattern=r"^[A-Za-z0-9_.]+$")  # the config key chosen, e.g. selection.temperature
    values: list[Any] = Field(..., min_length=2)  # the candidates, each trained on every selection seed
    method: str = contract.METHOD_ATTENT        # the method whose runs choose it (full for train.epochs)
    # the methods the choice is then applied to; None: `method` and its variants (train.epochs: all)
    applies_to: Optional[list[str]] = None

    def targets(self, method: str) -> bool:
        if self.applies_to is not None:
            return method in self.applies_to or base_method(method) in self.applies_to
        return self.key == "train.epochs" or base_method(method) == base_method(self.method)


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[A-Za-z0-9_\-]+$")
    base: str                                   # experiment YAML, relative to the benchmark file
    variant: str = "vit"                        # AtteNT's preset for this workload: vit | llm
    overrides: dict[str, Any] = {}              # key.path -> value, for every method
    metric: str = Field(..., pattern=r"^eval_")  # per-epoch curve metric (logged every epoch): the verdict's
    # the selection stage's metric, on the validation split; None: `metric` with eval_test_ -> eval_val_
    validation_metric: Optional[str] = Field(None, pattern=r"^eval_val_")
    tune: list[TuneSpec] = []                   # the selection stage's choices, made in this order
    # the target's tolerance below full data's final metric; None: the larger of 0.005 (1 % of a loss) and its seed std
    tolerance: Optional[float] = Field(None, gt=0)
    margin: Optional[float] = Field(None, gt=0)  # "equivalent within ± margin" (a paired TOST); None: the tolerance
    tune_seeds: Optional[list[int]] = Field(None, min_length=1)  # its seeds; None: the first verdict seed
    seeds: Optional[list[int]] = Field(None, min_length=1)  # this workload's seeds; None: the benchmark's
    # method name -> extra overrides; a name is a key of METHODS, or one with a "+suffix" for a
    # variant of it (e.g. attent+stale: {selection.rescore_stale: true})
    methods: dict[str, dict[str, Any]]

    def selection_metric(self) -> str:
        if self.validation_metric:
            return self.validation_metric
        if not self.metric.startswith(contract.TEST_PREFIX):
            raise ConfigError(f"workload {self.name!r}: its metric {self.metric} is not a test metric; name its "
                              f"validation counterpart in validation_metric: eval_val_...")
        return contract.VAL_PREFIX + self.metric.removeprefix(contract.TEST_PREFIX)


class BenchmarkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.\-]+$")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    threads: int = Field(1, ge=1)               # torch threads per Ray worker, fixed for every run
    workloads: list[WorkloadSpec] = Field(..., min_length=1)
    size_axis: bool = False                     # the workloads differ in training-set size: also the size report


class BenchmarkRun(BaseModel):
    """One run of the benchmark: a workload, a method, a seed (and, in the selection stage, the
    candidate value of the knob it tries)."""
    model_config = ConfigDict(arbitrary_types_allowed=True)
    workload: WorkloadSpec
    method: str
    experiment: ExperimentConfig
    attent_budget: float                        # AtteNT's planned mean selected ratio on the workload
    stage: str = contract.BENCH_STAGE_VERDICT
    candidate: Optional[tuple[str, Any]] = None  # selection stage: (key, value) this run tries

# workload name -> the selection stage's choices so far: config key -> value (applied per TuneSpec)
Choices = dict[str, list[tuple[TuneSpec, Any]]]
# methods calibrated at run time from other runs of the same seed, which must run first
CALIBRATED_FROM = {contract.METHOD_INFOBATCH_BUDGET: ("infobatch",),
                   contract.METHOD_FULL_EQUAL_COST: (contract.METHOD_FULL, contract.METHOD_ATTENT)}


def load_benchmark(path: str | Path, overrides: list[str] | None = None, *, name: str | None = None,
                   choices: Choices | None = None,
                   workloads: list[str] | None = None) -> tuple[BenchmarkSpec, list[BenchmarkRun]]:
    """The spec in ``path`` and its verdict runs in execution order (workload, seed, method: a
    seed's methods run back to back, so slow drifts of the machine hit them alike; calibrated
    methods after the runs they read), with the selection stage's ``choices`` applied (None: the
    base values). ``overrides`` (key.path=value) apply to every run; ``name`` renames the
    benchmark (a fresh one); ``workloads``: only the workloads of these names (None: all)."""
    path = Path(path)
    spec = load_section(path, "benchmark", BenchmarkSpec, name=name)
    if workloads:
        known = [w.name for w in spec.workloads]
        unknown = [w for w in workloads if w not in known]
        if unknown:
            raise ConfigError(f"{path}: no workload {', '.join(map(repr, unknown))}; its workloads: {', '.join(known)}")
        spec = spec.model_copy(update={"workloads": [w for w in spec.workloads if w.name in workloads]})
    cli = parse_overrides(overrides or [])
    runs = []
    for workload in spec.workloads:
        check_workload(path, workload)
        base = read_yaml((path.parent / workload.base).resolve())
        chosen = (choices or {}).get(workload.name, [])
        order = sorted(workload.methods, key=lambda m: base_method(m) in CALIBRATED_FROM)
        for seed in workload.seeds or spec.seeds:
            budget = attent_budget(spec, workload, seed, base, cli, chosen, path)
            for method in order:
                runs.append(BenchmarkRun(workload=workload, method=method, attent_budget=budget,
                                         experiment=_experiment(spec, workload, method, seed, base, cli, chosen, path)))
    return spec, runs


def check_workload(path: Path, workload: WorkloadSpec) -> None:
    """Every method known, every calibrated method's sources present, every choice's method present."""
    where = f"{path}: workload {workload.name!r}"
    unknown = sorted(m for m in workload.methods if base_method(m) not in METHODS)
    if unknown:
        raise ConfigError(f"{where}: unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    for method in {base_method(m) for m in workload.methods} & set(CALIBRATED_FROM):
        missing = [m for m in CALIBRATED_FROM[method] if m not in workload.methods]
        if missing:
            raise ConfigError(f"{where}: {method} is calibrated from the {' and '.join(f'`{m}`' for m in missing)} "
                              f"run(s) of the same seed: add {', '.join(f'{m}: {{}}' for m in missing)}")
    for tune in workload.tune:
        if base_method(tune.method) not in METHODS:
            raise ConfigError(f"{where}: tune chooses {tune.key} with unknown method {tune.method!r}")
    if workload.tune:
        workload.selection_metric()  # refuses a verdict metric that has no validation counterpart


def _experiment(spec: BenchmarkSpec, workload: WorkloadSpec, method: str, seed: int, base: dict[str, Any],
                cli: dict[str, Any], chosen: list[tuple[TuneSpec, Any]], path: Path, *,
                stage: str = contract.BENCH_STAGE_VERDICT) -> ExperimentConfig:
    """The run of ``method`` at ``seed``: the base experiment, the workload's overrides, what the
    method means, its own overrides, the choices that apply to it, then the command line's."""
    meaning = {k: (v.format(variant=workload.variant) if isinstance(v, str) else v)
               for k, v in METHODS[base_method(method)].items()}
    extra = workload.methods.get(method, {})
    decided = {tune.key: value for tune, value in chosen if tune.targets(method)}
    prefix = spec.name if stage == contract.BENCH_STAGE_VERDICT else f"{spec.name}-select"
    fixed = {"ray.cpus_per_worker": spec.threads, "mlflow.experiment": spec.name,
             "name": f"{prefix}-{workload.name}-{method.replace('+', '-')}-s{seed}", "seed": seed}
    data = base
    for layer in (workload.overrides, meaning, extra, decided, fixed):
        data = deep_merge(data, nest_keys(layer))
    data = deep_merge(data, cli)
    source = f"{path} {workload.name}/{method}"
    epochs = data.get("train", {}).get("epochs") or build_experiment(data, source).train.epochs
    if base_method(method) == contract.METHOD_FULL_LONG:
        data = deep_merge(data, {"train": {"epochs": 2 * epochs}})
    elif base_method(method) == contract.METHOD_FULL_EQUAL_SAMPLES:
        attent = _experiment(spec, workload, contract.METHOD_ATTENT, seed, base, cli, chosen, path)
        planned = attent.selection.mean_planned_ratio(attent.train.epochs) * attent.train.epochs
        data = deep_merge(data, {"train": {"epochs": max(1, round(planned))}})
    return build_experiment(data, source)


def attent_budget(spec: BenchmarkSpec, workload: WorkloadSpec, seed: int, base: dict[str, Any],
                  cli: dict[str, Any], chosen: list[tuple[TuneSpec, Any]], path: Path) -> float:
    """AtteNT's planned budget on the workload: its mean selected ratio over the epochs (with the
    workload's `attent` overrides and choices)."""
    attent = _experiment(spec, workload, contract.METHOD_ATTENT, seed, base, cli, chosen, path)
    return attent.selection.mean_planned_ratio(attent.train.epochs)


# --- the selection stage -------------------------------------------------------------------------

def selection_runs(path: str | Path, workload: WorkloadSpec, tune: TuneSpec, chosen: list[tuple[TuneSpec, Any]],
                   overrides: list[str] | None = None, *, name: str | None = None) -> list[BenchmarkRun]:
    """The candidates of one choice: ``tune.method`` with each value, on every selection seed,
    the earlier choices applied."""
    path = Path(path)
    spec = load_section(path, "benchmark", BenchmarkSpec, name=name)
    cli = parse_overrides(overrides or [])
    base = read_yaml((path.parent / workload.base).resolve())
    runs = []
    for seed in workload.tune_seeds or (workload.seeds or spec.seeds)[:1]:
        budget = attent_budget(spec, workload, seed, base, cli, chosen, path)
        for value in tune.values:
            label = f"{tune.method}+{tune.key.rsplit('.', 1)[-1]}={value}"
            trial = TuneSpec(key=tune.key, values=tune.values, method=tune.method, applies_to=[tune.method])
            cfg = _experiment(spec, workload, tune.method, seed, base, cli, [*chosen, (trial, value)], path,
                              stage=contract.BENCH_STAGE_SELECTION)
            cfg = cfg.model_copy(update={"name": f"{spec.name}-select-{workload.name}-{safe_name(label)}-s{seed}"})
            runs.append(BenchmarkRun(workload=workload, method=label, experiment=cfg, attent_budget=budget,
                                     stage=contract.BENCH_STAGE_SELECTION, candidate=(tune.key, value)))
    return runs


def choice_record(workload: WorkloadSpec, tune: TuneSpec, value: Any, scores: dict[str, float],
                  seeds: list[int]) -> dict[str, Any]:
    """One choice of the selection stage as ``choices.json`` records it; a best value at an end of
    the candidates may not be the best (``at_edge``: the report says so too)."""
    return {"workload": workload.name, "method": tune.method, "key": tune.key, "value": value,
            "metric": workload.selection_metric(), "scores": scores,
            "at_edge": value in (tune.values[0], tune.values[-1]), "seeds": sorted(set(seeds))}


def safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def choose(tune: TuneSpec, finals: dict[Any, list[float]], lower_is_better: bool) -> tuple[Any, dict[str, float]]:
    """The candidate whose validation metric is best on average over the selection seeds, and
    every candidate's mean. ``finals``: value -> the final validation metric of each seed's run;
    nothing else is given, so no test metric can sway the choice."""
    means = {value: sum(v) / len(v) for value, v in finals.items() if v}
    missing = [value for value in tune.values if value not in means]
    if missing:
        raise ConfigError(f"selection of {tune.key}: no finished run with a validation metric for {missing}")
    best = (min if lower_is_better else max)(tune.values, key=lambda value: means[value])
    return best, {str(value): means[value] for value in tune.values}


def calibrate_infobatch(run: BenchmarkRun, reference: ExperimentConfig, budget: float) -> ExperimentConfig:
    """The run with the prune ratio that brings InfoBatch to ``budget``, from the kept ratios of
    ``reference`` (the same seed's InfoBatch run at its defaults, finished)."""
    from .engine.tracking import client_for
    from .selection.baselines import infobatch_prune_for_budget
    done = finished_source(run, reference, "the InfoBatch run")
    history = client_for(reference.mlflow.tracking_uri).get_metric_history(done.info.run_id, contract.SELECTED_RATIO)
    kept = [m.value for m in sorted(history, key=lambda m: m.step)]
    sel = reference.selection
    prune = infobatch_prune_for_budget(budget, kept, sel.infobatch_prune, reference.train.epochs, sel.infobatch_final)
    cfg = run.experiment
    return cfg.model_copy(update={"selection": cfg.selection.model_copy(update={"infobatch_prune": round(prune, 4)})})


def calibrate_equal_cost(run: BenchmarkRun, full: ExperimentConfig, attent: ExperimentConfig) -> ExperimentConfig:
    """Full data for the epochs whose method cost matches AtteNT's, both measured in the same
    seed's finished runs: a full-data epoch costs the same every epoch (evaluation is not in the
    method cost), so E x AtteNT's cost / full data's cost epochs, rounded, at least one."""
    attent_cost, full_cost = (contract.method_cost(finished_source(run, source, "the run").data.metrics)
                              for source in (attent, full))
    return with_epochs(run.experiment, equal_cost_epochs(full.train.epochs, attent_cost, full_cost))


def equal_cost_epochs(full_epochs: int, attent_cost: float, full_cost: float) -> int:
    """Full data's epochs at AtteNT's measured method cost: E x AtteNT's cost / full data's cost,
    rounded, at least one."""
    return max(1, round(full_epochs * attent_cost / full_cost))


def with_epochs(cfg: ExperimentConfig, epochs: int) -> ExperimentConfig:
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": epochs})})


def finished_source(run: BenchmarkRun, source: ExperimentConfig, what: str):
    """The finished MLflow run a calibrated ``run`` reads; refused in one line otherwise."""
    done = latest_run(source)
    if done is None or done.info.status != "FINISHED":
        raise ConfigError(f"{run.experiment.name}: {what} it calibrates from ({source.name}) did not finish")
    return done


def latest_run(cfg: ExperimentConfig):
    from .engine.tracking import latest_run as latest
    return latest(cfg)


def base_method(name: str) -> str:
    """``attent+stale`` -> ``attent``: a named variant of a method."""
    return name.split("+", 1)[0]


def describe(spec: BenchmarkSpec, runs: list[BenchmarkRun], *, chosen: bool = False) -> str:
    """The runs, a line each; ``chosen``: the selection stage's choices are already applied."""
    lines = [f"benchmark {spec.name!r}: {len(runs)} runs, seeds {spec.seeds} unless a workload says, "
             f"{spec.threads} thread(s) per worker, one run at a time"]
    for run in runs:
        cfg = run.experiment
        epochs = ("epochs calibrated at run time" if base_method(run.method) == contract.METHOD_FULL_EQUAL_COST
                  else f"{cfg.train.epochs} epochs")
        lines.append(f"  {run.workload.name:<12} {run.method:<12} seed {cfg.seed}: {epochs}, "
                     f"{cfg.selection.label(cfg.train.epochs)}"
                     + (f", downstream {[job.name for job in cfg.downstream]}" if cfg.downstream else ""))
    tuned = [f"{w.name}: {', '.join(f'{t.key} among {t.values} by {t.method}' for t in w.tune)}"
             for w in spec.workloads if w.tune]
    if tuned and not chosen:
        lines.append("  chosen on validation first (the epochs and knobs above are the base values): " + "; ".join(tuned))
    return "\n".join(lines)


def run_benchmark(path: str | Path, overrides: list[str] | None = None, *, out_dir: str | Path = "reports",
                  name: str | None = None, console=None, workloads: list[str] | None = None) -> Path:
    """The selection stage (each workload's choices, on validation), then every verdict run, one
    at a time, then the report; returns the report folder. A finished run is kept, so running
    the command again continues where it stopped. ``console``: the driver's
    (``engine.progress.Console``; default: everything Ray prints). ``workloads``: only these (a
    long workload run on its own; the reports then cover the workloads the store holds)."""
    spec, runs = load_benchmark(path, overrides, name=name, workloads=workloads)
    candidates = [run for workload in spec.workloads for tune in workload.tune
                  for run in selection_runs(path, workload, tune, [], overrides, name=name)]
    resolve = lambda runs: [r.model_copy(update={"experiment": r.experiment.resolved()}) for r in runs]  # noqa: E731
    from .engine.preflight import check_experiment
    check_experiment(*[run.experiment for run in resolve(candidates + runs)])  # every refusal before any worker starts
    uri = resolve(runs[:1])[0].experiment.mlflow.tracking_uri
    parent = _parent_run(spec, uri)
    try:
        # workload by workload, so each one's verdict is in before the next one's selection starts
        choices, records = {}, []
        for workload in spec.workloads:
            chosen = []
            for tune in workload.tune:
                tried = resolve(selection_runs(path, workload, tune, chosen, overrides, name=name))
                print(f"[bench] {workload.name}: choosing {tune.key} among {tune.values} by {tune.method}'s "
                      f"{workload.selection_metric()} ({len(tried)} runs)", flush=True)
                for number, run in enumerate(tried, 1):
                    _train(run, f"select {number}/{len(tried)}", parent, tried, console)
                value, scores = choose(tune, validation_finals(tried, workload.selection_metric()),
                                       contract.lower_is_better(workload.selection_metric()))
                chosen.append((tune, value))
                records.append(choice_record(workload, tune, value, scores, seeds=[r.experiment.seed for r in tried]))
                edge = records[-1]["at_edge"]
                print(f"[bench] {workload.name}: {tune.key} = {value} chosen on validation "
                      f"({', '.join(f'{k}: {v:.4f}' for k, v in scores.items())})"
                      + ("; it is an end of the candidates: a value beyond it may do better" if edge else ""), flush=True)
                from .engine.tracking import client_for
                client_for(uri).log_dict(parent, records, contract.BENCH_CHOICES_FILE)
            choices[workload.name] = chosen
            _, runs = load_benchmark(path, overrides, name=name, choices=choices, workloads=workloads)
            runs = resolve([run for run in runs if run.workload.name == workload.name])
            print(describe(spec, runs, chosen=True), flush=True)
            for number, run in enumerate(runs, 1):
                _train(run, f"{workload.name} {number}/{len(runs)}", parent, runs, console)
    except BaseException:  # the parent says so; running the command again continues
        from .engine.tracking import client_for
        client_for(uri).set_terminated(parent, "FAILED")
        raise
    from analysis.time_to_accuracy import build_time_to_accuracy_report
    tolerances = {w.name: w.tolerance for w in spec.workloads if w.tolerance is not None}
    margins = {w.name: w.margin for w in spec.workloads if w.margin is not None}
    out = build_time_to_accuracy_report(spec.name, tracking_uri=uri, out_dir=Path(out_dir) / spec.name,
                                        tolerances=tolerances, margins=margins)
    if spec.size_axis:
        from analysis.data_size import build_data_size_report
        build_data_size_report(spec.name, tracking_uri=uri, out_dir=out / "data_size", tolerances=tolerances,
                               margins=margins)
    return out


def _train(run: BenchmarkRun, counter: str, parent: str, runs: list[BenchmarkRun], console) -> None:
    """One run through the engine as a child of the benchmark's parent run, unless it finished
    earlier; a calibrated method is calibrated first from the runs of its seed."""
    from .engine.driver import run_pipeline
    cfg = run.experiment
    done = latest_run(cfg)
    if done is not None and done.info.status == "FINISHED":
        print(f"[bench] {counter} {cfg.name}: finished earlier, kept", flush=True)
        return
    method = base_method(run.method)

    def same_seed(name: str) -> ExperimentConfig:
        return next(r.experiment for r in runs if r.workload is run.workload and r.method == name
                    and r.experiment.seed == cfg.seed)
    if method == contract.METHOD_INFOBATCH_BUDGET:
        cfg = calibrate_infobatch(run, same_seed("infobatch"), run.attent_budget)
        print(f"[bench] {cfg.name}: InfoBatch prune {cfg.selection.infobatch_prune:g} "
              f"for AtteNT's budget {run.attent_budget:.3f}", flush=True)
    elif method == contract.METHOD_FULL_EQUAL_COST:
        cfg = calibrate_equal_cost(run, same_seed(contract.METHOD_FULL), same_seed(contract.METHOD_ATTENT))
        print(f"[bench] {cfg.name}: {cfg.train.epochs} epochs of full data for AtteNT's measured method cost",
              flush=True)
    print(f"[bench] {counter} {cfg.name}", flush=True)
    name = run.method if run.candidate is None else f"select {run.method}"
    run_pipeline(cfg, parent_run_id=parent, role=contract.ROLE_TRIAL,
                 extra_tags={contract.TAG_BENCH_WORKLOAD: run.workload.name,
                             contract.TAG_BENCH_METHOD: run.method,
                             contract.TAG_BENCH_METRIC: run.workload.metric,
                             contract.TAG_BENCH_STAGE: run.stage,
                             # the experiment names the benchmark: the run, what tells it apart
                             contract.TAG_RUN_NAME: f"{name} s{cfg.seed} {run.workload.name}"},
                 **({"console": console} if console is not None else {}))


def validation_finals(runs: list[BenchmarkRun], metric: str) -> dict[Any, list[float]]:
    """Candidate value -> the final value of the validation ``metric`` in each of its finished
    runs: the one metric the selection stage reads."""
    if not metric.startswith(contract.VAL_PREFIX):
        raise ConfigError(f"the selection stage reads validation metrics only ({contract.VAL_PREFIX}...), not {metric}")
    finals: dict[Any, list[float]] = {}
    for run in runs:
        done = latest_run(run.experiment)
        value = None if done is None else done.data.metrics.get(metric)
        if value is None:
            raise ConfigError(f"{run.experiment.name} logged no {metric}: give the workload a validation split "
                              f"(task.val_limit)")
        finals.setdefault(run.candidate[1], []).append(float(value))
    return finals


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
    client.log_dict(run.info.run_id, spec.model_dump(mode="json"), contract.BENCH_SPEC_FILE)
    return run.info.run_id
