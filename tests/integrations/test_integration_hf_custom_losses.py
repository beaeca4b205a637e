"""AtteNTTrainer on models whose loss it cannot split by itself, built like the tiny architectures of
test_integration_hf_architectures (its data, collator and arguments): a loss no per-sample split
gives is refused before the first step, with the weights untouched; a plain module computing its
own mean loss trains as the plain Trainer; ``compute_per_sample_loss`` takes a regression head (which
also splits by itself: test_hf_conformance_splits.py)."""

from __future__ import annotations

import pytest
import torch
from attent.integrations.huggingface import AtteNTTrainer
from attent.selection.config import SelectionConfig
from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM, Trainer

from tests.helpers.hf_tiny import TINY_LLAMA, flat_weights, losses_of
from tests.integrations.test_integration_hf_architectures import BERT, CLASSES, VOCAB, collate, samples, training_args


# --- losses that do not split are refused before the first step; the hook takes them -----------------------
def regression_bert():
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(**BERT, num_labels=1))


class NoLoss(torch.nn.Module):
    """A classifier whose forward takes labels and ignores them."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(VOCAB, CLASSES, mode="sum")

    def forward(self, input_ids, attention_mask=None, labels=None):
        return {"logits": self.embedding(input_ids, per_sample_weights=attention_mask.float())}


def float_items(items):
    return [{**item, "labels": float(item["labels"])} for item in items]


def float_collate(items):
    batch = collate([{**item, "labels": 0} for item in items])
    return {**batch, "labels": torch.tensor([item["labels"] for item in items])}


REFUSED = {
    # name: (model, items, collator, what the message names)
    "no loss": (NoLoss, lambda: samples("sequence"), collate, "NoLoss returns no loss when given labels"),
    "an extra loss term": (
        lambda: LossPlusPenalty(),
        lambda: samples("causal"),
        collate,
        "LossPlusPenalty's own loss on the first batch is",
    ),
}


class LossPlusPenalty(LlamaForCausalLM):
    """A causal LM whose loss adds a weight penalty: no per-sample split of its logits gives it."""

    def __init__(self):
        torch.manual_seed(0)
        super().__init__(LlamaConfig(vocab_size=VOCAB, **TINY_LLAMA))

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        outputs = super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
        if outputs.loss is not None:
            outputs.loss = outputs.loss + 1e-2 * self.lm_head.weight.square().sum()
        return outputs


@pytest.mark.parametrize("preset", ["llm", "vit"])
@pytest.mark.parametrize("name", REFUSED)
def test_a_loss_that_does_not_split_is_refused_before_the_first_step(name, preset, tmp_path):
    build, items, collator, named = REFUSED[name]
    model = build()
    before = flat_weights(model).clone()
    trainer = AtteNTTrainer(
        model=model,
        args=training_args(tmp_path),
        train_dataset=items(),
        data_collator=collator,
        selection=SelectionConfig(preset=preset),
    )
    with pytest.raises(ValueError, match="AtteNTTrainer: ") as error:
        trainer.train()
    message = str(error.value)
    assert named in message and "compute_per_sample_loss=" in message and "\n" not in message
    assert trainer.state.global_step == 0 and torch.equal(flat_weights(trainer.model), before)


class TokenBagClassifier(torch.nn.Module):
    """A plain PyTorch classifier (no transformers config) that computes its own mean
    cross-entropy from labels, as Trainer requires."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.EmbeddingBag(VOCAB, CLASSES, mode="sum")

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.embedding(input_ids, per_sample_weights=attention_mask.float())
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


def test_a_plain_module_with_its_own_loss_trains_as_the_plain_trainer(tmp_path):
    """No config, no loss kwargs: one label per sample, its micro-batch mean."""
    items, runs = samples("sequence"), []
    for trainer_class in (AtteNTTrainer, Trainer):
        extra = {"selection": SelectionConfig(method="full")} if trainer_class is AtteNTTrainer else {}
        trainer = trainer_class(
            model=TokenBagClassifier(),
            args=training_args(tmp_path / trainer_class.__name__),
            train_dataset=items,
            data_collator=collate,
            **extra,
        )
        trainer.train()
        runs.append((trainer, flat_weights(trainer.model)))
    assert runs[0][0].loss_reduction is None  # method full: Trainer's own loss, no split asked for
    assert torch.allclose(runs[0][1], runs[1][1], rtol=0, atol=1e-6)
    selecting = AtteNTTrainer(
        model=TokenBagClassifier(),
        args=training_args(tmp_path / "llm", num_train_epochs=1),
        train_dataset=items,
        data_collator=collate,
        selection=SelectionConfig(preset="llm"),
    )
    selecting.train()
    assert selecting.loss_reduction.alignment == "sequence" and not selecting.loss_reduction.num_items


def squared_error(model, inputs):
    """A regression head's per-sample loss, as its own MSE is reduced."""
    prediction = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits.squeeze(-1)
    return (prediction.float() - inputs["labels"].float()) ** 2


def test_compute_per_sample_loss_trains_a_regression_head_as_the_plain_trainer(tmp_path):
    """The hook's per-sample squared errors, reduced as a micro-batch mean: BERT's own MSE. Weights
    after 2 epochs equal to the bit (measured)."""
    items = float_items(samples("sequence"))
    ours = AtteNTTrainer(
        model=regression_bert(),
        args=training_args(tmp_path / "a"),
        train_dataset=items,
        data_collator=float_collate,
        selection=SelectionConfig(method="full"),
        compute_per_sample_loss=squared_error,
    )
    ours.train()
    plain = Trainer(
        model=regression_bert(), args=training_args(tmp_path / "b"), train_dataset=items, data_collator=float_collate
    )
    plain.train()
    assert max(abs(a - b) for a, b in zip(losses_of(ours), losses_of(plain))) < 5e-6
    assert torch.allclose(flat_weights(ours.model), flat_weights(plain.model), rtol=0, atol=1e-6)
    # and the hook's losses are the scores: at learning rate 0, each sample's own squared error
    scored = AtteNTTrainer(
        model=regression_bert(),
        args=training_args(tmp_path / "c", learning_rate=0.0, num_train_epochs=1),
        train_dataset=items,
        data_collator=float_collate,
        selection=SelectionConfig(preset="llm"),
        compute_per_sample_loss=squared_error,
    )
    scored.train()
    model = scored.model.eval()
    with torch.no_grad():
        want = torch.cat([squared_error(model, float_collate([item])) for item in items])
    assert torch.allclose(scored.selector.scores, want, rtol=0, atol=1e-5) and want.std() > 1e-3
