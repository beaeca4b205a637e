"""What a benchmark decides from finished runs: the selection stage's choice (validation metrics
only) and the arms calibrated at run time from other runs of the same seed (InfoBatch at
AtteNT's budget, full data and Random at AtteNT's measured cost); and when two runs are the same
computation, so that the runner records the earlier run's result rather than training it twice.
MLflow is imported only by the functions that read it."""

from __future__ import annotations

from typing import Any

from .. import contract
from ..experiment.schema import ConfigError, ExperimentConfig
from ..selection.plan import build_plan
from .spec import BenchmarkRun, TuneSpec, WorkloadSpec


def choice_record(
    workload: WorkloadSpec, tune: TuneSpec, value: Any, scores: dict[str, float], seeds: list[int]
) -> dict[str, Any]:
    """One choice of the selection stage as ``choices.json`` records it; a best value at an end of
    the candidates may not be the best (``at_edge``: the report says so too)."""
    # "method": the arm, under the key the reports read in choices.json
    return {
        "workload": workload.name,
        "method": tune.arm,
        "key": tune.key,
        "value": value,
        "metric": workload.selection_metric(),
        "scores": scores,
        "at_edge": value in (tune.values[0], tune.values[-1]),
        "seeds": sorted(set(seeds)),
    }


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
    from ..engine.tracking import client_for
    from ..selection.baselines import infobatch_prune_for_budget

    done = finished_source(run, reference, "the InfoBatch run")
    history = client_for(reference.mlflow.tracking_uri).get_metric_history(done.info.run_id, contract.SELECTED_RATIO)
    kept = [m.value for m in sorted(history, key=lambda m: m.step)]
    prune = infobatch_prune_for_budget(budget, kept, reference.selection.infobatch_prune, reference.plan)
    cfg = run.experiment
    return cfg.model_copy(update={"selection": cfg.selection.model_copy(update={"infobatch_prune": round(prune, 4)})})


def calibrate_equal_cost(run: BenchmarkRun, reference: ExperimentConfig, attent: ExperimentConfig) -> ExperimentConfig:
    """``reference``'s arm (full data, or Random under AtteNT's schedules) for the epochs whose
    method cost matches AtteNT's, both measured in the same seed's finished runs. Neither scores,
    so their cost goes with the samples they train: the epochs whose planned samples come nearest
    to the reference run's times AtteNT's cost / its cost (for full data E x that ratio, rounded;
    under the cycles reading the added epochs are full-data ones, dearer than the run's mean)."""
    attent_cost, reference_cost = (
        contract.method_cost(finished_source(run, source, "the run").data.metrics) for source in (attent, reference)
    )
    epochs = equal_cost_epochs(
        reference.train.epochs,
        attent_cost,
        reference_cost,
        samples=lambda e: build_plan(reference.selection, e).mean_ratio() * e,
    )
    return with_epochs(run.experiment, epochs)


def equal_cost_epochs(epochs: int, attent_cost: float, reference_cost: float, samples=float) -> int:
    """A reference method's epochs at AtteNT's measured method cost: those whose planned samples
    (``samples(e)``, in epochs of all data; default: e, full data) come nearest to its E's times
    AtteNT's cost / its cost, at least one (the fewer epochs on a tie). Epochs its schedules
    cannot plan are skipped."""
    target = samples(epochs) * attent_cost / reference_cost
    best, gap = 1, float("inf")
    for e in range(1, 4 * epochs + 2):
        try:
            planned = samples(e)
        except ValueError:  # e.g. fewer epochs than the cycles need
            continue
        if abs(planned - target) < gap - 1e-9:
            best, gap = e, abs(planned - target)
    return best


def with_epochs(cfg: ExperimentConfig, epochs: int) -> ExperimentConfig:
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": epochs})})


def finished_source(run: BenchmarkRun, source: ExperimentConfig, what: str):
    """The finished MLflow run a calibrated ``run`` reads; refused in one line otherwise."""
    done = latest_run(source)
    if done is None or done.info.status != "FINISHED":
        raise ConfigError(f"{run.experiment.name}: {what} it calibrates from ({source.name}) did not finish")
    return done


def latest_run(cfg: ExperimentConfig):
    from ..engine.tracking import latest_run as latest

    return latest(cfg)


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
            raise ConfigError(
                f"{run.experiment.name} logged no {metric}: give the workload a validation split (task.val_limit)"
            )
        finals.setdefault(run.candidate[1], []).append(float(value))
    return finals


def computation(cfg: ExperimentConfig) -> dict[str, Any]:
    """What a run computes: its resolved configuration less its name and where it is recorded
    (MLflow, the checkpoint folder). Two runs with equal computations train the same model to the
    same numbers (the recipe is seeded and deterministic), whatever they are called."""
    data = cfg.model_dump(mode="json")
    return {**data, "name": None, "mlflow": None, "ray": {**data["ray"], "storage_path": None}}
