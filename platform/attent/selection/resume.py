"""A Selector's state taken inside an epoch, for a run that resumes there (a preempted one); the
state's layout is ``state``'s.

Inside an epoch each rank's state differs in a few parts: the losses it observed and has not
merged yet, its sums, where its pass stands. ``rank_part`` is that part of one rank;
``with_rank_part`` puts a rank's part into the state saved by another (rank 0 saves the rest
once), and ``folded`` makes, from every rank's part, the state of a rank in a world of another
size (an elastic run going on with fewer or more ranks): there the shards of the epoch's pass
change, so the samples trained before the state are the epoch, which ends at once, each
observation and sum counted once (on rank 0).
"""

from __future__ import annotations

from typing import Any

import torch

from .selector import Selector


def rank_part(selector: Selector) -> dict[str, Any]:
    """This rank's part of the Selector's state taken inside an epoch."""
    if not selector.in_epoch:
        raise RuntimeError("rank_part() outside an epoch: between epochs every rank holds the same state")
    state = selector.state_dict()
    return {
        "inside_epoch": state["inside_epoch"],
        "pending": state["pending"],
        "skipped": state["skipped"],
        "seconds": state["seconds"],
        # samples of the pass recorded, padding excluded (the epoch's count of samples trained)
        "trained": selector.sampler.recorded(),
    }


def with_rank_part(state: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """The Selector state ``state`` (taken inside an epoch on any rank) with ``part`` as its rank's part."""
    mine = {key: part[key] for key in ("pending", "skipped", "seconds", "inside_epoch")}
    return {**state, **mine}


def folded(state: dict[str, Any], parts: list[dict[str, Any]], rank: int) -> dict[str, Any]:
    """The state of rank ``rank`` in a world of another size than that of ``parts`` (every old
    rank's, in rank order): the epoch ends where the state was taken. Rank 0 holds every
    observation (in the old rank order, as the merge would have gathered them) and every sum;
    the other ranks none. The samples trained are counted in ``samples_backpropagated`` on every
    rank, and no rank's pass has recorded any: the epoch's end adds nothing more."""
    first = parts[0]["inside_epoch"]
    mine = parts if rank == 0 else []
    sums = [p["inside_epoch"]["component_sums"] for p in mine if p["inside_epoch"]["component_sums"] is not None]
    inside = {
        **first,
        "cursor": 0,
        "steps": 0,
        "seen": sum(p["inside_epoch"]["seen"] for p in mine),
        "scored": sum(p["inside_epoch"]["scored"] for p in mine),
        "skipped_before": sum(p["inside_epoch"]["skipped_before"] for p in mine),
        "loss_sum": sum(p["inside_epoch"]["loss_sum"] for p in mine),
        "counted": sum(p["inside_epoch"]["counted"] for p in mine),
        "component_sums": torch.stack(sums).sum(dim=0) if sums else None,
    }
    part = {
        "inside_epoch": inside,
        "pending": [observation for p in mine for observation in p["pending"]],
        "skipped": sum(p["skipped"] for p in mine),
        "seconds": parts[0]["seconds"],
    }
    resumed = with_rank_part(state, part)
    resumed["samples_backpropagated"] = state["samples_backpropagated"] + sum(p["trained"] for p in parts)
    return resumed
