"""How the tests start the processes of a multi-process run (gloo ranks, Lightning's DDP, concurrent
writers): forked from the test's process where it runs no other thread, so that the children
inherit its imports; else forked from a fork server started once per pytest worker, which has
imported torch, transformers, Lightning and attent (``PRELOAD``). A spawned child imports them
again: 10-25 s per child on 2 cores, against about a second forked (measured).

A fork server's children inherit the environment it started with, not the test's: the tests pass
what a child needs (a port, a store path) as arguments, and the children set it themselves."""

from __future__ import annotations

import multiprocessing
import threading

PRELOAD = [
    "torch",
    "torch.distributed",
    "transformers",
    "accelerate",
    "trl",
    "peft",
    "lightning",
    "timm",
    "mlflow",
    "attent.selection.selector",
    "attent.engine.tracking",
]


def start_method() -> str:
    """``fork`` in a process with no other thread (forking a thread's held lock deadlocks the
    child), else ``forkserver``."""
    return "fork" if threading.active_count() == 1 else "forkserver"


def preload_fork_server() -> None:
    """What the fork server imports when it starts (conftest, at the session's start)."""
    multiprocessing.set_forkserver_preload(PRELOAD)
