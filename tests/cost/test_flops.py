"""FLOPs per sample counted on the meta device against the published counts: timm's ViT-B/16 at
224 px (17.58 GMACs, 35.2 GFLOPs a forward) and a 7B Llama's 2 x parameters x tokens a forward;
a LoRA step back-propagates through frozen weights without their weight gradients."""

from __future__ import annotations

import pytest
from attent.cost.flops import count_flops, measure
from attent.tasks.llm.config import LLMTaskConfig
from attent.tasks.llm.task import LLMTask
from attent.tasks.vision.config import VisionTaskConfig
from attent.tasks.vision.task import VisionTask

VIT_B16_GMACS = 17.58  # timm's model card for vit_base_patch16_224 (fvcore counts a MAC as one "flop")
LLAMA2_7B_PARAMETERS = 6_738_415_616  # meta-llama/Llama-2-7b-hf's safetensors


def test_a_vit_b16_at_224_px_forwards_timms_count_and_trains_at_three_forwards(tmp_path):
    config = VisionTaskConfig(
        dataset="image_folder", data_path=str(tmp_path), img_size=224, color_mode="rgb",
        model={"preset": "vit_base_patch16_224"},
    )  # fmt: skip
    flops = count_flops(VisionTask.probe(config))
    assert flops.score == pytest.approx(2 * VIT_B16_GMACS * 1e9, rel=0.10)
    assert flops.train / flops.score == pytest.approx(3.0, abs=0.05)  # backward: input and weight gradients
    assert flops.trainable == flops.parameters  # trained from scratch, every weight


def test_a_7b_llama_at_512_tokens_forwards_twice_its_parameters_per_token_and_lora_trains_at_two():
    config = LLMTaskConfig(
        model="meta-llama/Llama-2-7b-hf", max_length=512, lora_r=16, gradient_checkpointing=False, dtype="bfloat16"
    )
    flops = count_flops(LLMTask.probe(config))
    lora = flops.parameters - LLAMA2_7B_PARAMETERS
    assert 0 < lora == flops.trainable < 0.01 * LLAMA2_7B_PARAMETERS  # the adapters, nothing else
    assert flops.score == pytest.approx(2 * LLAMA2_7B_PARAMETERS * 512, rel=0.10)
    # frozen weights: the backward computes input gradients only (about one forward), no weight's
    assert 1.9 < flops.train / flops.score < 2.2


def test_gradient_checkpointing_adds_the_recomputed_forward(tmp_path):
    from transformers import LlamaConfig

    from tests.helpers.llm_tiny import tiny_tokenizer

    folder = tmp_path / "tiny"
    LlamaConfig(
        vocab_size=len(tiny_tokenizer()), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    ).save_pretrained(folder)  # fmt: skip
    plain, checkpointed = (
        count_flops(LLMTask.probe(LLMTaskConfig(model=str(folder), max_length=128, gradient_checkpointing=on)))
        for on in (False, True)
    )
    assert plain.score == checkpointed.score
    # the blocks' forward runs again in the backward (the LM head and the loss do not)
    assert plain.train + 0.8 * plain.score < checkpointed.train < plain.train + plain.score


def test_measure_times_real_steps_of_the_probe_on_the_cpu(tmp_path):
    config = VisionTaskConfig(dataset="digits")
    throughput = measure(VisionTask.probe(config), __import__("torch").device("cpu"), batch_size=16, precision="fp32")
    assert throughput.device == "cpu" and throughput.batch_size == 16
    # a scoring forward is cheaper than a training step
    assert 0 < throughput.train_samples_per_s < throughput.score_samples_per_s
