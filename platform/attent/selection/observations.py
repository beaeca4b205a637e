"""Per-sample losses observed in forwards, on their way into the score table: pure functions the
Selector calls. A rank's observations stay on their device until an epoch's merge moves them to
the CPU in one transfer per kind; there they are checked (indices in range, losses finite)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .distributed import all_agree, all_gather_observations

Observation = tuple[torch.Tensor, torch.Tensor]  # (sample indices [B], losses [B, C])


def observation(indices: torch.Tensor, losses: torch.Tensor, components: int) -> Observation:
    """A batch's (indices, losses) as the score table keeps them: losses detached, float, [B, C].

    Args:
        indices: the samples' positions in the training set, [B].
        losses: per-sample losses, [B] or [B, C].
        components: C, the loss components (1 without any).

    Returns:
        (indices [B], losses [B, C]) on the losses' device.

    Raises:
        ValueError: the counts of indices and losses differ.
    """
    losses = losses.detach().float().reshape(-1, components)
    indices = torch.as_tensor(indices).detach().reshape(-1)
    if indices.numel() != losses.shape[0]:
        raise ValueError(
            f"{indices.numel()} indices but losses of shape {tuple(losses.shape)} ({components} component(s) expected)"
        )
    return indices, losses


def on_cpu(pending: list[Observation], components: int) -> Observation:
    """Pending observations concatenated on the CPU, one transfer per kind."""
    if not pending:
        return torch.empty(0, dtype=torch.long), torch.empty(0, components)
    device = pending[0][1].device
    losses = torch.cat([loss.to(device) for _, loss in pending]).cpu()
    indices = torch.cat([i.to(device, torch.long) for i, _ in pending]).cpu()
    return indices, losses


def nonfinite_samples(pending: list[Observation]) -> list[int]:
    """The samples of ``pending`` whose loss is NaN or inf (a rare path: reads the device)."""
    indices, losses = on_cpu(pending, 1)  # the component count shapes only an empty result
    return indices[~torch.isfinite(losses).all(1)].tolist()


def checked(
    indices: torch.Tensor, losses: torch.Tensor, num_samples: int, nonfinite: str, where: str = ""
) -> tuple[Observation, int]:
    """Observations fit for the score table.

    Args:
        indices: sample indices on the CPU, [n].
        losses: their losses on the CPU, [n, C].
        num_samples: the training set's size.
        nonfinite: "raise" refuses a NaN or inf loss; "skip" leaves it out.
        where: where the losses come from, for the message (e.g. "at optimiser step 3 of epoch 1").

    Returns:
        ((indices, losses) kept, the count of non-finite ones left out).

    Raises:
        ValueError: a non-finite loss under "raise"; an index outside [0, num_samples).
    """
    finite = torch.isfinite(losses).all(1)
    skipped = 0
    if not finite.all():
        if nonfinite == "raise":
            samples = indices[~finite][:8].tolist()
            raise ValueError(
                f"non-finite per-sample loss {where + ' ' if where else ''}for samples {samples}: the model diverged "
                "or the data holds invalid values (selection.nonfinite: skip leaves such losses out of the scores)"
            )
        skipped = int((~finite).sum())
        indices, losses = indices[finite], losses[finite]
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= num_samples):
        # a negative index would silently overwrite another sample's score
        raise ValueError(
            f"sample indices must lie in [0, {num_samples}), got [{int(indices.min())}, {int(indices.max())}]: "
            "batches must carry their position in the training set"
        )
    return (indices, losses), skipped


def check_shape(losses: torch.Tensor, components: tuple[str, ...]) -> None:
    """Refuses, in one line, losses that are not one per sample ([B], or [B, C] with components).

    Raises:
        ValueError: another shape.
    """
    expected = (len(components),) if components else ()
    if tuple(losses.shape[1:]) != expected:
        wanted = f"[B, {len(components)}] (components {list(components)})" if components else "[B]"
        raise ValueError(
            f"update() wants one loss per sample, shape {wanted}, got {tuple(losses.shape)}: "
            "compute the loss with reduction='none' (and average over tokens per sample)"
            + ("" if components or losses.ndim != 2 else "; name the components with components=")
        )


def step_may_go_on(finite: torch.Tensor | bool | None, nonfinite: str, message: Callable[..., str], *pieces) -> bool:
    """``selection.nonfinite``'s rule at an optimiser step, one for the ``Selector`` and the
    ``StreamSelector``: agreed by every rank (a collective under torch.distributed).

    Args:
        finite: whether the step's losses were all finite on this rank (None: none recorded).
        nonfinite: "raise" or "skip".
        message: makes the line that stops the run from ``pieces``, called only where it stops.
        *pieces: ``message``'s arguments.

    Returns:
        True where every rank's losses were finite; False where one was not under "skip" (the
        step is skipped).

    Raises:
        ValueError: a NaN or inf loss on any rank under "raise", with ``message(*pieces)``.
    """
    if (ok := all_agree(True if finite is None else bool(finite))) or nonfinite == "skip":
        return ok
    raise ValueError(message(*pieces))


def nonfinite_message(pending: list[Observation], step: int, epoch: int) -> str:
    """The line that stops a run at the optimiser step whose losses (``pending``) were NaN or inf."""
    samples = nonfinite_samples(pending)
    where = f"samples {samples[:8]}" if samples else "another rank's samples"
    return (
        f"non-finite loss at optimiser step {step} of epoch {epoch + 1} for {where}, before the step used it: "
        "the model diverged or the data holds invalid values (selection.nonfinite: skip skips such steps)"
    )


def stream_nonfinite_message(batch: int) -> str:
    """The line that stops a stream run at the optimiser step after its training ``batch``."""
    return (
        f"non-finite loss at the optimiser step after training batch {batch} of the stream, before the step used "
        "it: the model diverged or the data holds invalid values (selection.nonfinite: skip skips such steps)"
    )


def merged(
    pending: list[Observation], components: int, num_samples: int, nonfinite: str, where: str = ""
) -> tuple[Observation, int]:
    """Every rank's pending observations, checked on each (``checked``) and gathered in rank order
    (a collective under torch.distributed): ((indices, losses), this rank's non-finite ones left out)."""
    (indices, losses), skipped = checked(*on_cpu(pending, components), num_samples, nonfinite, where)
    return all_gather_observations(indices, losses), skipped


def origin(from_pass: bool, steps: int, epoch: int) -> str:
    """Where merged losses come from, for a NaN's message: a scoring pass, the optimiser step after
    the ``steps`` checked so far (``Selector.step_finite``), or the epoch where no step was checked.

    >>> origin(False, 9, 0)
    'at optimiser step 10 of epoch 1'
    """
    if from_pass:
        return "in a scoring pass"
    return f"at optimiser step {steps + 1} of epoch {epoch + 1}" if steps else f"in epoch {epoch + 1}"
