"""Old spellings that keep working until the release ``REMOVED_IN``, each with a ``FutureWarning``
naming the new one: renamed arguments, attributes, module-level names and configuration keys.
Pure Python."""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REMOVED_IN = "0.3.0"  # the release that drops every spelling deprecated here

# Configuration keys renamed, by the place they sit in an experiment or theory-lab file: the
# experiment's and the theory lab's validation read the old key (``renamed_config_keys``), and
# ``selection.config.deep_merge`` reads it in each layer before merging, so that a layer's old
# spelling overrides the new one below it.
RENAMED_KEYS: dict[tuple[str, ...], dict[str, str]] = {
    ("task", "eval"): {"benchmarks": "suites"},  # the LLM task's evaluation suites
    ("teach",): {"methods": "rules"},  # the theory lab's teaching rules
}


def warn_renamed(old: str, new: str, stacklevel: int = 3, *, removed_in: str = REMOVED_IN) -> None:
    """A ``FutureWarning``: ``old`` works until ``removed_in``, ``new`` is the spelling to use."""
    warnings.warn(
        f"{old} is deprecated and will be removed in {removed_in}: use {new}", FutureWarning, stacklevel=stacklevel
    )


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` (PEP 562) for names renamed or moved elsewhere: ``moved`` maps an
    old name to the full path of the new one (``"attent.selection.config.METHOD_NAMES"``). Each
    access warns at the caller's line and returns the new object; other names raise AttributeError."""
    moved = dict(moved)

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        owner, _, attribute = moved[name].rpartition(".")
        warn_renamed(f"{module}.{name}", moved[name])
        return getattr(importlib.import_module(owner), attribute)

    return __getattr__


def renamed_keys(data: Any, renamed: Mapping[str, str], where: str, stacklevel: int = 4) -> Any:
    """``data`` (a configuration mapping) with each old key of ``renamed`` under its new name, with
    a warning per old key found; both spellings at once are refused. Anything but a mapping is
    returned as it is (the validation that follows reports it)."""
    if not isinstance(data, Mapping) or not any(old in data for old in renamed):
        return data
    data = dict(data)
    for old, new in renamed.items():
        if old in data:
            if new in data:
                raise ValueError(f"{where}: both {old} and {new} are set: set {new} only")
            warn_renamed(f"{where}.{old}", f"{where}.{new}", stacklevel=stacklevel)
            data[new] = data.pop(old)
    return data


def renamed_config_keys(data: Any, stacklevel: int = 5) -> Any:
    """``data`` (a whole experiment or theory-lab mapping) with each key of ``RENAMED_KEYS`` found
    at its place under the new name, with its warning; both spellings at one place are refused."""
    for path, renamed in RENAMED_KEYS.items():
        data = _renamed_at(data, path, renamed, path, stacklevel)
    return data


def _renamed_at(
    data: Any, rest: tuple[str, ...], renamed: Mapping[str, str], path: tuple[str, ...], stacklevel: int
) -> Any:
    if not isinstance(data, Mapping):
        return data
    if not rest:
        return renamed_keys(data, renamed, ".".join(path), stacklevel=stacklevel)
    inner = data.get(rest[0])
    updated = _renamed_at(inner, rest[1:], renamed, path, stacklevel)
    return data if updated is inner else {**data, rest[0]: updated}


def deprecated_arguments(
    *, positional: int, by_position: Sequence[str] = (), renamed: Mapping[str, str] | None = None
) -> Callable:
    """Decorator keeping a function's former call forms working, with a ``FutureWarning``:

    - ``by_position``: arguments that are keyword-only now and were once accepted by position, in
      their old order after the first ``positional`` ones (``self`` counts);
    - ``renamed``: old keyword -> new keyword.
    """
    renamed = dict(renamed or {})

    def wrap(function: Callable) -> Callable:
        name = function.__qualname__.removesuffix(".__init__")

        @functools.wraps(function)
        def call(*args, **kwargs):
            if len(args) > positional and by_position:
                extra = args[positional:]
                if len(extra) > len(by_position):
                    raise TypeError(
                        f"{name}() got {len(extra)} positional arguments too many: pass "
                        f"{', '.join(by_position)} by keyword"
                    )
                names = by_position[: len(extra)]
                for key, value in zip(names, extra):
                    if key in kwargs:
                        raise TypeError(f"{name}() got multiple values for argument {key!r}")
                    kwargs[key] = value
                warn_renamed(
                    f"passing {', '.join(names)} to {name}() by position",
                    f"keywords: {', '.join(f'{key}=' for key in names)}",
                )
                args = args[:positional]
            for old, new in renamed.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{name}() got both {old}= and {new}=: pass {new}= only")
                    warn_renamed(f"{name}({old}=...)", f"{name}({new}=...)")
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return call

    return wrap
