"""AtteNT in Hugging Face's ``Trainer`` on a stream: an ``IterableDataset`` (torch's, or Hugging Face
``datasets``' streamed or ``to_iterable_dataset()`` one) under a selecting method trains on the
batches of a ``StreamSelector`` (``attent.selection.stream``) instead of the planned epochs.

    pools        this rank's share of the stream (``datasets.distributed.split_dataset_by_node`` for
                 a Hugging Face dataset, else every world_size-th item), read as Trainer reads it
                 (its loader's workers where ``dataloader_num_workers`` > 0), batched by the
                 Trainer's collator, each pool of ceil(B / r) items scored by the trainer's own
                 per-sample loss (``_scoring_losses``: the scoring pass's), B the per-device batch
    length       ``max_steps`` x ``gradient_accumulation_steps`` training batches (Trainer needs
                 ``max_steps`` for an IterableDataset); warm-up is ``warmup_epochs`` of
                 ``num_train_epochs`` of them; Trainer's own run length and LR schedule
    step         Trainer's own loss on each picked batch (no per-sample weight, every batch trained
                 as it is), the batch reaching the device through ``training_step``; its loss checked
                 before the optimiser step uses it (``StreamSelector.step_finite``: a NaN or inf
                 stops the run or skips the step, as ``selection.nonfinite`` says)
    logs         each row with a ``loss``: ``selected_ratio`` (B / the latest pool's size) and
                 ``samples_scored`` (this rank's scoring forwards so far)
    resume       each checkpoint holds this rank's ``StreamSelector`` state (``STREAM_STATE_FILE``);
                 a resumed run goes on at its place in the stream and Trainer skips no batch itself

The loader is lazy (no worker, no look-ahead): a pool is scored when Trainer asks for its batch,
under the weights of the step it trains (accelerate's loader fetches a batch ahead, and would
score the next step's pool before this step's update). The mixin (``huggingface``) delegates here.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, has_length, seed_worker

from ..selection import metric_names as names
from ..selection.stream import StreamSelector, check_streamable
from .loaders import EveryNth, rank_share

# This rank's StreamSelector state in a checkpoint folder
STREAM_STATE_FILE = "attent_stream_rank{rank}.pt"


def is_stream(dataset) -> bool:
    """Whether ``dataset`` is read as a stream: an IterableDataset, or an iterable without a length."""
    return dataset is not None and (isinstance(dataset, IterableDataset) or not has_length(dataset))


def streams(trainer) -> bool:
    """Whether ``trainer`` selects from a stream (its ``train_dataset`` one, its method selecting)."""
    return trainer.selects and is_stream(trainer.train_dataset)


def stream_problem(trainer) -> str | None:
    """What a stream run cannot follow, and the fix; None where nothing, or where ``trainer``'s
    training set is no stream."""
    if not is_stream(trainer.train_dataset):
        return None
    try:
        check_streamable(trainer.selection)
    except ValueError as error:
        return str(error)
    if trainer.args.max_steps <= 0:
        return (
            "an IterableDataset has no length to count epochs by: set max_steps (the run's optimiser steps; "
            "warm-up is warmup_epochs of num_train_epochs of them)"
        )
    if trainer.args.num_train_epochs <= 0 and trainer.selection.warmup_epochs:
        return (
            f"warm-up is warmup_epochs of num_train_epochs of the max_steps, and num_train_epochs="
            f"{trainer.args.num_train_epochs}: set num_train_epochs above 0 (the run's length in epochs)"
        )
    return None


# --- the loader -------------------------------------------------------------------------------------------
def train_loader(trainer) -> DataLoader:
    """The training loader of a stream run: the batches of a ``StreamSelector`` built on this
    rank's share of the stream, restored from the checkpoint the run resumes from."""
    args = trainer.args
    dataset, collator = trainer._training_data()
    collate, loss_fn = _scoring(trainer, collator)
    trainer.selection_seed = args.seed if trainer.seed is None else trainer.seed
    selector = StreamSelector(
        _read(rank_share(dataset, args.process_index, args.world_size), args),
        selection=trainer.selection,
        batch_size=trainer._train_batch_size,
        batches=args.max_steps * args.gradient_accumulation_steps,
        epochs=args.num_train_epochs if args.num_train_epochs > 0 else 1.0,
        seed=trainer.selection_seed,
        model=trainer.model,
        loss_fn=loss_fn,
        collate_fn=collate,
        rank=args.process_index,
    )
    if trainer.resume_from is not None:
        selector.load_state_dict(load_state(trainer, trainer.resume_from))
    trainer.stream_selector = selector
    if not any(isinstance(callback, _StreamEvents) for callback in trainer.callback_handler.callbacks):
        trainer.add_callback(_StreamEvents(trainer))
    return DataLoader(_Batches(selector), batch_size=None, collate_fn=_as_is, pin_memory=args.dataloader_pin_memory)


def _read(stream, args):
    """The stream as Trainer's own loader reads it: in this process, or item by item through
    ``dataloader_num_workers`` workers (in order)."""
    if args.dataloader_num_workers == 0:
        return stream
    stream = stream if isinstance(stream, IterableDataset) else EveryNth(stream, 0, 1)
    return DataLoader(stream, batch_size=None, collate_fn=_as_is, **worker_options(args))


def worker_options(args) -> dict[str, Any]:
    """A DataLoader's worker arguments as Trainer's own training loader takes them from ``args``
    (its ``dataloader_*`` settings; each worker seeded by ``seed_worker``).

    Args:
        args: the trainer's ``TrainingArguments``.

    Returns:
        DataLoader keyword arguments.
    """
    return {
        "num_workers": args.dataloader_num_workers,
        "persistent_workers": args.dataloader_persistent_workers,
        "multiprocessing_context": args.dataloader_multiprocessing_context,
        "prefetch_factor": args.dataloader_prefetch_factor,
        "in_order": args.dataloader_in_order,
        "worker_init_fn": partial(seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index),
    }


def _scoring(trainer, collator):
    """(collate, loss_fn) for the StreamSelector: the Trainer's collator, and the trainer's scoring
    loss checked to give one loss per item of the pool."""
    items = [0]

    def collate(batch: list) -> Any:
        items[0] = len(batch)
        return collator(batch)

    def loss_fn(model, batch) -> torch.Tensor:
        scores = trainer._scoring_losses(model, batch)
        if scores.numel() != items[0]:
            raise ValueError(
                f"{trainer.trainer_name}: a pool of {items[0]} items gave {scores.numel()} losses: the collator "
                "merges samples (packing, padding-free), losing which sample each loss belongs to; use a padding collator "
                "or transformers' DataCollatorWithFlattening"
            )
        return scores

    return collate, loss_fn


def _as_is(item):
    return item


class _Batches(IterableDataset):
    """The StreamSelector's batches, once: a stream that ran dry ends the run (Trainer would
    iterate its loader again, for another epoch of ``max_steps``)."""

    def __init__(self, selector: StreamSelector):
        self.selector, self.ended = selector, False

    def __iter__(self):
        if not self.ended:
            yield from self.selector
            self.ended = True


# --- where the run goes on, and what it logs ---------------------------------------------------------------
def save_state(trainer, output_dir: str) -> None:
    """Writes this rank's StreamSelector state into the checkpoint Trainer saves now in
    ``output_dir`` (a stream run's; nothing for another)."""
    selector = getattr(trainer, "stream_selector", None)
    if selector is None or not streams(trainer):
        return
    folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
    os.makedirs(folder, exist_ok=True)
    state = {"stream": selector.state_dict(), "world_size": trainer.args.world_size}
    torch.save(state, os.path.join(folder, STREAM_STATE_FILE.format(rank=trainer.args.process_index)))


def load_state(trainer, folder: str) -> dict[str, Any]:
    """This rank's StreamSelector state in the checkpoint ``folder`` (with ``ignore_data_skip``:
    the stream read again from its start).

    Raises:
        ValueError: the folder holds no stream state, or was written by another number of processes.
    """
    owner, args = trainer.trainer_name, trainer.args
    path = os.path.join(folder, STREAM_STATE_FILE.format(rank=args.process_index))
    if not os.path.isfile(path):
        raise ValueError(
            f"{owner}: {folder} holds no AtteNT stream state: resume from a checkpoint a stream run of {owner} wrote"
        )
    saved = torch.load(path, weights_only=True)
    if saved["world_size"] != args.world_size:
        raise ValueError(
            f"{owner}: {folder} was written by {saved['world_size']} process(es), each at its own place in its "
            f"share of the stream: resume it on as many (not {args.world_size})"
        )
    return {**saved["stream"], "drawn": 0} if args.ignore_data_skip else saved["stream"]


def training_start(trainer, trained: tuple[int, int]) -> tuple[int, int]:
    """Trainer's (epoch, batches to skip) where it resumes: a stream run skips no batch (its
    StreamSelector goes on at the checkpoint's place; Trainer's skip would draw and drop more)."""
    return (trained[0], 0) if streams(trainer) else trained


def record_loss(trainer, loss: torch.Tensor) -> torch.Tensor:
    """``loss``, a training step's, noted for its optimiser step's check where ``trainer`` selects
    from a stream (``StreamSelector.record_loss``); another run's is passed through."""
    selector = getattr(trainer, "stream_selector", None)
    if selector is not None and streams(trainer):
        selector.record_loss(loss)
    return loss


def step_finite(trainer) -> bool:
    """Whether a stream run's optimiser step may go on (``StreamSelector.step_finite``: raises a NaN or
    inf loss under ``selection.nonfinite: raise``); True for another run."""
    selector = getattr(trainer, "stream_selector", None)
    return selector is None or not streams(trainer) or selector.step_finite()


def logged(trainer, logs: dict[str, float]) -> dict[str, float]:
    """``logs`` with the stream's selection where the row carries a training ``loss``."""
    selector = getattr(trainer, "stream_selector", None)
    if selector is None or "loss" not in logs or not streams(trainer):
        return logs
    return {**logs, names.SELECTED_RATIO: selector.last_ratio, names.SAMPLES_SCORED: selector.samples_scored}


class _StreamEvents(TrainerCallback):
    """A stream run's epoch, as Trainer's own counts it for an IterableDataset (the steps taken /
    ``max_steps``) also after a resume, where Trainer's count restarts at the resumed step."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if streams(self.trainer) and state.max_steps > 0:
            state.epoch = state.global_step / state.max_steps
        return control
