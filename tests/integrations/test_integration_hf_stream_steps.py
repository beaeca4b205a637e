"""AtteNTTrainer on an IterableDataset (``huggingface_stream``), the training step's side: a NaN or inf loss of a
picked batch is checked before the optimiser step uses it, as ``selection.nonfinite`` says (raise: one line naming
the step; skip: the step's gradients dropped, the weights left as they were); the stream read through
``dataloader_num_workers`` workers gives the same pools, picks and resume; ``ignore_data_skip=True`` reads the stream
again from its start.

The tiny Llama, its items and the recording trainer are test_integration_hf_stream's: item i's first token is
50 + i, the stream holds its items in order, pools of 8 give batches of their 4 highest-loss items."""

from __future__ import annotations

from itertools import islice

import pytest
import torch
from attent.selection.config import SelectionConfig
from torch.utils.data import IterableDataset, get_worker_info
from transformers import TrainerCallback

from tests.helpers.hf_tiny import FIRST_TOKEN, collate, flat_weights, losses_of, tiny_llama, training_args
from tests.integrations.test_integration_hf_stream import HARD_HALF, ITEMS, Stream, StreamRecorder, highest


class WeightMoves(TrainerCallback):
    """Notes, at each optimiser step, whether it changed the weights."""

    def __init__(self):
        self.moved, self._before = [], None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self._before = flat_weights(model)

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.moved.append(not torch.equal(flat_weights(model), self._before))


def nan_in_training(model, marked: int):
    """``model`` whose training forward of a batch holding item ``marked`` is NaN (its embeddings are): its loss and
    gradients NaN; in eval mode (the pools' scoring) the item's loss is finite, and it can be picked."""

    def hook(module, args, output):
        if not module.training:
            return output
        rows = args[0][:, 0] == FIRST_TOKEN + marked
        return torch.where(rows[:, None, None], torch.full_like(output, float("nan")), output)

    model.model.embed_tokens.register_forward_hook(hook)
    return model


def stream_run(folder, model=None, dataset=None, nonfinite="raise", check=False, **overrides) -> StreamRecorder:
    moves = WeightMoves()
    trainer = StreamRecorder(
        model=model or tiny_llama(),
        args=training_args(folder, **{"max_steps": 6, **overrides}),
        train_dataset=dataset or Stream(),
        data_collator=collate,
        selection=SelectionConfig(**HARD_HALF, nonfinite=nonfinite),
        callbacks=[moves],
        check=check,
    )
    trainer.moves = moves
    return trainer


# --- selection.nonfinite on the training step's loss -------------------------------------------------------------
@pytest.fixture(scope="module")
def marked(tmp_path_factory) -> tuple[int, list[list[int]]]:
    """An item the uninterrupted run picks into its third batch (runs with it NaN are that run until that step),
    and that run's batches."""
    trainer = stream_run(tmp_path_factory.mktemp("finite"))
    trainer.train()
    return trainer.trained[2][0], trainer.trained


def test_a_nonfinite_step_loss_stops_a_stream_run_before_the_step_uses_it(marked, tmp_path):
    item, batches = marked
    trainer = stream_run(tmp_path, model=nan_in_training(tiny_llama(), item))
    with pytest.raises(ValueError) as error:
        trainer.train()
    assert str(error.value) == (
        "non-finite loss at the optimiser step after training batch 3 of the stream, before the step used it: the "
        "model diverged or the data holds invalid values (selection.nonfinite: skip skips such steps)"
    )
    assert trainer.trained == batches[:3] and trainer.moves.moved == [True, True]  # stopped before the 3rd step
    assert torch.isfinite(flat_weights(trainer.model)).all()


def test_a_nonfinite_step_loss_skips_the_step_under_skip(marked, tmp_path):
    item, batches = marked
    trainer = stream_run(tmp_path, model=nan_in_training(tiny_llama(), item), nonfinite="skip")
    trainer.train()
    assert trainer.trained[:3] == batches[:3] and item in trainer.trained[2] and trainer.state.global_step == 6
    assert trainer.moves.moved == [True, True, False, True, True, True]  # the 3rd step left the weights as they were
    assert torch.isfinite(flat_weights(trainer.model)).all()


# --- the stream read by the loader's workers ------------------------------------------------------------------
class WorkerShares(IterableDataset):
    """The items, each of the loader's workers yielding every num_workers-th from its id: the loader, reading its
    workers in turn, gives them back in the stream's order."""

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return islice(iter(ITEMS), start, None, step)


def test_workers_read_the_pools_and_a_resume_goes_on_as_the_uninterrupted_run(tmp_path):
    workers = dict(dataloader_num_workers=2, dataloader_persistent_workers=False)
    whole = stream_run(
        tmp_path / "whole", dataset=WorkerShares(), check=True, save_strategy="steps", save_steps=3, **workers
    )
    whole.train()
    assert whole.stream_selector.stream.num_workers == 2  # the stream read through the loader's workers
    assert [pool for pool, _, _ in whole.pools] == [list(range(8 * step, 8 * step + 8)) for step in range(6)]
    for batch, (pool, losses, _) in zip(whole.trained, whole.pools, strict=True):
        assert sorted(batch) == highest(pool, losses, 4)  # the B highest-loss items of each pool
    in_process = stream_run(tmp_path / "in_process")  # no worker, the same stream
    in_process.train()
    assert in_process.trained == whole.trained and losses_of(in_process) == losses_of(whole)
    resumed = stream_run(tmp_path / "resumed", dataset=WorkerShares(), **workers)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-3"))
    assert resumed.trained == whole.trained[3:] and losses_of(resumed, after=3) == losses_of(whole, after=3)


# --- ignore_data_skip ---------------------------------------------------------------------------------------------
def test_ignore_data_skip_reads_the_stream_again_from_its_start(tmp_path):
    whole = stream_run(tmp_path / "whole", save_strategy="steps", save_steps=3)
    whole.train()
    resumed = stream_run(tmp_path / "resumed", check=True, ignore_data_skip=True)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-3"))
    assert resumed.state.global_step == 6 and len(resumed.trained) == 3
    # the first three pools again (the uninterrupted run goes on with items 24 to 47), picked by the resumed model
    assert [pool for pool, _, _ in resumed.pools] == [list(range(8 * step, 8 * step + 8)) for step in range(3)]
    for batch, (pool, losses, _) in zip(resumed.trained, resumed.pools, strict=True):
        assert sorted(batch) == highest(pool, losses, 4)
    assert min(min(batch) for batch in whole.trained[3:]) >= 24
    rows = [row for row in resumed.state.log_history if "loss" in row and row["step"] > 3]
    assert [row["samples_scored"] for row in rows] == [32, 40, 48]  # the checkpoint's count goes on
