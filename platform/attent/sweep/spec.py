"""A sweep file: a grid of selection settings x seeds on top of one base experiment, read, expanded into
its trials' experiments and put in launch order. No Ray here: running it on Ray Tune is ``attent.sweep.tune``.

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

import itertools
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ..experiment.files import load_section, nest_keys, parse_overrides, read_yaml
from ..experiment.schema import ExperimentConfig, build_experiment
from ..selection.config import deep_merge

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
    settings: dict[
        str, dict[str, Any]
    ] = {}  # trial id -> what the file sets for it beyond the base (key.path -> value)


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
    trials, settings = [], {}
    for i, seed in launch_order(len(variants), spec.seeds):
        trial_id = f"t{i:02d}-s{seed}"
        data = deep_merge(base_data, nest_keys(variants[i]))
        data.update(name=f"{spec.name}-{trial_id}", seed=seed)
        trials.append((trial_id, build_experiment(data, f"{path} trial {trial_id} {variants[i]}")))
        settings[trial_id] = variants[i]
    return Sweep(spec=spec, base=base, trials=trials, settings=settings)


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
            f"{cfg.plan.label}, {cfg.ray.num_workers} worker(s)"
        )
    return "\n".join(lines)
