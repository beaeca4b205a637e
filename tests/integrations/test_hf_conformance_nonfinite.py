"""NaN and inf losses as Trainer treats them: the batch trains on (its loss is what it is, ``logging_nan_inf_filter``
keeps it out of the logs), the sample's loss is no score (the Teacher leaves it out of its table: the sample keeps its
previous score, or stays unscored), each epoch logs ``samples_nonfinite``, and ``nonfinite="raise"`` stops instead.
The engine's Teacher still refuses them unless told to skip.

The model here adds a constant NaN (or inf) to the loss of marked samples: the loss is not finite, its gradient is,
so training goes on as it would in Trainer."""

from __future__ import annotations

import math

import pytest
import torch
from attent.integrations.huggingface import AtteNTTrainer
from attent.selection.config import SelectionConfig
from attent.selection.teacher import Teacher
from transformers import Trainer

from tests.helpers.hf_tiny import flat_weights, selection_rows
from tests.integrations.test_hf_conformance import trainer_rows
from tests.integrations.test_hf_conformance_splits import float_labels_collate, model_of, targets
from tests.integrations.test_integration_hf_architectures import VOCAB, training_args

POISON = {2: math.nan, 1: math.inf}  # first token -> the constant added to the sample's loss (data uses ids >= 3)
MARKED = {3: 2, 10: 1}  # sample -> its first token


class PoisonedRegressor(torch.nn.Module):
    """Squared error of one output per sample, plus a NaN or inf constant for marked samples (no gradient)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.EmbeddingBag(VOCAB, 1, mode="sum")

    def terms(self, input_ids, attention_mask, labels):
        prediction = self.embedding(input_ids, per_sample_weights=attention_mask.float()).squeeze(-1)
        poison = torch.zeros(len(input_ids))
        for token, value in POISON.items():
            poison = torch.where(input_ids[:, 0] == token, value, poison)
        return (prediction - labels) ** 2 + poison

    def forward(self, input_ids, attention_mask=None, labels=None):
        loss = None if labels is None else self.terms(input_ids, attention_mask, labels).mean()
        return {"loss": loss, "logits": self.embedding(input_ids, per_sample_weights=attention_mask.float())}


def marked_items(n: int = 40) -> list[dict]:
    items = targets("one", n)
    for sample, token in MARKED.items():
        items[sample] = {**items[sample], "input_ids": [token] + items[sample]["input_ids"][1:]}
    return items


def poisoned_terms(model, inputs):
    return model.terms(inputs["input_ids"], inputs["attention_mask"], inputs["labels"])


def comparable(rows: list[dict]) -> list[dict]:
    return [{key: "nan" if value != value else value for key, value in row.items()} for row in rows]


# --- the Teacher: the engine refuses, the trainer's skips -------------------------------------------------
def test_the_teachers_default_still_refuses_a_nonfinite_loss():
    teacher = Teacher(4, SelectionConfig(preset="llm"), 3)
    teacher.observe(torch.arange(4), torch.tensor([1.0, 2.0, math.inf, 0.5]))
    with pytest.raises(ValueError, match="non-finite per-sample loss for samples \\[2\\]"):
        teacher.sync()  # where the losses reach the host: the epoch's merge


def test_a_skipped_inf_is_never_the_hardest():
    """A sample scored low keeps that score when its loss turns inf (the hard pick passes it by); one never scored
    stays unscored."""
    teacher = Teacher(
        6, SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5}, warmup_epochs=1), 3, nonfinite="skip"
    )
    teacher.begin_epoch(0)
    teacher.observe(torch.arange(6), torch.tensor([0.1, 5.0, 4.0, 3.0, 0.2, 1.0]))
    teacher.observe(torch.tensor([0, 5]), torch.tensor([math.inf, math.nan]))
    teacher.end_epoch()
    assert teacher.scores.tolist() == pytest.approx([0.1, 5.0, 4.0, 3.0, 0.2, 1.0])
    assert teacher.begin_epoch(1).tolist() == [1, 2, 3]
    fresh = Teacher(2, SelectionConfig(preset="llm"), 2, nonfinite="skip")
    fresh.begin_epoch(0)
    fresh.observe(torch.arange(2), torch.tensor([math.inf, 1.0]))
    fresh.end_epoch()
    assert math.isnan(fresh.scores[0]) and fresh.scores[1] == 1.0


# --- Trainer's own loss (method full): the same run, NaN filter on or off ---------------------------------
@pytest.mark.parametrize("nan_filter", [True, False])
def test_full_trains_on_a_nan_batch_as_trainer(nan_filter, tmp_path):
    runs = []
    for cls in (AtteNTTrainer, Trainer):
        extra = {"selection": SelectionConfig(method="full")} if cls is AtteNTTrainer else {}
        args = training_args(tmp_path / cls.__name__, logging_nan_inf_filter=nan_filter, gradient_accumulation_steps=2)
        trainer = cls(
            model=PoisonedRegressor(),
            args=args,
            train_dataset=marked_items(),
            data_collator=float_labels_collate,
            **extra,
        )
        trainer.train()
        runs.append(trainer)
    ours, plain = runs
    assert comparable(trainer_rows(ours)) == comparable(trainer_rows(plain))
    assert torch.equal(flat_weights(ours.model), flat_weights(plain.model))
    assert torch.isfinite(flat_weights(ours.model)).all()
    losses = [row["loss"] for row in trainer_rows(plain) if "loss" in row]
    assert all(map(math.isfinite, losses)) == nan_filter  # not vacuous: unfiltered, a NaN is logged


# --- selecting: the sample's loss is no score, the batch trains on ------------------------------------------
@pytest.mark.parametrize("preset", ["llm", "vit"])
def test_a_nan_batch_trains_on_under_selection(preset, tmp_path):
    trainer = AtteNTTrainer(
        model=PoisonedRegressor(),
        args=training_args(tmp_path, num_train_epochs=3),
        train_dataset=marked_items(),
        data_collator=float_labels_collate,
        selection=SelectionConfig(preset=preset),
        compute_per_sample_loss=poisoned_terms,
    )
    trainer.train()
    rows = selection_rows(trainer)
    assert trainer.state.global_step == trainer.selector.planned_steps(4) and len(rows) == 3
    assert torch.isfinite(flat_weights(trainer.model)).all()
    assert all(math.isfinite(row["loss"]) for row in trainer_rows(trainer) if "loss" in row)  # the NaN filter
    scores = trainer.selector.teacher.scores
    assert scores[list(MARKED)].isnan().all()  # never a score: unscored
    assert torch.isfinite(scores[[i for i in range(40) if i not in MARKED]]).all()
    # epoch 0: the llm preset trains on all 40, the vit preset scores all 40 first (and trains on some)
    assert rows[0]["samples_nonfinite"] == 2 if preset == "llm" else rows[0]["samples_nonfinite"] >= 2


def test_a_nan_label_trains_on_through_the_models_own_split(tmp_path):
    """A BERT regression head whose first batch holds a NaN label: that batch cannot tell the splits apart (its loss is
    NaN), a later one does; the NaN reaches the weights as in Trainer, and the run goes to its end."""
    items = targets("one", 40)
    items[0] = {**items[0], "labels": math.nan}
    trainer = AtteNTTrainer(
        model=model_of("bert regression"),
        args=training_args(tmp_path, num_train_epochs=2),
        train_dataset=items,
        data_collator=float_labels_collate,
        selection=SelectionConfig(preset="vit"),
    )
    trainer.train()
    rows = selection_rows(trainer)
    assert trainer.state.global_step == trainer.selector.planned_steps(4) and len(rows) == 2
    assert rows[0]["samples_nonfinite"] >= 1


def test_nonfinite_raise_stops_in_one_line(tmp_path):
    trainer = AtteNTTrainer(
        model=PoisonedRegressor(),
        args=training_args(tmp_path),
        train_dataset=marked_items(),
        data_collator=float_labels_collate,
        selection=SelectionConfig(preset="llm"),
        compute_per_sample_loss=poisoned_terms,
        nonfinite="raise",
    )
    # at the epoch's end, where its losses reach the host: its last batch's merge, before that step
    with pytest.raises(
        ValueError, match=r"non-finite per-sample loss for samples \[3, 10\].*nonfinite='skip'"
    ) as error:
        trainer.train()
    assert "\n" not in str(error.value) and trainer.state.global_step == 9
