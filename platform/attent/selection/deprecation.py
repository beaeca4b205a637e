"""Old spellings that keep working for one release, each with a ``FutureWarning`` naming the
new one (issue 46: one spelling per concept). Pure Python."""
from __future__ import annotations

import functools
import warnings
from typing import Callable, Mapping, Sequence


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """A ``FutureWarning``: ``old`` works for this release only, ``new`` is the spelling to use."""
    warnings.warn(f"{old} is deprecated and will stop working in the next release: use {new}",
                  FutureWarning, stacklevel=stacklevel)


def deprecated_arguments(*, positional: int, by_position: Sequence[str] = (),
                         renamed: Mapping[str, str] | None = None) -> Callable:
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
                    raise TypeError(f"{name}() got {len(extra)} positional arguments too many: pass "
                                    f"{', '.join(by_position)} by keyword")
                names = by_position[:len(extra)]
                for key, value in zip(names, extra):
                    if key in kwargs:
                        raise TypeError(f"{name}() got multiple values for argument {key!r}")
                    kwargs[key] = value
                warn_renamed(f"passing {', '.join(names)} to {name}() by position",
                             f"keywords: {', '.join(f'{key}=' for key in names)}")
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
