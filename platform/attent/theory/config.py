"""The teaching experiment's settings: dataclasses filled from a YAML file plus key.path=value
overrides (``python -m attent.lab experiments/theory_teaching.yaml teach.lr=0.5``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..experiment.files import parse_overrides, read_yaml
from ..experiment.schema import ConfigError
from ..experiment.uris import resolve_tracking_uri
from ..selection.config import deep_merge

# The teachers the experiment compares (its arms): Algorithm 1's greedy rule (the m sequences of
# largest discrepancy), m sequences drawn uniformly, and the whole dense set at every iteration.
TEACHING_RULES = ("greedy", "random", "full")


@dataclass
class ProblemConfig:
    kind: str = "self"  # learner and target f*: self | masked | cross attention
    num_sequences: int = 512  # N: sequences in the dense set
    seq_len: int = 8  # n: elements per sequence (and per context, for cross)
    dim: int = 8  # d: features per element
    key_dim: int = 8  # d_k: query/key columns
    value_dim: int = 8  # d_v: output features per element
    target_scale: float = 2.0  # f*'s weights ~ N(0, scale²/d): larger = sharper target attention
    init_scale: float = 1.0  # the learner's initial weights, drawn independently of f*'s


@dataclass
class TeachConfig:
    rules: list[str] = field(default_factory=lambda: list(TEACHING_RULES))  # greedy | random | full
    subset: int = 64  # m: sequences per iteration for greedy and random
    lr: float = 1.0  # SGD step size on the mean squared error, the same for every rule
    max_iterations: int = 400  # T: parameter updates at most
    epsilon: float = 0.0  # stop once the full-set loss is below it (0: always run T)
    target_losses: list[float] = field(default_factory=lambda: [0.1, 0.01])  # report iterations and
    # wall-clock to reach each of these full-set losses
    threads: int = 1  # torch threads (1: stable timings on a shared machine)


@dataclass
class KernelConfig:
    probe: int = 10  # probe sequences (apart from the dense set) for the ANTK
    every: int = 20  # iterations between ANTK checkpoints (and the last iteration)


@dataclass
class TrackingConfig:
    experiment: str = "theory-teaching"  # MLflow experiment
    # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db; a relative SQLite path is taken from the working
    # directory (experiment.uris.resolve_tracking_uri, as for experiments)
    tracking_uri: str | None = None


@dataclass
class TheoryConfig:
    name: str = "theory-teaching"  # the parent run's name
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])  # each: data, f*, learner init
    problem: ProblemConfig = field(default_factory=ProblemConfig)
    teach: TeachConfig = field(default_factory=TeachConfig)
    kernel: KernelConfig = field(default_factory=KernelConfig)
    mlflow: TrackingConfig = field(default_factory=TrackingConfig)

    def check(self) -> TheoryConfig:
        p, t = self.problem, self.teach
        if p.kind not in ("self", "masked", "cross"):
            raise ConfigError(f"problem.kind must be self, masked or cross, got {p.kind!r}")
        if unknown := [m for m in t.rules if m not in TEACHING_RULES]:
            raise ConfigError(f"teach.rules: unknown {unknown}; choose from {', '.join(TEACHING_RULES)}")
        if not 1 <= t.subset <= p.num_sequences:
            raise ConfigError(f"teach.subset must be in [1, problem.num_sequences={p.num_sequences}]")
        if not self.seeds or t.max_iterations < 1 or t.lr <= 0 or self.kernel.every < 1:
            raise ConfigError("need seeds, teach.max_iterations >= 1, teach.lr > 0 and kernel.every >= 1")
        return self

    def resolved(self, base: Path | None = None) -> TheoryConfig:
        """The store made explicit as an experiment's is (``experiment.uris.resolve_tracking_uri``): the
        file's ``mlflow.tracking_uri``, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db; a relative
        SQLite path taken from ``base`` (default: the working directory)."""
        uri = resolve_tracking_uri(self.mlflow.tracking_uri, Path(base or os.getcwd()))
        return dataclasses.replace(self, mlflow=dataclasses.replace(self.mlflow, tracking_uri=uri))


def build(data: dict[str, Any], source: str = "config") -> TheoryConfig:
    """A TheoryConfig from nested dicts; unknown keys are refused with their path."""
    return _build(TheoryConfig, data, source).check()


def _build(cls, data: dict[str, Any], path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if unknown := sorted(set(data) - set(fields)):
        raise ConfigError(f"{path}: unknown keys {unknown}; known: {sorted(fields)}")
    values = {}
    for name, value in data.items():
        default = getattr(cls(), name)
        if dataclasses.is_dataclass(default):
            values[name] = _build(type(default), value, f"{path}.{name}")
        elif isinstance(default, (int, float)) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{path}.{name}: expected a number, got {value!r}")
            if isinstance(default, int) and value != int(value):
                raise ConfigError(f"{path}.{name}: expected an integer, got {value!r}")
            values[name] = type(default)(value)
        else:
            values[name] = list(value) if isinstance(default, list) else value
    return cls(**values)


def load(path: str | Path, overrides: list[str] | None = None) -> TheoryConfig:
    data = deep_merge(read_yaml(path), parse_overrides(overrides or []))
    return build(data, str(path))


def flatten(cfg: TheoryConfig) -> dict[str, Any]:
    """``{"problem.num_sequences": 512, ...}`` for MLflow params."""
    flat: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(dataclasses.asdict(cfg), "")
    return flat
