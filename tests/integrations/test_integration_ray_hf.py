"""AtteNTTrainer under Ray Train (issue 28, item 4): what Ray's ``prepare_trainer`` does to an AtteNTTrainer (swaps its class for a
subclass whose get_train_dataloader defers to AtteNTTrainer's unless the train set is a Ray Data
iterable, which AtteNTTrainer refuses)."""

from __future__ import annotations

import json

import pytest
import torch
from attent.integrations.huggingface import AtteNTTrainer
from attent.selection.config import SelectionConfig
from attent.selection.strategies import subset_checksum
from ray.data.iterator import _IterableFromIterator
from ray.train.huggingface.transformers import prepare_trainer

from tests.helpers.hf_tiny import RecordingTrainer, collate, samples, selection_rows, tiny_llama, training_args


def test_prepare_trainer_keeps_attents_loader(tmp_path):
    """prepare_trainer changes the trainer's class, not its loader: every epoch still trains on the
    Selector's subset, and messages still name the class the user built. Each epoch-end checkpoint's
    log history (what RayTrainReportCallback reports) holds that epoch's selection."""
    trainer = RecordingTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path, num_train_epochs=3, save_strategy="epoch"),
        train_dataset=samples(),
        data_collator=collate,
        selection=SelectionConfig(preset="vit"),
    )
    prepared = prepare_trainer(trainer)
    assert prepared is trainer and type(prepared).__name__ == "RayTransformersTrainer"
    prepared.train()
    assert len({tuple(subset) for subset in prepared.subsets.values()}) > 1  # re-selections happened
    for epoch, subset in prepared.subsets.items():
        assert sorted(prepared.trained[epoch]) == sorted(subset)  # the batches drew the Selector's subset
    rows = selection_rows(prepared)  # one per epoch, at its end
    assert [row["subset_checksum"] for row in rows] == [
        subset_checksum(torch.tensor(s)) for s in prepared.subsets.values()
    ]
    for row in rows:
        saved = json.loads((tmp_path / f"checkpoint-{row['step']}" / "trainer_state.json").read_text())
        last = [r for r in saved["log_history"] if "subset_checksum" in r][-1]
        assert (last["step"], last["subset_checksum"]) == (row["step"], row["subset_checksum"])
    with pytest.raises(ValueError, match=r"^RecordingTrainer: a batch without 'labels'"):
        prepared.per_sample_loss(prepared.model, {"input_ids": torch.tensor([[1, 2]])})


def test_a_ray_data_iterable_is_refused_in_one_line(tmp_path):
    """The one case where prepare_trainer replaces the train loader (a Ray Data shard's iterator)
    never reaches it: the trainer is refused when built, by Trainer itself (no length, no
    max_steps) or, with the max_steps Ray's guide sets for Ray Data, by AtteNTTrainer naming it."""
    shard = _IterableFromIterator(lambda: iter(samples()))  # what get_dataset_shard(...).iter_torch_batches() is
    for max_steps, message in [
        (-1, r"^The train_dataset does not implement __len__"),
        (10, r"^AtteNTTrainer: a Ray Data iterable .*pass the whole map-style dataset"),
    ]:
        with pytest.raises(ValueError, match=message) as error:
            AtteNTTrainer(
                model=tiny_llama(),
                args=training_args(tmp_path, max_steps=max_steps),
                train_dataset=shard,
                data_collator=collate,
                selection=SelectionConfig(preset="llm"),
            )
    assert "\n" not in str(error.value)


def test_a_process_group_the_trainer_does_not_see_is_refused(tmp_path):
    """Ray Train sets up torch.distributed before the training function; on CPUs accelerate joins it
    only with use_cpu=True, and without it every worker would train alone on all of every subset."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)  # what Ray's workers hold
    try:
        with pytest.raises(
            ValueError,
            match=r"^AtteNTTrainer: torch.distributed holds 2 processes but the "
            r"TrainingArguments see 1: .*set use_cpu=True",
        ) as error:
            AtteNTTrainer(
                model=tiny_llama(),
                args=training_args(tmp_path, use_cpu=False),
                train_dataset=samples(),
                data_collator=collate,
                selection=SelectionConfig(preset="llm"),
            )
    finally:
        dist.destroy_process_group()
    assert "\n" not in str(error.value)
