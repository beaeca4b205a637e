"""What a person sees while a run trains: one progress line per run (tqdm, updated in place on a
terminal; a plain line per epoch when the output is a file, a pipe or `ray job submit`'s log),
while everything the libraries print (Ray's worker and controller output, MLflow's and Ray's
log records, warnings) goes to the run's log file, which is also logged to the run.

The line follows the run through its MLflow metrics (the ``epoch`` row rank 0 logs after every
epoch), so it works the same on a local Ray and on a cluster; so do the lines, one each, saying
that the run resumed from a checkpoint and which checkpoints it skipped (the worker's own lines
about them go to the log). ``Console.stream()`` (the library's default, and ``attent --verbose``)
changes nothing: every line as Ray forwards it.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .. import contract

LIVE, PLAIN, STREAM = "live", "plain", "stream"
LOG_DIR_ENV = "ATTENT_LOG_DIR"  # where logs and tracebacks go
POLL_SECONDS = 1.0  # how often the line reads the run's metrics (one small query)


@dataclass(frozen=True)
class Console:
    mode: str = STREAM  # live | plain | stream

    @classmethod
    def for_cli(cls, verbose: bool) -> Console:
        """live on a terminal, plain lines otherwise; --verbose streams everything as before."""
        if verbose:
            return cls(STREAM)
        return cls(LIVE if sys.stderr.isatty() else PLAIN)

    @property
    def quiet(self) -> bool:
        return self.mode != STREAM


DEFAULT_CONSOLE = Console()  # a run's lines as they come (what a caller in-process gets)


def log_path(storage_path: str, name: str) -> Path:
    """The run's log file: in its folder under a local storage path, else in attent's log folder."""
    if "://" not in storage_path:
        return Path(storage_path) / name / "attent.log"
    return log_folder() / f"{name}.log"


def log_folder() -> Path:
    """attent's own log folder: $ATTENT_LOG_DIR, else ~/.cache/attent/logs."""
    return Path(os.environ.get(LOG_DIR_ENV) or Path.home() / ".cache" / "attent" / "logs")


@contextlib.contextmanager
def captured_output(console: Console, path: Path) -> Iterator[IO[str] | None]:
    """While the body runs, this process's stdout and stderr (file descriptors 1 and 2, so the
    output of Ray's log monitor, of C++ code and of child processes too) go to ``path``; yields a
    stream to the terminal they pointed at before, for the progress line (None when streaming)."""
    if not console.quiet:
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush(), sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    terminal = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    try:
        os.write(log, f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()} ===\n".encode())
        for fd in (1, 2):
            os.dup2(log, fd)
        yield terminal
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(log)
        terminal.close()


class RunProgress:
    """The progress line of one run: its phase before the first epoch, then epochs done, the
    training loss and evaluation metrics of the latest one, elapsed time and the ETA. ``phase``:
    what the line says until the first epoch (in Ray Train's local mode no worker starts)."""

    def __init__(
        self,
        console: Console,
        terminal: IO[str] | None,
        name: str,
        epochs: int,
        log_file: Path | None = None,
        phase: str = "starting Ray workers",
    ):
        self.console, self.terminal, self.name, self.epochs = console, terminal, name, epochs
        self.log_file = log_file if terminal is not None else None  # where the libraries' output went
        self.started = time.perf_counter()
        self.epoch_seen = 0
        self.pace_from: tuple[float, int] | None = None  # (when, epochs done then): the ETA's start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        # the restores and the skipped checkpoints already on the run when following began (None:
        # not following); each one after them is one line on the terminal
        self._restores_seen: int | None = None
        self._skipped_seen: str | None = None
        if terminal is not None and console.mode == LIVE:
            from tqdm import tqdm

            self._bar = tqdm(
                total=epochs,
                desc=name,
                unit="epoch",
                file=terminal,
                ncols=width(terminal),
                # the ETA is the epochs' own pace (postfix), not one that counts Ray's start-up
                bar_format="{desc} {n_fmt}/{total_fmt} epochs |{bar:12}| {elapsed}{postfix}",
            )
            self._bar.set_postfix_str(phase)  # until set-up ends

    def follow(self, handle) -> None:
        """Read the run's metrics every second from now on (a resumed run starts at its epoch);
        ``handle``: the run's ``tracking.RunLogger``."""
        if self.terminal is None:
            return
        client = handle.client
        run = handle.get()
        self.epoch_seen = int(run.data.metrics.get("epoch", 0))
        if self._bar is not None and self.epoch_seen:
            self._bar.update(self.epoch_seen)
        self._skipped_seen = run.data.tags.get(contract.TAG_SKIPPED_CHECKPOINTS)
        with contextlib.suppress(Exception):  # without it no restore is said, and the run goes on
            self._restores_seen = len(restores(client, run))  # an earlier driver's: said then

        def poll() -> None:
            while not self._stop.wait(POLL_SECONDS):
                with contextlib.suppress(Exception):  # a busy store skips one poll, not the rest of the line
                    run = handle.get()
                    self.notice(client, run)
                    self.update(run.data.metrics)

        self._thread = threading.Thread(target=poll, name=f"progress-{handle.run_id[:8]}", daemon=True)
        self._thread.start()

    def update(self, metrics: dict[str, float]) -> None:
        now, epoch = time.perf_counter(), int(metrics.get("epoch", 0))
        if self.pace_from is None and (epoch > self.epoch_seen or contract.TIME_SETUP in metrics):
            # the first epoch began about when set-up ended (or, resumed, when an epoch was first seen)
            self.pace_from = (now if epoch == self.epoch_seen else self.started, self.epoch_seen)
            if self._bar is not None and epoch == self.epoch_seen:
                self._bar.set_postfix_str("training")
        if epoch <= self.epoch_seen:
            return
        since, done_then = self.pace_from
        eta = (now - since) / max(epoch - done_then, 1) * (self.epochs - epoch)
        shown = f"{summary(metrics)}, ETA {clock(eta)}" if epoch < self.epochs else summary(metrics)
        if self._bar is not None:
            self._bar.update(epoch - self.epoch_seen)
            self._bar.set_postfix_str(shown)
        else:
            print(
                f"{self.name} epoch {epoch}/{self.epochs}: {shown}, elapsed {clock(now - self.started)}",
                file=self.terminal,
                flush=True,
            )
        self.epoch_seen = epoch

    def notice(self, client, run) -> None:
        """A line for each restore from a checkpoint (a re-run resuming, a restart after a failure)
        and each checkpoint a restore skipped that the run shows since following began: the worker
        that restored logs ``restored_at_epoch`` (step = its first epoch) and tags the skipped ones,
        and under a quiet console its own lines go to the run's log only."""
        if self._restores_seen is None:
            return
        skipped = run.data.tags.get(contract.TAG_SKIPPED_CHECKPOINTS)
        if skipped and skipped != self._skipped_seen:
            self._skipped_seen = skipped
            for path, why in skipped_checkpoints(skipped):
                self.event(f"skipped checkpoint {path}: {why}" if why else f"skipped checkpoint {path}")
        new = restores(client, run)[self._restores_seen :]
        self._restores_seen += len(new)
        for epoch, step in new:
            where = f"its epoch-{epoch} checkpoint" if step is None else f"step {step} of epoch {epoch + 1}"
            self.event(f"resumed {self.name} from {where}")

    def event(self, text: str) -> None:
        """One line the user must see (a restart, a resume), on the terminal even when quiet."""
        stream = self.terminal if self.terminal is not None else sys.stdout
        if self._bar is not None:
            self._bar.write(f"[attent] {text}", file=stream)
        else:
            print(f"[attent] {text}", file=stream, flush=True)

    def close(self, handle=None, ok: bool = True) -> None:
        """Stop following; the line shows the run's last epoch (read once more) and its outcome."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if handle is not None and self.terminal is not None:
            with contextlib.suppress(Exception):  # the line is a courtesy: never fail a run for it
                run = handle.get()
                self.notice(handle.client, run)  # a run that ended before the next poll: its lines still
                if ok:
                    self.update(run.data.metrics)
        if self._bar is not None:
            if not ok:
                self._bar.set_postfix_str(f"{self._bar.postfix or ''}, failed".strip(", "))
            self._bar.close()
        if not ok and self.log_file is not None:
            print(f"{self.name}: Ray's and the libraries' output is in {self.log_file}", file=self.terminal, flush=True)


def restores(client, run) -> list[tuple[int, int | None]]:
    """(first epoch, optimiser steps it had: a checkpoint taken inside it, else None) of each restore
    from a checkpoint the run logged, oldest first (the whole history: a restore past a corrupt
    checkpoint may restart earlier than the one before it). A restore logs both in one call."""
    if contract.RESTORED_AT_EPOCH not in run.data.metrics:
        return []
    history = client.get_metric_history(run.info.run_id, contract.RESTORED_AT_EPOCH)
    inside = {}
    if contract.RESTORED_AT_STEP in run.data.metrics:
        steps = client.get_metric_history(run.info.run_id, contract.RESTORED_AT_STEP)
        inside = {(m.timestamp, m.step): int(m.value) for m in steps}
    ordered = sorted(history, key=lambda m: m.timestamp)
    return [(int(m.value), inside.get((m.timestamp, m.step))) for m in ordered]


def skipped_checkpoints(tag: str) -> list[tuple[str, str]]:
    """(path, why) of each checkpoint in the run's ``attent.skipped_checkpoints`` tag, which the
    worker writes as ``<path>: <why>`` joined by ``; `` (every path in the run's folder: an entry
    starts where that folder does)."""
    cut = tag.find("/checkpoint_")
    if cut < 0:
        return [(tag, "")]
    entries = re.split(f"; (?={re.escape(tag[:cut])}/checkpoint_)", tag)
    return [tuple(entry.split(": ", 1)) if ": " in entry else (entry, "") for entry in entries]


def summary(metrics: dict[str, float]) -> str:
    """``loss 0.4123, test_accuracy 0.8125``: the training loss and every evaluation metric."""
    parts = []
    if contract.TRAIN_LOSS in metrics:
        parts.append(f"loss {metrics[contract.TRAIN_LOSS]:.4f}")
    parts += [
        f"{k[len(contract.EVAL_PREFIX) :]} {v:.4f}"
        for k, v in sorted(metrics.items())
        if k.startswith(contract.EVAL_PREFIX) and not math.isnan(v)
    ]
    return ", ".join(parts)


def width(terminal: IO[str]) -> int:
    """The terminal's width (a terminal that reports none, like a fresh pseudo-terminal: 100)."""
    try:
        return os.get_terminal_size(terminal.fileno()).columns or 100
    except OSError:
        return 100


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
