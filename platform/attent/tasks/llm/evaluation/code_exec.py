"""Run untrusted, model-written Python with its tests in a separate, constrained process.

Each program runs in a fresh interpreter (``python -I -S``: isolated mode, no site-packages, so
neither the project nor the virtualenv is importable) with an empty environment, a throw-away
working directory, no stdin, and resource limits on memory, CPU time, file size and core dumps.
A program passes only if it exits with status 0 *after* printing a per-run random token appended
to its end, so ``sys.exit(0)`` or ``os._exit(0)`` before the asserts is a failure. Anything the
program does (crash, exception, infinite loop, memory blow-up) is a failed sample, never an
exception in the caller. Not a security boundary against malicious code: use containers for that.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, Literal

Outcome = Literal["passed", "failed", "timeout"]


@dataclass(frozen=True)
class ExecutionResult:
    outcome: Outcome
    stderr_tail: str  # last characters of stderr, for debugging failed samples

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"


# Runs first in the child interpreter: set the limits, then exec the program in a fresh image that
# inherits them (avoids ``preexec_fn``, which can deadlock in threaded parents such as Ray workers).
_LAUNCHER = """
import os, resource, sys
memory, cpu, script = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu),
                     (resource.RLIMIT_FSIZE, 10 * 2**20), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", script])
"""


def run_python(program: str, *, timeout: float = 10.0, memory_mb: int = 1024) -> ExecutionResult:
    """Execute ``program`` in a sandboxed interpreter; passed iff it runs to its last line."""
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="attent-exec-") as root:
        workdir = os.path.join(root, "work")  # the program's folder; its output goes beside it
        os.mkdir(workdir)
        script = os.path.join(workdir, "program.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(f"{program}\n\nprint({token!r}, flush=True)\n")
        limits = [str(memory_mb * 2**20), str(int(timeout) + 1), script]
        # output goes to files, not pipes, so the file-size limit also caps a print flood
        with open(os.path.join(root, "stdout"), "w+b") as stdout, open(os.path.join(root, "stderr"), "w+b") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", _LAUNCHER, *limits],
                cwd=workdir,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir},
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # own process group: a timeout kills its children too
            )
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return ExecutionResult("timeout", "")
            finally:
                _kill_group(process.pid)
                process.wait()
            finished = _tail(stdout).rstrip().endswith(token)
            outcome: Outcome = "passed" if process.returncode == 0 and finished else "failed"
            return ExecutionResult(outcome, _tail(stderr))


def _tail(file: BinaryIO, size: int = 2000) -> str:
    """The last ``size`` bytes of an open binary file, decoded."""
    file.seek(max(0, file.seek(0, os.SEEK_END) - size))
    return file.read().decode(errors="replace")


def _kill_group(pgid: int) -> None:
    """Kill the program and anything it left running in its process group."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_many(
    programs: list[str], *, timeout: float = 10.0, memory_mb: int = 1024, workers: int | None = None
) -> list[ExecutionResult]:
    """``run_python`` over many programs, a few processes at a time, results in input order."""
    workers = workers or max(1, min(len(programs), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda p: run_python(p, timeout=timeout, memory_mb=memory_mb), programs))
