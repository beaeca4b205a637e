"""NaN and inf losses under selection (``SelectionConfig.nonfinite``), checked before the optimiser step that would
use them (``Selector.step_finite``, from AtteNTTrainer's on_pre_optimizer_step):

* ``raise``, the default: the run stops at that step, in one line naming the samples and the step, with the model's
  parameters those of the step before (no optimiser step used the loss);
* ``skip``: that step is skipped (the parameters unchanged across it, where a step taken would move them), training
  goes on to the planned steps, the sample's loss is no score (it keeps its previous score, or stays unscored) and
  each epoch logs ``samples_nonfinite``.

``method="full"`` is Trainer's own run: it trains on a NaN batch as Trainer does.

The model here adds a constant NaN (or inf) to the loss of marked samples, from a given epoch on: the loss is not
finite, its gradient is, so a step taken on it would move the parameters by a finite amount, and a skipped step shows
as parameters unchanged. The data's order is sequential (``training_args``), 4 samples a step: sample i is trained at
step i // 4 + 1 of each epoch on all data."""

from __future__ import annotations

import math

import pytest
import torch
from attent.integrations.huggingface import AtteNTTrainer
from attent.selection.config import SelectionConfig
from attent.selection.selector import Selector
from transformers import Trainer, TrainerCallback

from tests.helpers.hf_tiny import flat_weights, selection_rows
from tests.integrations.test_hf_conformance import trainer_rows
from tests.integrations.test_hf_conformance_splits import float_labels_collate, model_of, targets
from tests.integrations.test_integration_hf_architectures import VOCAB, training_args

# first token -> (the constant added to the sample's loss, the epoch it is added from); the data uses ids >= 3
POISON = {2: (math.nan, 1), 1: (math.inf, 0)}
MARKED = {3: 2, 10: 1}  # sample -> its first token: sample 3 NaN from epoch 1 on, sample 10 inf from the start
N = 40  # samples; 10 steps of 4 in an epoch on all data


class PoisonedRegressor(torch.nn.Module):
    """Squared error of one output per sample, plus a NaN or inf constant for marked samples (no gradient) from their
    epoch on (``epoch``: set by ``Watch``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.EmbeddingBag(VOCAB, 1, mode="sum")
        self.epoch = 0

    def terms(self, input_ids, attention_mask, labels):
        prediction = self.embedding(input_ids, per_sample_weights=attention_mask.float()).squeeze(-1)
        poison = torch.zeros(len(input_ids))
        for token, (value, start) in POISON.items():
            if self.epoch >= start:
                poison = torch.where(input_ids[:, 0] == token, value, poison)
        return (prediction - labels) ** 2 + poison

    def forward(self, input_ids, attention_mask=None, labels=None):
        loss = None if labels is None else self.terms(input_ids, attention_mask, labels).mean()
        return {"loss": loss, "logits": self.embedding(input_ids, per_sample_weights=attention_mask.float())}


def marked_items(n: int = N, marked: dict[int, int] = MARKED) -> list[dict]:
    items = targets("one", n)
    for sample, token in marked.items():
        items[sample] = {**items[sample], "input_ids": [token] + items[sample]["input_ids"][1:]}
    return items


def poisoned_terms(model, inputs):
    return model.terms(inputs["input_ids"], inputs["attention_mask"], inputs["labels"])


def comparable(rows: list[dict]) -> list[dict]:
    return [{key: "nan" if value != value else value for key, value in row.items()} for row in rows]


class Watch(TrainerCallback):
    """Tells the model its epoch; keeps the parameters before training (``weights[0]``) and after each optimiser
    step (``weights[global_step]``), and the score table at each epoch's end."""

    def __init__(self, trainer: AtteNTTrainer | None = None):
        self.trainer, self.epochs_begun = trainer, 0
        self.weights: dict[int, torch.Tensor] = {}
        self.scores: list[torch.Tensor] = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = flat_weights(model).clone()

    def on_epoch_begin(self, args, state, control, model=None, **kwargs):
        model.epoch, self.epochs_begun = self.epochs_begun, self.epochs_begun + 1

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = flat_weights(model).clone()

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.trainer is not None and self.trainer.selector is not None:
            self.scores.append(self.trainer.selector.scores.clone())


def poisoned_trainer(
    tmp_path, selection: SelectionConfig, epochs: int = 3, marked: dict[int, int] = MARKED
) -> tuple[AtteNTTrainer, Watch]:
    watch = Watch()
    trainer = AtteNTTrainer(
        model=PoisonedRegressor(),
        args=training_args(tmp_path, num_train_epochs=epochs),
        train_dataset=marked_items(marked=marked),
        data_collator=float_labels_collate,
        selection=selection,
        compute_per_sample_loss=poisoned_terms,
        callbacks=[watch],
    )
    watch.trainer = trainer
    return trainer, watch


# --- raise (the default): stopped at the step, before it used the loss --------------------------------------------
def test_the_default_stops_at_the_optimiser_step_before_it_uses_the_loss(tmp_path):
    trainer, watch = poisoned_trainer(tmp_path, SelectionConfig(preset="llm"))
    assert trainer.selection.nonfinite == "raise"
    with pytest.raises(
        ValueError, match=r"non-finite loss at optimiser step 3 of epoch 1 for samples \[10\], before the step used it"
    ) as error:
        trainer.train()  # sample 10 (inf): the third step's batch, samples 8-11
    assert "\n" not in str(error.value)
    assert trainer.state.global_step == 2  # two steps taken, the third stopped
    weights = flat_weights(trainer.model)
    assert torch.equal(weights, watch.weights[2])  # the parameters of the step before
    assert torch.isfinite(weights).all()
    assert not torch.equal(watch.weights[2], watch.weights[0])  # not vacuous: the steps before moved them


def test_a_loss_in_the_epochs_last_batch_stops_before_its_step_too(tmp_path):
    """The trainer ends its selection epoch at the epoch's last batch, before that batch's step: the epoch's merge
    refuses the loss there (in its own words), and no step used it either."""
    trainer, watch = poisoned_trainer(tmp_path, SelectionConfig(preset="llm"), marked={38: 1})  # inf, step 10
    with pytest.raises(ValueError, match=r"non-finite .*loss .*for samples \[38\]") as error:
        trainer.train()
    assert "\n" not in str(error.value) and trainer.state.global_step == 9
    assert torch.equal(flat_weights(trainer.model), watch.weights[9])
    assert not torch.equal(watch.weights[9], watch.weights[8])


def test_a_scoring_pass_stops_on_a_nonfinite_score_before_any_step(tmp_path):
    """The vit preset scores every sample before epoch 0: sample 10's inf stops the run there."""
    trainer, watch = poisoned_trainer(tmp_path, SelectionConfig(preset="vit"))
    with pytest.raises(ValueError, match=r"non-finite .*loss .*for samples \[10\]"):
        trainer.train()
    assert trainer.state.global_step == 0 and torch.equal(flat_weights(trainer.model), watch.weights[0])


def test_a_skipped_inf_is_never_the_hardest():
    """On the Selector itself: a sample scored low keeps that score when its loss turns inf (the hard pick passes it
    by); one never scored stays unscored."""
    config = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5}, warmup_epochs=1, nonfinite="skip")
    selector = Selector(range(6), selection=config, epochs=3)
    selector.begin_epoch(0)
    selector.update(torch.tensor([0.1, 5.0, 4.0, 3.0, 0.2, 1.0]), torch.arange(6))
    selector.update(torch.tensor([math.inf, math.nan]), torch.tensor([0, 5]))
    assert selector.step_finite() is False  # skip: the step's caller leaves optimizer.step() out
    selector.end_epoch()
    assert selector.scores.tolist() == pytest.approx([0.1, 5.0, 4.0, 3.0, 0.2, 1.0])
    assert selector.metrics()["samples_nonfinite"] == 2
    assert selector.begin_epoch(1).tolist() == [1, 2, 3]
    fresh = Selector(range(2), selection=SelectionConfig(preset="llm", nonfinite="skip"), epochs=2)
    fresh.begin_epoch(0)
    fresh.update(torch.tensor([math.inf, 1.0]), torch.arange(2))
    fresh.end_epoch()
    assert math.isnan(fresh.scores[0]) and fresh.scores[1] == 1.0


# --- skip: the step skipped, the run goes on ------------------------------------------------------------------------
def test_skip_leaves_the_step_out_and_the_scores_as_they_were(tmp_path):
    """Epochs 0 and 1 on all data (a warm-up of 2), epoch 2 a hard pick. Sample 10's loss is inf from the start (its
    steps skipped, never a score); sample 3's NaN from epoch 1 (its step skipped, its epoch-0 score kept)."""
    trainer, watch = poisoned_trainer(tmp_path, SelectionConfig(preset="llm", warmup_epochs=2, nonfinite="skip"))
    trainer.train()
    rows = selection_rows(trainer)
    assert trainer.state.global_step == trainer.selector.planned_steps(4) and len(rows) == 3
    w = watch.weights
    # epoch 0: step 3 (samples 8-11) skipped; epoch 1: steps 11 (samples 0-3) and 13 (samples 8-11)
    for skipped in (3, 11, 13):
        assert torch.equal(w[skipped], w[skipped - 1]), skipped
        assert not torch.equal(w[skipped + 1], w[skipped]), skipped  # the next step is taken
    assert not torch.equal(w[2], w[1]) and not torch.equal(w[12], w[11])  # steps are taken: lr moves the weights
    assert torch.isfinite(flat_weights(trainer.model)).all()
    scores, (after_0, after_1, _) = trainer.selector.scores, watch.scores
    assert math.isnan(after_0[10]) and math.isnan(scores[10])  # never a score: unscored
    assert math.isfinite(after_0[3]) and after_1[3] == after_0[3]  # its score before the NaN, kept
    others = [i for i in range(N) if i not in MARKED]
    assert torch.isfinite(scores[others]).all()
    assert not torch.equal(after_1[others], after_0[others])  # not vacuous: epoch 1 re-scored the others
    assert [row["samples_nonfinite"] for row in rows[:2]] == [1, 2]
    assert all(math.isfinite(row["loss"]) for row in trainer_rows(trainer) if "loss" in row)  # the NaN filter


def test_skip_leaves_a_scoring_passs_nonfinite_score_out(tmp_path):
    """The vit preset's passes score sample 10 inf: no score, counted; the run goes on to its planned steps."""
    trainer, watch = poisoned_trainer(tmp_path, SelectionConfig(preset="vit", nonfinite="skip"))
    trainer.train()
    rows = selection_rows(trainer)
    assert trainer.state.global_step == trainer.selector.planned_steps(4) and len(rows) == 3
    assert rows[0]["samples_scored"] == N and rows[0]["samples_nonfinite"] >= 1  # the pass's sample 10 at least
    assert math.isnan(watch.scores[0][10]) and math.isnan(trainer.selector.scores[10])
    assert torch.isfinite(trainer.selector.scores[[i for i in range(N) if i != 10]]).all()
    assert torch.isfinite(flat_weights(trainer.model)).all()


def test_a_nan_label_is_skipped_through_the_models_own_split(tmp_path):
    """A BERT regression head whose first batch holds a NaN label (its loss and gradients NaN): that batch cannot tell
    the splits apart, a later one does; under skip its step is left out, the weights stay finite (a step taken
    would have made them NaN), and the run goes to its end."""
    items = targets("one", N)
    items[0] = {**items[0], "labels": math.nan}
    watch = Watch()
    trainer = AtteNTTrainer(
        model=model_of("bert regression"),
        args=training_args(tmp_path, num_train_epochs=2),
        train_dataset=items,
        data_collator=float_labels_collate,
        selection=SelectionConfig(preset="llm", nonfinite="skip"),
        callbacks=[watch],
    )
    trainer.train()
    rows = selection_rows(trainer)
    assert trainer.state.global_step == trainer.selector.planned_steps(4) and len(rows) == 2
    assert torch.equal(watch.weights[1], watch.weights[0])  # step 1, samples 0-3: skipped
    assert not torch.equal(watch.weights[2], watch.weights[1])
    assert torch.isfinite(flat_weights(trainer.model)).all()
    assert rows[0]["samples_nonfinite"] == 1 and math.isnan(trainer.selector.scores[0])


# --- method full: Trainer's own run, NaN filter on or off ---------------------------------------------------------
@pytest.mark.parametrize("nan_filter", [True, False])
def test_full_trains_on_a_nan_batch_as_trainer(nan_filter, tmp_path):
    runs = []
    for cls in (AtteNTTrainer, Trainer):
        extra = {"selection": SelectionConfig(method="full")} if cls is AtteNTTrainer else {}
        args = training_args(tmp_path / cls.__name__, logging_nan_inf_filter=nan_filter, gradient_accumulation_steps=2)
        model = PoisonedRegressor()
        model.epoch = 1  # both marked samples poisoned
        trainer = cls(model=model, args=args, train_dataset=marked_items(), data_collator=float_labels_collate, **extra)
        trainer.train()
        runs.append(trainer)
    ours, plain = runs
    assert comparable(trainer_rows(ours)) == comparable(trainer_rows(plain))
    assert torch.equal(flat_weights(ours.model), flat_weights(plain.model))
    assert torch.isfinite(flat_weights(ours.model)).all()
    losses = [row["loss"] for row in trainer_rows(plain) if "loss" in row]
    assert all(map(math.isfinite, losses)) == nan_filter  # not vacuous: unfiltered, a NaN is logged
