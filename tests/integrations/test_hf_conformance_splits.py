"""Per-sample splits of the elementwise losses heads use, found as the cross-entropies are, by matching the model's
own loss: a regression head's mean squared error (BERT and Llama, ``num_labels=1``, and two targets), a mean
absolute error, and a multi-label classifier's binary cross-entropy. For each, the split's mean is the model's own
loss, a sample's score is its own loss run alone, and a BERT regression head trains under Soft selection (the vit
preset) with no ``compute_per_sample_loss``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attent.integrations.huggingface import AtteNTTrainer
from attent.integrations.huggingface_loss import own_loss_split
from attent.selection.config import SelectionConfig
from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForSequenceClassification

from tests.helpers.hf_tiny import TINY_LLAMA, flat_weights, selection_rows
from tests.integrations.test_integration_hf_architectures import BERT, CLASSES, VOCAB, collate, samples, training_args


class BagL1Regressor(torch.nn.Module):
    """A plain module (no config) whose loss is the mean absolute error of one output per sample."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(VOCAB, 1, mode="sum")

    def forward(self, input_ids, attention_mask=None, labels=None):
        prediction = self.embedding(input_ids, per_sample_weights=attention_mask.float())
        loss = None if labels is None else F.l1_loss(prediction.squeeze(-1), labels)
        return {"loss": loss, "logits": prediction}


def targets(kind: str, n: int = 24) -> list[dict]:
    """The sequence items with float labels: one target, two, or C multi-label 0/1 targets."""
    g = torch.Generator().manual_seed(1)
    items = samples("sequence", n)
    if kind == "one":
        return [{**item, "labels": float(torch.randn(1, generator=g))} for item in items]
    width = 2 if kind == "two" else CLASSES
    values = torch.randn(n, width, generator=g) if kind == "two" else (torch.rand(n, width, generator=g) > 0.5).float()
    return [{**item, "labels": row.tolist()} for item, row in zip(items, values)]


def float_labels_collate(items: list[dict]) -> dict[str, torch.Tensor]:
    batch = collate([{**item, "labels": 0} for item in items])
    return {**batch, "labels": torch.tensor([item["labels"] for item in items], dtype=torch.float32)}


MODELS = {
    # name: (model, kind of targets, the split expected)
    "bert regression": (
        lambda: BertForSequenceClassification(BertConfig(**BERT, num_labels=1)),
        "one",
        "squared_error",
    ),
    "llama regression": (
        lambda: LlamaForSequenceClassification(
            LlamaConfig(vocab_size=VOCAB, pad_token_id=0, num_labels=1, **TINY_LLAMA)
        ),
        "one",
        "squared_error",
    ),
    "bert two targets": (
        lambda: BertForSequenceClassification(BertConfig(**BERT, num_labels=2, problem_type="regression")),
        "two",
        "squared_error",
    ),
    "bert multi-label": (
        lambda: BertForSequenceClassification(
            BertConfig(**BERT, num_labels=CLASSES, problem_type="multi_label_classification")
        ),
        "multi",
        "binary_cross_entropy",
    ),
    "absolute error": (BagL1Regressor, "one", "absolute_error"),
}


def model_of(name: str):
    torch.manual_seed(0)
    return MODELS[name][0]()


@pytest.mark.parametrize("name", MODELS)
def test_the_splits_mean_is_the_models_own_loss(name):
    model, items = model_of(name), targets(MODELS[name][1])
    batch = float_labels_collate(items[:6])
    sums, counts, reduction = own_loss_split("AtteNTTrainer", model, batch, None, accepts_loss_kwargs=False)
    assert (reduction.alignment, reduction.loss, reduction.num_items) == ("sequence", MODELS[name][2], False)
    own = model(**batch)["loss"]
    assert torch.allclose(sums.sum() / counts.sum(), own, rtol=1e-6, atol=0)
    assert sums.shape == counts.shape == (6,) and sums.std() > 1e-3


@pytest.mark.parametrize("name", MODELS)
def test_scores_are_each_samples_own_loss(name, tmp_path):
    """Learning rate 0, the llm preset's one epoch on all data: sample i's score is the model's own loss of sample i
    run alone."""
    items = targets(MODELS[name][1])
    trainer = AtteNTTrainer(
        model=model_of(name),
        args=training_args(tmp_path, learning_rate=0.0, num_train_epochs=1),
        train_dataset=items,
        data_collator=float_labels_collate,
        selection=SelectionConfig(preset="llm"),
    )
    trainer.train()
    model = trainer.model.eval()
    with torch.no_grad():
        want = torch.stack([model(**float_labels_collate([item]))["loss"] for item in items])
    assert torch.allclose(trainer.selector.scores, want, rtol=0, atol=1e-5)
    assert trainer.loss_reduction.loss == MODELS[name][2]


def test_a_bert_regression_head_trains_under_soft_selection_without_a_hook(tmp_path):
    items = targets("one", 40)
    trainer = AtteNTTrainer(
        model=model_of("bert regression"),
        args=training_args(tmp_path, num_train_epochs=4, train_sampling_strategy="random"),
        train_dataset=items,
        data_collator=float_labels_collate,
        selection=SelectionConfig(preset="vit"),
    )
    before = flat_weights(trainer.model).clone()
    trainer.train()
    rows = selection_rows(trainer)
    assert trainer.loss_reduction.loss == "squared_error"
    assert [row["selected"] for row in rows] == [8, 14, 14, 26]  # vit over 4 epochs of 40: 0.2, 0.35, kept, 0.65
    assert trainer.state.global_step == trainer.selector.planned_steps(4) == 2 + 4 + 4 + 7
    assert all(row["samples_scored"] > 0 for row in rows[::3])  # scoring passes where it re-selects
    assert torch.isfinite(trainer.selector.scores).all()
    assert (flat_weights(trainer.model) - before).abs().max() > 1e-3
