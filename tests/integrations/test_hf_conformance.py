"""AtteNTTrainer with ``method="full"`` is the plain Trainer, side by side on the same tiny models: a causal LM, a
BERT regression head and a model whose loss splits by no sample (a penalty term), under gradient accumulation,
gradient checkpointing, max_steps, fractional epochs, FLOS and memory metrics, early stopping, a second train(),
model_init with a changed seed, and built for evaluation only. "The same" is to the bit: every row Trainer logs
(loss, grad_norm, learning_rate, epoch, step, the run's train_loss and total_flos) and every weight, in the same
data order (sequential sampling; with random sampling AtteNT's sampler draws its own seeded permutation)."""

from __future__ import annotations

import math

import pytest
import torch
from attent.integrations.huggingface import AtteNTTrainer
from attent.selection.config import SelectionConfig
from transformers import EarlyStoppingCallback, LlamaConfig, LlamaForCausalLM, Trainer

from tests.helpers.hf_tiny import TINY_LLAMA, VOCAB, collate, flat_weights, samples, tiny_llama, training_args
from tests.integrations.test_integration_hf_architectures import collate as sequence_collate
from tests.integrations.test_integration_hf_architectures import samples as sequence_samples
from tests.integrations.test_integration_hf_custom_losses import (
    LossPlusPenalty,
    float_collate,
    float_items,
    regression_bert,
)

# Keys whose values are wall-clock or process measurements, not training's
TIMED = ("runtime", "per_second", "_mem_")

MODELS = {
    # name: (model, items, collator)
    "causal LM": (tiny_llama, samples, collate),
    "regression head": (regression_bert, lambda: float_items(sequence_samples("sequence")), float_collate),
    "loss with a penalty": (LossPlusPenalty, lambda: sequence_samples("causal"), sequence_collate),
}


def trainer_rows(trainer) -> list[dict]:
    """Trainer's own log rows (not the selection's), without timings."""
    return [
        {key: value for key, value in row.items() if not any(part in key for part in TIMED)}
        for row in trainer.state.log_history
        if "subset_checksum" not in row
    ]


def pair(name: str, tmp_path, callbacks=(), trainer_kwargs=None, **overrides) -> tuple[Trainer, Trainer]:
    """(AtteNTTrainer with method full, plain Trainer), built alike; not trained."""
    build, items, collator = MODELS[name]
    data = items()
    made = []
    for cls in (AtteNTTrainer, Trainer):
        extra = {"selection": SelectionConfig(method="full")} if cls is AtteNTTrainer else {}
        args = training_args(tmp_path / cls.__name__, train_sampling_strategy="sequential", **overrides)
        made.append(
            cls(
                model=build(),
                args=args,
                train_dataset=data,
                data_collator=collator,
                callbacks=list(callbacks),
                **(trainer_kwargs or {}),
                **extra,
            )
        )
    return made[0], made[1]


def assert_same(ours: Trainer, plain: Trainer) -> None:
    assert trainer_rows(ours) == trainer_rows(plain)
    assert torch.equal(flat_weights(ours.model), flat_weights(plain.model))
    assert ours.state.global_step == plain.state.global_step > 0


@pytest.mark.parametrize("batch,accumulation", [(4, 1), (2, 3)])
@pytest.mark.parametrize("name", MODELS)
def test_full_is_the_plain_trainer(name, batch, accumulation, tmp_path):
    """Trainer's own compute_loss: no per-sample split asked for, whatever the model's loss (the penalty's loss is
    refused under a selection: test_integration_hf_custom_losses.py)."""
    ours, plain = pair(
        name, tmp_path, num_train_epochs=2, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation
    )
    ours.train()
    plain.train()
    assert_same(ours, plain)
    assert ours.loss_reduction is None
    assert len({row["loss"] for row in trainer_rows(ours) if "loss" in row}) > 1  # not vacuous


FEATURES = {
    "gradient checkpointing": dict(gradient_checkpointing=True),
    "max_steps": dict(max_steps=13, lr_scheduler_type="linear"),
    "fractional epochs": dict(num_train_epochs=1.5, lr_scheduler_type="linear"),
    "epochs below one": dict(num_train_epochs=0.3, gradient_accumulation_steps=2),
    "memory metrics": dict(skip_memory_metrics=False),
    "no NaN filter": dict(logging_nan_inf_filter=False),
}


@pytest.mark.parametrize("feature", FEATURES)
def test_full_is_the_plain_trainer_under_its_settings(feature, tmp_path):
    ours, plain = pair("causal LM", tmp_path, **FEATURES[feature])
    ours.train()
    plain.train()
    assert_same(ours, plain)
    assert ours.state.max_steps == plain.state.max_steps
    assert ours.lr_scheduler.get_last_lr() == plain.lr_scheduler.get_last_lr()
    final = [row for row in ours.state.log_history if "train_loss" in row][-1]
    assert final["total_flos"] > 0
    if feature == "memory metrics":
        keys = {key for row in plain.state.log_history for key in row if "_mem_" in key}
        assert keys and keys <= set(final)


def test_early_stopping_stops_at_the_same_step(tmp_path):
    evaluation = samples(8, seed=1)
    ours, plain = pair(
        "causal LM",
        tmp_path,
        callbacks=[EarlyStoppingCallback(early_stopping_patience=1)],
        trainer_kwargs={"eval_dataset": evaluation},
        num_train_epochs=6,
        learning_rate=0.3,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
    )
    ours.train()
    plain.train()
    assert_same(ours, plain)
    assert ours.state.global_step < 6 * math.ceil(40 / 4)  # it stopped early


def test_a_second_train_call_trains_on_as_trainer(tmp_path):
    ours, plain = pair("causal LM", tmp_path, num_train_epochs=1)
    for _ in range(2):
        ours.train()
        plain.train()
        assert_same(ours, plain)


def test_model_init_with_a_changed_seed(tmp_path):
    """Trainer seeds and rebuilds the model in each train(); a seed set on args before the second one is
    followed by both, the selection's seed with it."""

    def model_init():  # drawn from the RNG Trainer seeds with args.seed
        return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, **TINY_LLAMA))

    trainers = []
    for cls in (AtteNTTrainer, Trainer):
        extra = {"selection": SelectionConfig(method="full")} if cls is AtteNTTrainer else {}
        args = training_args(tmp_path / cls.__name__, train_sampling_strategy="sequential", num_train_epochs=1)
        trainers.append(cls(model_init=model_init, args=args, train_dataset=samples(), data_collator=collate, **extra))
    ours, plain = trainers
    first = flat_weights(ours.model).clone()
    for seed in (0, 7):
        ours.args.seed = plain.args.seed = seed
        ours.train()
        plain.train()
        assert_same(ours, plain)
        assert ours.selector is None  # method full: Trainer's own run, no selection
    assert not torch.equal(first, flat_weights(ours.model))


def test_reproducible_training_with_random_sampling(tmp_path):
    """The same seed, the same run, to the bit (AtteNT's sampler draws its own seeded permutation)."""
    runs = []
    for name in ("a", "b"):
        trainer = AtteNTTrainer(
            model=tiny_llama(),
            args=training_args(tmp_path / name, num_train_epochs=2),
            train_dataset=samples(),
            data_collator=collate,
            selection=SelectionConfig(method="full"),
        )
        trainer.train()
        runs.append((trainer_rows(trainer), flat_weights(trainer.model)))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("preset", ["full", "vit"])
def test_built_for_evaluation_only(preset, tmp_path):
    """No training set: evaluate and predict as Trainer; train() refused in one line until one is given."""
    selection = SelectionConfig(method="full") if preset == "full" else SelectionConfig(preset=preset)
    evaluation = samples(12, seed=2)
    ours = AtteNTTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path / "ours"),
        eval_dataset=evaluation,
        data_collator=collate,
        selection=selection,
    )
    plain = Trainer(model=tiny_llama(), args=training_args(tmp_path / "plain"), data_collator=collate)
    mine, theirs = ours.evaluate(), plain.evaluate(evaluation)
    assert mine["eval_loss"] == theirs["eval_loss"]
    assert torch.equal(
        torch.as_tensor(ours.predict(evaluation).predictions), torch.as_tensor(plain.predict(evaluation).predictions)
    )
    with pytest.raises(ValueError, match="Trainer: training requires a train_dataset") as error:
        ours.train()
    assert "\n" not in str(error.value)
    ours.train_dataset = samples()
    ours.train()
    assert ours.state.global_step > 0
