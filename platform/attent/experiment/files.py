"""An experiment's files: YAML read and checked, ``key.path=value`` overrides, a file's single section
validated into its model, and the loading of an experiment file into an ``ExperimentConfig``.

    cfg = load_experiment("experiments/digits_vit.yaml", ["train.epochs=3", "selection.preset=vit"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..selection.config import deep_merge
from .schema import ConfigError, ExperimentConfig, build_experiment, format_validation_error


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["train.epochs=3", "selection.ratio.kind=cosine"]`` -> nested dict; values parsed as YAML."""
    flat: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        try:
            flat[key] = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
    return nest_keys(flat)


def nest_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1, "a.c": 2}`` -> ``{"a": {"b": 1, "c": 2}}``."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key!r} conflicts with another setting of {part!r}")
        node[leaf] = value
    return nested


def require_file(path: str | Path) -> Path:
    """``path``, or a ConfigError naming it and where it was looked for."""
    path = Path(path)
    if path.is_file():
        return path
    what = "is a folder, not a file" if path.is_dir() else "does not exist"
    where = "" if path.is_absolute() else f" (looked in {Path.cwd()})"
    raise ConfigError(
        f"config file {str(path)!r} {what}{where}. Fix: give the path of a YAML file, e.g. experiments/digits_vit.yaml"
    )


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = require_file(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections (name, task, train, selection, ...) at the top level"
        )
    return data


def load_section(path: str | Path, key: str, model: type[BaseModel], *, name: str | None = None):
    """A file whose single top-level ``key`` (``sweep``, ``benchmark``) holds a mapping, validated
    into ``model``; ``name`` replaces its ``name`` field."""
    path = Path(path)
    raw = read_yaml(path)
    if set(raw) != {key} or not isinstance(raw[key], dict):
        raise ConfigError(f"{path}: a {key} file has a single top-level key '{key}' holding a mapping")
    try:
        return model.model_validate({**raw[key], **({"name": name} if name else {})})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, f"{path} ({key})")) from None


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    data = deep_merge(read_yaml(path), parse_overrides(overrides or []))
    return build_experiment(data, str(path))


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {'a.b.c': value}, for MLflow params and Tune search spaces."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
    return out
