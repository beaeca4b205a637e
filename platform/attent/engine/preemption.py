"""Preemption: a spot node's termination notice (SIGTERM, 30 s to 2 min before the kill) or Ray's
node-drain notice turned into a checkpoint at the next optimiser step, from which the run goes on
with the batches, subsets and metrics of the uninterrupted run.

- A SIGTERM handler, installed in the worker process's main thread (Ray Train runs the training
  function in a thread of its own, where Python installs no handler), only sets a flag; a second
  SIGTERM goes to the handler it replaced (Ray's: the process exits).
- Ray's drain notice (``ray.train.get_preemption_info``'s source, read here without its barrier)
  asks for the same checkpoint once, then the run trains on until Ray Train restarts it.
- ``StopFlag``: every rank's flag, all-reduced (max) on a gloo group after each optimiser step,
  overlapped with the next step (waited for one step later), so every rank stops at the same
  step, within one step of the notice, and no step waits on the network.
- ``inside_epoch_state``: what rank 0 saves at that step beside the epoch checkpoint's state:
  where the epoch stands, every rank's part of the Selector's state and its random generators.
  ``Preempted``, raised by every rank after it, has Ray Train restart them (``ray.max_failures``)
  or ends the run resumable.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

INSIDE_EPOCH = "inside_epoch"  # checkpoint key: where a checkpoint taken inside an epoch stands
GO_ON, CHECKPOINT, EXIT = 0, 1, 2  # what the ranks agreed: nothing; a checkpoint (drain notice); and exit (SIGTERM)
SIGTERM_RECEIVED = threading.Event()  # set by the handler, in the process's main thread
_replaced: list[Any] = []  # the SIGTERM handler ours replaced


class Preempted(RuntimeError):
    """Raised by every rank once the checkpoint a SIGTERM asked for is saved: Ray Train restarts
    the workers from it (``ray.max_failures``), or the run ends, resumable by the same command."""


def _on_sigterm(signum: int, frame) -> None:
    if not SIGTERM_RECEIVED.is_set():
        SIGTERM_RECEIVED.set()
        return
    previous = _replaced[0] if _replaced else signal.SIG_DFL  # asked twice: what the handler ours replaced does
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_in_this_thread() -> None:
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    if previous is not _on_sigterm:  # a restarted training function in the same process installs again
        _replaced[:] = [previous]


def install_sigterm_flag() -> str | None:
    """``SIGTERM_RECEIVED`` set by SIGTERM in this process from now on; None, or why not. In a
    Ray actor's training thread the actor's main thread installs it (Python sets handlers there only)."""
    SIGTERM_RECEIVED.clear()
    try:
        if threading.current_thread() is threading.main_thread():
            _install_in_this_thread()
        else:
            import ray

            ray.get(ray.get_runtime_context().current_actor.execute.remote(_install_in_this_thread))
    except Exception as error:  # noqa: BLE001 -- training goes on, without the checkpoint on SIGTERM
        return f"{type(error).__name__}: {error}"
    return None


def drain_notice_reader():
    """A callable: whether Ray has told this worker that a node of its group drains (Ray 2.60's
    preemption watcher, off on a local Ray), read locally (``ray.train.get_preemption_info``
    would be a barrier of every rank at each step); None where this Ray has no such notice."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        get_train_context().preemption_context  # noqa: B018 -- this Ray's Train context has one
    except (ImportError, AttributeError, RuntimeError):  # another Ray, or no Train worker here
        return None
    return lambda: get_train_context().preemption_context.preemption_info is not None


class StopFlag:
    """The ranks' agreement on stopping: ``after_step`` each optimiser step, ``at_epoch_end``
    after each epoch; both return GO_ON, CHECKPOINT or EXIT, the same on every rank."""

    def __init__(self, distributed: bool):
        # its own gloo group: a CPU tensor under NCCL too (no wait on the GPU), never in DDP's way
        self.group = dist.new_group(backend="gloo") if distributed else None
        self.pending: tuple[Any, torch.Tensor] | None = None
        self.drain_notice = drain_notice_reader()
        self.drain_handled = False  # one checkpoint per drain notice

    def local(self) -> int:
        if SIGTERM_RECEIVED.is_set():
            return EXIT
        drains = not self.drain_handled and self.drain_notice is not None and self.drain_notice()
        return CHECKPOINT if drains else GO_ON

    def after_step(self) -> int:
        """The flags of the previous step, agreed; this step's sent on their way."""
        agreed = self._take()
        flag = torch.tensor([self.local()], dtype=torch.int32)
        if self.group is None:
            self.pending = (None, flag)
        else:
            self.pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True), flag)
        return self._seen(agreed)

    def at_epoch_end(self) -> int:
        """The flags now, agreed (one blocking all-reduce per epoch): a notice during evaluation
        or the last step is acted on at the epoch's checkpoint."""
        self._take()
        flag = torch.tensor([self.local()], dtype=torch.int32)
        if self.group is not None:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return self._seen(int(flag))

    def _take(self) -> int:
        if self.pending is None:
            return GO_ON
        (work, flag), self.pending = self.pending, None
        if work is not None:
            work.wait()
        return int(flag)

    def _seen(self, agreed: int) -> int:
        if agreed == CHECKPOINT:
            self.drain_handled = True
        return agreed

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on rank 0 (None elsewhere), over the CPU group."""
        if self.group is None:
            return [value]
        rank0 = dist.get_rank() == 0
        gathered = [None] * dist.get_world_size() if rank0 else None
        dist.gather_object(value, gathered, dst=0, group=self.group)
        return gathered


def rng_state(device: torch.device) -> dict[str, Any]:
    """The random generators the rest of an epoch draws from (dropout, augmentation in this process)."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """The generators as ``rng_state`` took them."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


@dataclass
class InsideEpoch:
    """Where a run restored from a checkpoint taken inside an epoch goes on: after optimiser step
    ``step`` of ``epoch``, with this rank's generators (``rng``); ``folded``: in a world of another
    size, where the epoch ends at that step instead."""

    epoch: int
    step: int
    rng: dict[str, Any] | None
    folded: bool = False


def inside_epoch_state(recipe, flag: StopFlag, epoch: int, step: int) -> dict[str, Any] | None:
    """On rank 0, the ``INSIDE_EPOCH`` entry of a checkpoint taken after ``step`` of ``epoch``
    (every rank's Selector part and generators, gathered); None on the other ranks. Every rank calls it."""
    parts = flag.gather({"selector": recipe.selection_part(), "rng": rng_state(recipe.ctx.device)})
    if parts is None:
        return None
    return {"epoch": epoch, "step": step, "world_size": recipe.ctx.world_size, "ranks": parts}
