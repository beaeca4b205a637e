"""AtteNTTrainer refuses, in one line naming the fix, what breaks per-sample identity: settings, collators, checkpoints."""

from __future__ import annotations

import pytest
from attent.integrations.huggingface import STATE_FILE, AtteNTTrainer
from attent.selection.config import SelectionConfig
from torch.utils.data import IterableDataset
from transformers import Trainer

from tests.helpers.hf_tiny import collate, samples, tiny_llama, training_args


# --- (d) refusals, one line each, naming the fix ------------------------------------------------------------
class Stream(IterableDataset):
    def __iter__(self):
        return iter(samples())


def one_sample_per_row_lost(items):
    """A collator that concatenates the batch into one row, as packing does."""
    batch = collate(items)
    return {key: value.reshape(1, -1) for key, value in batch.items()}


REFUSED = {
    "infobatch": (dict(selection=SelectionConfig(method="infobatch")), {}, "InfoBatch"),
    "nothing to train": ({}, dict(num_train_epochs=0), "set num_train_epochs or max_steps above 0"),
    "group_by_length": ({}, dict(train_sampling_strategy="group_by_length"), "use 'random' or 'sequential'"),
    "compute_loss_func": (
        dict(compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.loss),
        {},
        "drop it",
    ),
    "label smoothing": ({}, dict(label_smoothing_factor=0.1), "label_smoothing_factor=0"),
    # a stream is selected from (tests/integrations/test_integration_hf_stream.py), but not by a method that indexes
    "iterable dataset, infobatch": (
        dict(train_dataset=Stream(), selection=SelectionConfig(method="infobatch")),
        dict(max_steps=10),
        "select with method attent",
    ),
    # DataCollatorWithFlattening is split by sample: its refusals are in test_integration_hf_flattening.py
    "batches out of order": (
        {},
        dict(dataloader_in_order=False, dataloader_num_workers=1),
        "keep dataloader_in_order=True",
    ),
}


@pytest.mark.parametrize("name", REFUSED)
def test_settings_that_break_the_selection_are_refused_in_one_line(name, tmp_path):
    kwargs, overrides, fix = REFUSED[name]
    kwargs = {
        "model": tiny_llama(),
        "train_dataset": samples(),
        "data_collator": collate,
        "selection": SelectionConfig(preset="llm"),
        **kwargs,
    }
    with pytest.raises(ValueError, match="AtteNTTrainer: ") as error:
        AtteNTTrainer(args=training_args(tmp_path, **overrides), **kwargs)
    assert fix in str(error.value) and "\n" not in str(error.value)


def test_a_collator_that_merges_samples_is_refused_at_the_first_batch(tmp_path):
    trainer = AtteNTTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path),
        train_dataset=samples(),
        data_collator=one_sample_per_row_lost,
        selection=SelectionConfig(preset="llm"),
    )
    with pytest.raises(ValueError, match="a batch of 1 rows holds 4 samples.*use a padding collator") as error:
        trainer.train()
    assert "\n" not in str(error.value)


def test_resuming_a_checkpoint_without_selection_state_is_refused_and_one_of_other_settings_replanned(tmp_path, caplog):
    Trainer(
        model=tiny_llama(),
        args=training_args(tmp_path / "plain", save_strategy="epoch", num_train_epochs=1),
        train_dataset=samples(),
        data_collator=collate,
    ).train()
    trainer = AtteNTTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path / "a"),
        train_dataset=samples(),
        data_collator=collate,
        selection=SelectionConfig(preset="llm"),
    )
    with pytest.raises(ValueError, match="holds no AtteNT selection state") as error:
        trainer.train(resume_from_checkpoint=str(tmp_path / "plain" / "checkpoint-10"))
    assert "\n" not in str(error.value)

    AtteNTTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path / "b", save_strategy="steps", save_steps=3, num_train_epochs=1),
        train_dataset=samples(),
        data_collator=collate,
        selection=SelectionConfig(preset="llm"),
    ).train()
    assert (tmp_path / "b" / "checkpoint-3" / STATE_FILE.format(rank=0)).is_file()
    other_batch = AtteNTTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path / "c", per_device_train_batch_size=8),
        train_dataset=samples(),
        data_collator=collate,
        selection=SelectionConfig(preset="llm"),
    )
    with caplog.at_level("WARNING", logger="attent"):
        other_batch.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-3"))
    said = [r.getMessage() for r in caplog.records if r.name == "attent"]
    assert said == [
        "AtteNTTrainer: resuming with batch_size 8 (was 4): re-planned from epoch 0 after its 3 step(s), on the checkpoint's subsets"
    ]
    # the 28 samples left of epoch 0, then two epochs of the 70 % (28), in batches of 8
    assert other_batch.state.global_step == 3 + 4 + 2 * 4
