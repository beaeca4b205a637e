"""A benchmark's spec (the ``benchmark:`` YAML section) and the runs it expands to: every arm's
experiment on every workload and seed, the selection stage's candidates, AtteNT's planned
budget. Nothing here trains or reads MLflow (``runner`` does; ``calibration`` reads the finished
runs that choices and calibrated arms depend on)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .. import contract
from ..contract import base_method
from ..experiment.files import load_section, nest_keys, parse_overrides, read_yaml
from ..experiment.schema import ConfigError, ExperimentConfig, build_experiment
from ..selection.config import deep_merge
from ..selection.plan import build_plan
from ..sweep.spec import seed_block

_ATTENT = {"selection.preset": "{variant}"}
# The arms a workload may compare, each as overrides on the workload's experiment ("{variant}":
# its AtteNT preset). An arm is named after the method or strategy it runs, or a control of it.
ARMS: dict[str, dict[str, Any]] = {
    contract.METHOD_FULL: {"selection.preset": None, "selection.method": "full"},
    contract.METHOD_ATTENT: _ATTENT,  # the paper's variant as is
    "hard": {**_ATTENT, "selection.strategy": "hard"},  # same schedules, top-k
    "soft": {**_ATTENT, "selection.strategy": "soft"},  # same schedules, Gumbel-top-k
    "random": {**_ATTENT, "selection.strategy": "random"},  # same budget, uniform subsets
    "infobatch": {"selection.preset": None, "selection.method": "infobatch"},  # its paper defaults, its own budget
    # full data for 2E epochs, its lr schedule over them: the control that shows a plateau at E
    contract.METHOD_FULL_LONG: {"selection.preset": None, "selection.method": "full"},
    # full data for the epochs whose measured method cost matches the same seed's AtteNT run,
    # calibrated at run time from that run and full data's (both arms must be in the workload)
    contract.METHOD_FULL_EQUAL_COST: {"selection.preset": None, "selection.method": "full"},
    # Random, AtteNT's schedules, for the epochs whose measured method cost matches the same seed's
    # AtteNT run (Random scores nothing, so at equal samples it costs less): calibrated at run time
    # from that run and the same seed's `random` run (both must be in the workload)
    contract.METHOD_RANDOM_EQUAL_COST: {**_ATTENT, "selection.strategy": "random"},
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
    arm: str = contract.METHOD_ATTENT  # the arm whose runs choose it (full for train.epochs)
    # the arms the choice is then applied to; None: `arm` and its variants (train.epochs: all)
    applies_to: list[str] | None = None

    def targets(self, arm: str) -> bool:
        if self.applies_to is not None:
            return arm in self.applies_to or base_method(arm) in self.applies_to
        return self.key == "train.epochs" or base_method(arm) == base_method(self.arm)


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[A-Za-z0-9_\-]+$")
    base: str  # experiment YAML, relative to the benchmark file
    variant: str = "vit"  # AtteNT's preset for this workload: vit | llm
    overrides: dict[str, Any] = {}  # key.path -> value, for every arm
    metric: str = Field(..., pattern=r"^eval_")  # per-epoch curve metric (logged every epoch): the verdict's
    # the selection stage's metric, on the validation split; None: `metric` with eval_test_ -> eval_val_
    validation_metric: str | None = Field(None, pattern=r"^eval_val_")
    tune: list[TuneSpec] = []  # the selection stage's choices, made in this order
    # the target's tolerance below full data's final metric; None: the larger of 0.005 (1 % of a loss) and its seed std
    tolerance: float | None = Field(None, gt=0)
    margin: float | None = Field(None, gt=0)  # "equivalent within ± margin" (a paired TOST); None: the tolerance
    tune_seeds: list[int] | None = Field(None, min_length=1)  # its seeds; None: the first verdict seed
    seeds: list[int] | None = Field(None, min_length=1)  # this workload's seeds; None: the benchmark's
    # arm name -> extra overrides; a name is a key of ARMS, or one with a "+suffix" for a
    # variant of it (e.g. attent+stale: {selection.rescore_stale: true})
    arms: dict[str, dict[str, Any]]

    def selection_metric(self) -> str:
        if self.validation_metric:
            return self.validation_metric
        if not self.metric.startswith(contract.TEST_PREFIX):
            raise ConfigError(
                f"workload {self.name!r}: its metric {self.metric} is not a test metric; name its "
                f"validation counterpart in validation_metric: eval_val_..."
            )
        return contract.VAL_PREFIX + self.metric.removeprefix(contract.TEST_PREFIX)


class BenchmarkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.\-]+$")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    threads: int = Field(1, ge=1)  # torch threads per Ray worker, fixed for every run
    workloads: list[WorkloadSpec] = Field(..., min_length=1)
    size_axis: bool = False  # the workloads differ in training-set size: also the size report


class BenchmarkRun(BaseModel):
    """One run of the benchmark: a workload, an arm, a seed (and, in the selection stage, the
    candidate value of the knob it tries)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    workload: WorkloadSpec
    arm: str
    experiment: ExperimentConfig
    attent_budget: float  # AtteNT's planned mean selected ratio on the workload
    stage: str = contract.BENCH_STAGE_VERDICT
    candidate: tuple[str, Any] | None = None  # selection stage: (key, value) this run tries


# workload name -> the selection stage's choices so far: config key -> value (applied per TuneSpec)
Choices = dict[str, list[tuple[TuneSpec, Any]]]
# arms calibrated at run time from other runs of the same seed, which must run first
CALIBRATED_FROM = {
    contract.METHOD_INFOBATCH_BUDGET: ("infobatch",),
    contract.METHOD_FULL_EQUAL_COST: (contract.METHOD_FULL, contract.METHOD_ATTENT),
    contract.METHOD_RANDOM_EQUAL_COST: ("random", contract.METHOD_ATTENT),
}

EQUAL_COST_ARMS = (contract.METHOD_FULL_EQUAL_COST, contract.METHOD_RANDOM_EQUAL_COST)


def load_benchmark(
    path: str | Path,
    overrides: list[str] | None = None,
    *,
    name: str | None = None,
    choices: Choices | None = None,
    workloads: list[str] | None = None,
) -> tuple[BenchmarkSpec, list[BenchmarkRun]]:
    """The spec in ``path`` and its verdict runs in execution order (workload, seed, arm: a
    seed's arms run back to back, so slow drifts of the machine hit them alike, in an order
    rotated from seed to seed by ``seed_arms``), with the selection stage's ``choices`` applied
    (None: the base values). ``overrides`` (key.path=value) apply to every run; ``name`` renames
    the benchmark (a fresh one); ``workloads``: only the workloads of these names (None: all)."""
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
        seeds = workload.seeds or spec.seeds
        for block, seed in enumerate(seeds):
            budget = attent_budget(spec, workload, seed, base, cli, chosen, path)
            for arm in seed_arms(list(workload.arms), block, len(seeds)):
                runs.append(
                    BenchmarkRun(
                        workload=workload,
                        arm=arm,
                        attent_budget=budget,
                        experiment=arm_experiment(spec, workload, arm, seed, base, cli, chosen, path),
                    )
                )
    return spec, runs


def seed_arms(arms: list[str], block: int, blocks: int) -> list[str]:
    """The order of ``arms`` in the ``block``-th of ``blocks`` seed blocks: the arms that read no
    other run, rotated from block to block (``sweep.seed_block``: none always first or last), then
    the arms calibrated from runs of the same seed, rotated among themselves, after those runs."""
    calibrated = [arm for arm in arms if base_method(arm) in CALIBRATED_FROM]
    free = [arm for arm in arms if base_method(arm) not in CALIBRATED_FROM]
    return seed_block(free, block, blocks) + seed_block(calibrated, block, blocks)


def check_workload(path: Path, workload: WorkloadSpec) -> None:
    """Every arm known, every calibrated arm's sources present, every choice's arm present."""
    where = f"{path}: workload {workload.name!r}"
    unknown = sorted(m for m in workload.arms if base_method(m) not in ARMS)
    if unknown:
        raise ConfigError(f"{where}: unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    for arm in {base_method(m) for m in workload.arms} & set(CALIBRATED_FROM):
        missing = [m for m in CALIBRATED_FROM[arm] if m not in workload.arms]
        if missing:
            raise ConfigError(
                f"{where}: {arm} is calibrated from the {' and '.join(f'`{m}`' for m in missing)} "
                f"run(s) of the same seed: add {', '.join(f'{m}: {{}}' for m in missing)}"
            )
    for tune in workload.tune:
        if base_method(tune.arm) not in ARMS:
            raise ConfigError(f"{where}: tune chooses {tune.key} with unknown arm {tune.arm!r}")
    if workload.tune:
        workload.selection_metric()  # refuses a verdict metric that has no validation counterpart


def arm_experiment(
    spec: BenchmarkSpec,
    workload: WorkloadSpec,
    arm: str,
    seed: int,
    base: dict[str, Any],
    cli: dict[str, Any],
    chosen: list[tuple[TuneSpec, Any]],
    path: Path,
    *,
    stage: str = contract.BENCH_STAGE_VERDICT,
) -> ExperimentConfig:
    """The run of ``arm`` at ``seed``: the base experiment, the workload's overrides, what the
    arm means, its own overrides, the choices that apply to it, then the command line's."""
    meaning = {
        k: (v.format(variant=workload.variant) if isinstance(v, str) else v) for k, v in ARMS[base_method(arm)].items()
    }
    extra = workload.arms.get(arm, {})
    decided = {tune.key: value for tune, value in chosen if tune.targets(arm)}
    prefix = spec.name if stage == contract.BENCH_STAGE_VERDICT else f"{spec.name}-select"
    fixed = {
        "ray.cpus_per_worker": spec.threads,
        "mlflow.experiment": spec.name,
        "name": f"{prefix}-{workload.name}-{arm.replace('+', '-')}-s{seed}",
        "seed": seed,
    }
    data = base
    for layer in (workload.overrides, meaning, extra, decided, fixed):
        data = deep_merge(data, nest_keys(layer))
    data = deep_merge(data, cli)
    source = f"{path} {workload.name}/{arm}"
    epochs = data.get("train", {}).get("epochs") or build_experiment(data, source).train.epochs
    if base_method(arm) == contract.METHOD_FULL_LONG:
        data = deep_merge(data, {"train": {"epochs": 2 * epochs}})
    elif base_method(arm) == contract.METHOD_FULL_EQUAL_SAMPLES:
        attent = arm_experiment(spec, workload, contract.METHOD_ATTENT, seed, base, cli, chosen, path)
        planned = build_plan(attent.selection, attent.train.epochs).mean_ratio() * attent.train.epochs
        data = deep_merge(data, {"train": {"epochs": max(1, round(planned))}})
    return build_experiment(data, source)


def attent_budget(
    spec: BenchmarkSpec,
    workload: WorkloadSpec,
    seed: int,
    base: dict[str, Any],
    cli: dict[str, Any],
    chosen: list[tuple[TuneSpec, Any]],
    path: Path,
) -> float:
    """AtteNT's planned budget on the workload: its mean selected ratio over the epochs (with the
    workload's `attent` overrides and choices)."""
    attent = arm_experiment(spec, workload, contract.METHOD_ATTENT, seed, base, cli, chosen, path)
    return build_plan(attent.selection, attent.train.epochs).mean_ratio()


# --- the selection stage's candidates ------------------------------------------------------------


def selection_runs(
    path: str | Path,
    workload: WorkloadSpec,
    tune: TuneSpec,
    chosen: list[tuple[TuneSpec, Any]],
    overrides: list[str] | None = None,
    *,
    name: str | None = None,
) -> list[BenchmarkRun]:
    """The candidates of one choice: ``tune.arm`` with each value, on every selection seed,
    the earlier choices applied."""
    path = Path(path)
    spec = load_section(path, "benchmark", BenchmarkSpec, name=name)
    cli = parse_overrides(overrides or [])
    base = read_yaml((path.parent / workload.base).resolve())
    runs = []
    for seed in workload.tune_seeds or (workload.seeds or spec.seeds)[:1]:
        budget = attent_budget(spec, workload, seed, base, cli, chosen, path)
        for value in tune.values:
            label = f"{tune.arm}+{tune.key.rsplit('.', 1)[-1]}={value}"
            trial = TuneSpec(key=tune.key, values=tune.values, arm=tune.arm, applies_to=[tune.arm])
            cfg = arm_experiment(
                spec,
                workload,
                tune.arm,
                seed,
                base,
                cli,
                [*chosen, (trial, value)],
                path,
                stage=contract.BENCH_STAGE_SELECTION,
            )
            cfg = cfg.model_copy(update={"name": f"{spec.name}-select-{workload.name}-{safe_name(label)}-s{seed}"})
            runs.append(
                BenchmarkRun(
                    workload=workload,
                    arm=label,
                    experiment=cfg,
                    attent_budget=budget,
                    stage=contract.BENCH_STAGE_SELECTION,
                    candidate=(tune.key, value),
                )
            )
    return runs


def safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def describe(spec: BenchmarkSpec, runs: list[BenchmarkRun], *, chosen: bool = False) -> str:
    """The runs, a line each; ``chosen``: the selection stage's choices are already applied."""
    lines = [
        f"benchmark {spec.name!r}: {len(runs)} runs, seeds {spec.seeds} unless a workload says, "
        f"{spec.threads} thread(s) per worker, one run at a time"
    ]
    for run in runs:
        cfg = run.experiment
        epochs = (
            "epochs calibrated at run time" if base_method(run.arm) in EQUAL_COST_ARMS else f"{cfg.train.epochs} epochs"
        )
        lines.append(
            f"  {run.workload.name:<12} {run.arm:<12} seed {cfg.seed}: {epochs}, "
            f"{build_plan(cfg.selection, cfg.train.epochs).label}"
            + (f", downstream {[job.name for job in cfg.downstream]}" if cfg.downstream else "")
        )
    tuned = [
        f"{w.name}: {', '.join(f'{t.key} among {t.values} by {t.arm}' for t in w.tune)}"
        for w in spec.workloads
        if w.tune
    ]
    if tuned and not chosen:
        lines.append(
            "  chosen on validation first (the epochs and knobs above are the base values): " + "; ".join(tuned)
        )
    return "\n".join(lines)
