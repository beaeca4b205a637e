"""The Trainer features users rely on, with AtteNTTrainer: under ``method="full"`` each is plain Trainer's, side by
side on the same tiny Llama (a log history of Trainer's rows only, a resume with a changed batch size or
accumulation, ``auto_find_batch_size``, an overridden ``get_train_dataloader``, an ``IterableDataset``); under a
selection the log history still reads as Trainer's (its metrics in the rows that carry the loss), a resume with a
changed batch size trains the uninterrupted run's subsets, and a subclass's own loader is followed or refused in
one line before training."""

from __future__ import annotations

import pytest
import torch
from attent.integrations.huggingface import AtteNTTrainer
from attent.selection.config import SelectionConfig
from torch.utils.data import DataLoader, IterableDataset
from transformers import Trainer, TrainerCallback

from tests.helpers.hf_tiny import collate, flat_weights, samples, selection_rows, tiny_llama, training_args
from tests.integrations.test_hf_conformance import trainer_rows

FULL = SelectionConfig(method="full")


def build(cls, output_dir, selection=FULL, data=None, **overrides):
    extra = {"selection": selection} if issubclass(cls, AtteNTTrainer) else {}
    return cls(
        model=tiny_llama(),
        args=training_args(output_dir, train_sampling_strategy="sequential", **overrides),
        train_dataset=samples() if data is None else data,
        data_collator=collate,
        **extra,
    )


def assert_same(ours: Trainer, plain: Trainer) -> None:
    assert [sorted(row) for row in ours.state.log_history] == [sorted(row) for row in plain.state.log_history]
    assert trainer_rows(ours) == trainer_rows(plain)
    assert torch.equal(flat_weights(ours.model), flat_weights(plain.model))
    assert ours.state.global_step == plain.state.global_step > 0


# --- method full: Trainer, feature by feature ------------------------------------------------------------------
def test_full_logs_trainers_rows_only(tmp_path):
    """Every row Trainer's, with its keys: code reading ``[row["loss"] for row in log_history[:-1]]`` works."""
    ours, plain = (build(cls, tmp_path / cls.__name__, num_train_epochs=2) for cls in (AtteNTTrainer, Trainer))
    ours.train()
    plain.train()
    assert_same(ours, plain)
    assert [row["loss"] for row in ours.state.log_history[:-1]]


@pytest.mark.parametrize("change", [dict(per_device_train_batch_size=8), dict(gradient_accumulation_steps=2)])
def test_full_resumes_with_a_changed_batch_size_or_accumulation_as_trainer(change, tmp_path):
    runs = []
    for cls in (AtteNTTrainer, Trainer):
        first = build(cls, tmp_path / cls.__name__, save_strategy="steps", save_steps=3)
        first.train()
        resumed = build(cls, tmp_path / f"{cls.__name__}-resumed", **change)
        resumed.train(resume_from_checkpoint=str(tmp_path / cls.__name__ / "checkpoint-3"))
        runs.append(resumed)
    assert_same(*runs)


@pytest.mark.parametrize("selection", [FULL, SelectionConfig(preset="llm")], ids=["full", "llm"])
def test_resume_true_without_a_checkpoint_is_refused_as_trainer(selection, tmp_path):
    """``resume_from_checkpoint=True`` on an output_dir with no checkpoint: Trainer's ValueError, not a
    silent run from scratch (what Hugging Face's ``test_can_resume_training`` found)."""
    for cls in (AtteNTTrainer, Trainer):
        trainer = build(cls, tmp_path / cls.__name__, selection=selection)
        with pytest.raises(ValueError, match="No valid checkpoint found"):
            trainer.train(resume_from_checkpoint=True)
        assert trainer.state.global_step == 0


class OutOfMemoryOnce(TrainerCallback):
    """Simulates CUDA running out of memory at the first step of a batch of ``limit`` or more, as
    Hugging Face's own tests do: Trainer then halves the batch and starts again."""

    def __init__(self, limit: int = 8):
        self.limit = limit

    def on_step_end(self, args, state, control, **kwargs):
        if state.train_batch_size >= self.limit:
            raise RuntimeError("CUDA out of memory.")


@pytest.mark.parametrize("selection", [FULL, SelectionConfig(preset="llm")], ids=["full", "llm"])
def test_auto_find_batch_size_halves_the_batch_as_trainer(selection, tmp_path):
    """Trainer's batch-size search restarts training with half the batch; a selecting run plans again for it."""
    ours = build(AtteNTTrainer, tmp_path / "ours", selection, per_device_train_batch_size=16, auto_find_batch_size=True)
    ours.add_callback(OutOfMemoryOnce())
    ours.train()
    batch = ours._train_batch_size  # accelerate's search steps down until no step fails
    assert batch < 8 and ours.state.train_batch_size == batch
    if selection is FULL:
        plain = build(Trainer, tmp_path / "plain", per_device_train_batch_size=16, auto_find_batch_size=True)
        plain.add_callback(OutOfMemoryOnce())
        plain.train()
        assert_same(ours, plain)
    else:  # all 40, then the 28 hardest twice, in the batches found
        assert ours.state.global_step == ours.selector.planned_steps(batch) == 2 * -(-28 // batch) - (-40 // batch)


class TwoLoaders:
    """A subclass's loader of loaders, as Hugging Face's own CustomDataloaderTrainer returns."""

    def __init__(self, loaders):
        self.loaders = loaders

    def __len__(self):
        return sum(len(loader) for loader in self.loaders)

    def __iter__(self):
        for loader in self.loaders:
            yield from loader


def with_own_loader(base, loader_of):
    class Own(base):
        def get_train_dataloader(self):
            return loader_of(self)

    return Own


def test_full_follows_an_overridden_get_train_dataloader_as_trainer(tmp_path):
    def twice(trainer):
        return TwoLoaders([super(type(trainer), trainer).get_train_dataloader() for _ in range(2)])

    ours = build(with_own_loader(AtteNTTrainer, twice), tmp_path / "ours", max_steps=24)
    plain = build(with_own_loader(Trainer, twice), tmp_path / "plain", max_steps=24)
    ours.train()
    plain.train()
    assert_same(ours, plain)


class Stream(IterableDataset):
    def __iter__(self):
        yield from samples()


def test_full_trains_on_an_iterable_dataset_as_trainer(tmp_path):
    ours = build(AtteNTTrainer, tmp_path / "ours", data=Stream(), max_steps=12)
    plain = build(Trainer, tmp_path / "plain", data=Stream(), max_steps=12)
    ours.train()
    plain.train()
    assert_same(ours, plain)


# --- selecting: the same features where a subset can be expressed ---------------------------------------------
@pytest.mark.parametrize("preset", ["llm", "vit"])
def test_a_selecting_run_logs_its_selection_in_trainers_rows(preset, tmp_path):
    """No row of its own: every row but the run's summary carries a loss, each epoch's selection one of them."""
    trainer = build(AtteNTTrainer, tmp_path, SelectionConfig(preset=preset), logging_steps=5)
    trainer.train()
    rows = trainer.state.log_history
    assert all("loss" in row for row in rows[:-1]) and "train_runtime" in rows[-1]
    assert len(selection_rows(trainer)) == 3  # one per epoch, each a loss row (at the epoch's end when not logged)


@pytest.mark.parametrize("preset", ["llm", "vit"])
@pytest.mark.parametrize("change", [dict(per_device_train_batch_size=8), dict(gradient_accumulation_steps=3)])
def test_a_resume_with_a_changed_batching_trains_the_uninterrupted_runs_subsets(preset, change, tmp_path):
    """Learning rate 0, so every sample keeps its loss: the resumed run, re-planned from the epoch it resumes in (its
    remaining samples in the new batches), picks exactly the uninterrupted run's subsets from then on."""
    selection = SelectionConfig(preset=preset)
    whole = build(AtteNTTrainer, tmp_path / "whole", selection, learning_rate=0.0, save_strategy="steps", save_steps=3)
    whole.train()
    resumed = build(AtteNTTrainer, tmp_path / "resumed", selection, learning_rate=0.0, **change)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-3"))
    assert [(r.epoch, r.indices.tolist()) for r in resumed.selector.history] == [
        (r.epoch, r.indices.tolist()) for r in whole.selector.history
    ]
    assert [r["subset_checksum"] for r in selection_rows(resumed)] == [
        r["subset_checksum"] for r in selection_rows(whole)
    ][-len(selection_rows(resumed)) :]
    assert resumed.selector.samples_backpropagated == whole.selector.samples_backpropagated


def test_a_subclass_loader_on_the_selections_sampler_is_followed(tmp_path):
    def own(trainer):
        return DataLoader(
            trainer.train_dataset,
            batch_size=trainer._train_batch_size,
            sampler=trainer._get_train_sampler(),
            collate_fn=collate,
        )

    selection = SelectionConfig(preset="llm")
    theirs = build(with_own_loader(AtteNTTrainer, own), tmp_path / "theirs", selection)
    ours = build(AtteNTTrainer, tmp_path / "ours", selection)
    theirs.train()
    ours.train()
    assert [r["subset_checksum"] for r in selection_rows(theirs)] == [
        r["subset_checksum"] for r in selection_rows(ours)
    ]
    assert torch.equal(flat_weights(theirs.model), flat_weights(ours.model))


@pytest.mark.parametrize("loader", ["another sampler", "two loaders"])
def test_a_subclass_loader_off_the_selections_sampler_is_refused_before_training(loader, tmp_path):
    def own(trainer):
        if loader == "two loaders":
            return TwoLoaders([super(type(trainer), trainer).get_train_dataloader() for _ in range(2)])
        return DataLoader(trainer.train_dataset, batch_size=4, shuffle=True, collate_fn=collate)

    trainer = build(with_own_loader(AtteNTTrainer, own), tmp_path, SelectionConfig(preset="llm"))
    weights = flat_weights(trainer.model).clone()
    with pytest.raises(ValueError, match="Own's get_train_dataloader .*_get_train_sampler") as error:
        trainer.train()
    assert "\n" not in str(error.value)
    assert trainer.state.global_step == 0 and torch.equal(flat_weights(trainer.model), weights)
