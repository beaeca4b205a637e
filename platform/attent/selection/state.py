"""The layout of a Selector's saved state (``Selector.state_dict``, format ``records.STATE_FORMAT``):
the Selector's own checkpointing, kept beside the layout it writes. ``saved`` and ``restore`` read
and set the Selector's private fields; this module imports nothing of it (the Selector imports it)."""

from __future__ import annotations

from typing import Any

import torch

from .records import STATE_FORMAT, SelectionRecord, check_state_format

# What a state holds, under each field's name without its underscore: the score table and the pick,
# the run's counts, and inside an epoch this rank's position and sums.
TENSORS = ("scores", "component_scores", "_trained", "subset", "loss_weights")
COUNTS = ("_epoch", "next_epoch", "samples_backpropagated", "samples_forwarded", "_skipped")
INSIDE = ("_steps", "_seen", "_scored", "_skipped_before", "_checksum")


def saved(selector) -> dict[str, Any]:
    """``selector.state_dict()``."""
    inside = None
    if selector.in_epoch:
        inside = {name.lstrip("_"): getattr(selector, name) for name in INSIDE}
        sums = None if selector._component_sums is None else selector._component_sums.cpu()
        inside.update(cursor=selector.sampler.cursor, loss_sum=float(selector._loss_sum), component_sums=sums)
        inside.update(counted=float(selector._counted))
    return {
        "format": STATE_FORMAT,
        "num_samples": selector.num_samples,
        **{name.lstrip("_"): getattr(selector, name).clone() for name in TENSORS},
        **{name.lstrip("_"): getattr(selector, name) for name in COUNTS},
        "generator": selector._generator.get_state(),
        "method": selector._method.state_dict(),
        "history": [(r.summary(), r.indices) for r in selector.history],
        "seconds": dict(selector.seconds),
        "pending": [(i.detach().cpu(), loss.detach().cpu()) for i, loss in selector._pending],
        "inside_epoch": inside,
    }


def restore(selector, state: dict[str, Any], skip_trained: bool) -> None:
    """``selector.load_state_dict(state, skip_trained)``."""
    check_state_format(state, "the selector's state")
    if state["num_samples"] != selector.num_samples:
        raise ValueError(f"the saved selection has {state['num_samples']} samples, this dataset {selector.num_samples}")
    for name in TENSORS:
        setattr(selector, name, state[name.lstrip("_")].clone())
    for name in COUNTS:
        setattr(selector, name, state[name.lstrip("_")])
    selector._generator.set_state(state["generator"])
    selector._method.load_state_dict(state["method"])
    selector.history = [SelectionRecord(**summary, indices=idx) for summary, idx in state["history"]]
    selector.seconds, selector._skip_trained = dict(state["seconds"]), skip_trained
    selector._pending = [(i.clone(), loss.clone()) for i, loss in state["pending"]]
    selector._reset_sums()
    selector._epoch_metrics, inside = {}, state["inside_epoch"]
    selector._in_epoch = inside is not None
    if inside is not None:
        for name in INSIDE:
            setattr(selector, name, inside[name.lstrip("_")])
        selector.sampler.cursor, selector._component_sums = inside["cursor"], inside["component_sums"]
        selector._loss_sum = torch.tensor(inside["loss_sum"], dtype=torch.float64)
        selector._counted = torch.tensor(inside["counted"], dtype=torch.float64)
        selector._step_start = len(selector._pending)
