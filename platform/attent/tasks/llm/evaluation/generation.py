"""Batched greedy decoding from token-id prompts."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase


def left_pad(prompts: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) with every prompt ending at the last column."""
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return input_ids, attention_mask


def stop_token_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End-of-turn ids: the tokenizer's EOS plus any the model's generation config lists."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    configured = configured if isinstance(configured, list) else [configured]
    return sorted({i for i in [tokenizer.eos_token_id, *configured] if i is not None})


@torch.inference_mode()
def generate_greedy(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Greedy completions (decoded, special tokens dropped) in the order of ``prompts``.

    Prompts are batched longest-first so each batch holds similar lengths, then left-padded.
    """
    device = next(model.parameters()).device
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=stop_token_ids(model, tokenizer),
    )
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    completions: list[str] = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        input_ids, attention_mask = left_pad([prompts[i] for i in batch], tokenizer.pad_token_id)
        output = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config
        )
        texts = tokenizer.batch_decode(output[:, input_ids.shape[1] :], skip_special_tokens=True)
        for i, text in zip(batch, texts, strict=True):
            completions[i] = text
        if progress is not None:
            progress(f"generated {start + len(batch)}/{len(prompts)}")
    return completions
