"""AtteNTSFTTrainer on GPT-2 and Qwen2 through TRL's fused head and its completion-only and assistant-only masks."""

from __future__ import annotations

import math

import pytest
import torch
from attent.selection.config import SelectionConfig
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from tests.helpers.hf_tiny import flat_weights, losses_of, training_settings

# --- TRL's SFTTrainer: its fused head, its completion-only and assistant-only masks ---------------------------
# A ChatML template with the generation markers TRL's assistant_only_loss reads (SmolLM2's own has none).
CHATML_WITH_GENERATION = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from attent.tasks.llm.model import resolve_checkpoint
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_checkpoint("smollm2-135m-instruct"))
    tokenizer.chat_template = CHATML_WITH_GENERATION
    return tokenizer


def sft_model(name: str, vocab: int):
    """The architecture's tiny causal LM with the tokenizer's vocabulary."""
    torch.manual_seed(0)
    if name == "gpt2":
        return GPT2LMHeadModel(
            GPT2Config(
                vocab_size=vocab,
                n_positions=128,
                n_embd=32,
                n_layer=2,
                n_head=4,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
        )
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        )
    )


def sft_items(data: str, n: int = 12) -> list[dict]:
    if data == "completion":  # prompt-completion: the prompt carries no loss
        return [
            {"prompt": f"Question {i}: what is {i} plus {i}?", "completion": f" {i} plus {i} is {2 * i}."}
            for i in range(n)
        ]
    return [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} times {i % 5 + 2}?"},  # conversations
                {"role": "assistant", "content": f"{i} times {i % 5 + 2} is {i * (i % 5 + 2)}."},
            ]
        }
        for i in range(n)
    ]


def sft_trainer(trainer_class, tmp_path, name, data, tokenizer, **overrides):
    import datasets
    from trl import SFTConfig

    config = training_settings(
        tmp_path / trainer_class.__name__,
        num_train_epochs=2,
        bf16=False,
        max_length=64,
        train_sampling_strategy="sequential",
        assistant_only_loss=data == "conversation",
    )
    extra = {"selection": SelectionConfig(method="full")} if trainer_class.__name__.startswith("AtteNT") else {}
    extra.update(overrides.pop("trainer_kwargs", {}))
    return trainer_class(
        model=sft_model(name, len(tokenizer)),
        args=SFTConfig(**{**config, **overrides}),
        train_dataset=datasets.Dataset.from_list(sft_items(data)),
        processing_class=tokenizer,
        **extra,
    )


@pytest.mark.parametrize("data", ["completion", "conversation"])
@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_sft_full_reproduces_trls_sft_trainer(name, data, tokenizer, tmp_path):
    """Measured: logged losses at most 9.5e-7 apart, weights equal to the bit (both data kinds,
    both architectures, accumulation 3)."""
    from attent.integrations.huggingface_trl import AtteNTSFTTrainer
    from trl import SFTTrainer

    runs = []
    for trainer_class in (AtteNTSFTTrainer, SFTTrainer):
        trainer = sft_trainer(
            trainer_class, tmp_path, name, data, tokenizer, gradient_accumulation_steps=3, per_device_train_batch_size=2
        )
        trainer.train()
        runs.append((losses_of(trainer), flat_weights(trainer.model)))
    (ours, our_weights), (plain, plain_weights) = runs
    assert len(ours) == len(plain) == 2 * math.ceil(12 / 6)
    assert max(abs(a - b) for a, b in zip(ours, plain)) < 5e-6
    assert torch.allclose(our_weights, plain_weights, rtol=0, atol=1e-6)


@pytest.mark.parametrize("data", ["completion", "conversation"])
@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_sft_scores_are_the_models_own_loss_of_each_sample(name, data, tokenizer, tmp_path):
    """At learning rate 0, a sample's score is the model's own (unfused) loss of that sample run
    alone with TRL's labels: -100 on the prompt, or on all but the assistant's turns. Measured: at
    most 1.9e-6 apart (TRL's chunked fused head against the model's full logits)."""
    from attent.integrations.huggingface_trl import AtteNTSFTTrainer

    trainer = sft_trainer(
        AtteNTSFTTrainer,
        tmp_path,
        name,
        data,
        tokenizer,
        learning_rate=0.0,
        num_train_epochs=1,
        trainer_kwargs={"selection": SelectionConfig(preset="llm")},
    )
    trainer.train()
    model = trainer.model.eval()
    want = []
    with torch.no_grad():
        for i in range(len(trainer.train_dataset)):
            batch = trainer.data_collator([trainer.train_dataset[i]])
            labelled = int((batch["labels"][:, 1:] != -100).sum())
            assert 0 < labelled < batch["input_ids"].shape[1] - 1  # a mask is applied, and leaves tokens
            want.append(
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
            )
    want = torch.stack(want)
    assert torch.allclose(trainer.selector.scores, want, rtol=0, atol=1e-5)
    assert want.std() > 1e-3
