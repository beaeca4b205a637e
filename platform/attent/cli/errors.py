"""What the CLI prints for an error: one line, its cause and, where the error knows it, the fix.
Errors a user causes (bad input, unreachable services, data or checkpoints that cannot be read)
carry their fix in their message; any other error is reduced to its root cause (a worker's
exception inside Ray Train's, the last line of a remote traceback), and its traceback is written
to a log file."""

from __future__ import annotations

import os
import time
import traceback

from ..engine.progress import LOG_DIR_ENV, log_folder  # noqa: F401 -- LOG_DIR_ENV: where tracebacks go


def describe(exc: BaseException) -> tuple[str, bool]:
    """(one line, whether the user can mend it by changing what they gave)."""
    from ..engine.faults import RunFault
    from ..experiment.schema import ConfigError

    if isinstance(exc, (ConfigError, FileNotFoundError, ValueError, RunFault)):
        return one_line(str(exc)), True
    root = root_cause(exc)
    return f"{type(root).__name__}: {one_line(last_line(str(root)))}", False


def root_cause(exc: BaseException) -> BaseException:
    """The innermost error: a Ray Train failure's first worker or controller error, then its
    explicit causes."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        failures = getattr(exc, "worker_failures", None)  # ray.train's WorkerGroupError
        inner = (
            (next(iter(failures.values())) if failures else None)
            or getattr(exc, "controller_failure", None)
            or exc.__cause__
            or getattr(exc, "cause", None)
        )
        if not isinstance(inner, BaseException):
            return exc
        exc = inner
    return exc


def last_line(text: str) -> str:
    """A remote error's message may hold its whole traceback: keep what it ends with."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def one_line(text: str) -> str:
    return " ".join(text.split())


def log_traceback(command: str, exc: BaseException) -> str:
    """Write the traceback to a new file in the log folder; its path (or why there is none)."""
    folder = log_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"attent-{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        path.write_text("".join(traceback.format_exception(exc)))
        return str(path)
    except OSError as error:
        return f"not written: {error.strerror or error}"
