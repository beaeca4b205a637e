"""Per-sample response-token loss of a causal LM without full-vocabulary logits for the batch.

``response_token_loss`` is the reference: cross-entropy from full logits [B, T, V] cast to fp32,
which keeps several B x T x V fp32 tensors alive (192 MiB each for SmolLM2 at 4 x 256 tokens,
V = 49k). ``response_loss_sums`` computes
the same loss from the final hidden states instead: only the positions whose next label is a
response token go through the LM head, ``chunk_tokens`` of them at a time, with an fp32
log-softmax per chunk under activation checkpointing. The forward keeps no logits and the
backward recomputes one chunk's at a time, so the loss's peak memory scales with
chunk_tokens x V instead of B x T x V. On CUDA, cut-cross-entropy's fused linear + cross-entropy
kernel serves instead when it is installed (``fused="auto"``, bf16/fp16 weights, plain head).
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attent.tasks.llm.data import IGNORE_INDEX

FusedLoss = Literal["auto", "off"]


def response_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """FloatTensor[B]: mean next-token cross-entropy over each sample's labelled tokens.

    Token t's logits predict label t+1; labels equal to IGNORE_INDEX (prompt, padding) carry no
    loss, so a sample's score depends neither on its prompt length nor on the batch's padding.
    The reference implementation (full logits); training uses ``response_loss``.
    """
    targets = labels[:, 1:]
    token_loss = F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    ).view_as(targets)
    return token_loss.sum(dim=1) / (targets != IGNORE_INDEX).sum(dim=1).clamp(min=1)


# --- the model up to its final hidden states --------------------------------------------------
def causal_lm(model: nn.Module) -> nn.Module:
    """The Hugging Face CausalLM inside DDP (``.module``) and peft (``get_base_model()``)
    wrappers; peft injects LoRA in place, so its modules carry the adapters."""
    inner = getattr(model, "module", model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def final_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """FloatTensor[B, T, H]: the decoder's output (what the LM head projects), LoRA applied; a
    packed row's ``position_ids`` (and no mask) keep its samples apart."""
    decoder = causal_lm(model).get_decoder()
    captured: list[torch.Tensor] = []

    def keep(module: nn.Module, args: tuple, output) -> None:
        captured.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

    # Called through the top-level forward, so a DDP wrapper's forward runs and its gradient
    # sync stays armed (calling the inner decoder would silently skip the all-reduce); the head
    # projects only the last position (logits_to_keep=1) and a temporary hook on the decoder
    # takes its output.
    handle = decoder.register_forward_hook(keep)
    try:
        positions = {} if position_ids is None else {"position_ids": position_ids}
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1, **positions)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"expected one decoder call in the forward, saw {len(captured)}")
    return captured[0]


# --- per-token losses from hidden states ---------------------------------------------------------
def _token_losses(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module, softcap: float | None) -> torch.Tensor:
    logits = head(hidden).float()
    if softcap:  # Gemma-2/3 cap their logits after the head
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, targets, reduction="none")


def _cut_cross_entropy():
    """cut-cross-entropy's ``linear_cross_entropy``, or None when it is not installed."""
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError:
        return None
    return linear_cross_entropy


def _fused_kernel(hidden: torch.Tensor, head: nn.Module, fused: FusedLoss):
    """The fused kernel when it may serve: asked for, on CUDA, installed, a plain linear head
    (no adapter on it) in the hidden states' half-precision dtype."""
    if fused != "auto" or not hidden.is_cuda or type(head) is not nn.Linear:
        return None
    if hidden.dtype not in (torch.float16, torch.bfloat16) or head.weight.dtype != hidden.dtype:
        return None
    return _cut_cross_entropy()


def response_token_losses(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head: nn.Module,
    *,
    chunk_tokens: int = 256,
    softcap: float | None = None,
    fused: FusedLoss = "off",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(FloatTensor[N] cross-entropy of each response token, LongTensor[N] its sample's row)
    for the N positions whose next label is not IGNORE_INDEX, ``chunk_tokens`` at a time."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    rows, cols = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
    states = hidden[rows, cols]  # [N, H]: only positions that predict a response token
    targets = labels[rows, cols + 1]
    kernel = _fused_kernel(states, head, fused)
    if kernel is not None:
        bias = {} if head.bias is None else {"bias": head.bias}  # older releases lack bias
        token_loss = kernel(states, head.weight, targets, softcap=softcap, reduction="none", **bias).float()
        return token_loss, rows
    one_chunk = functools.partial(_token_losses, head=head, softcap=softcap)
    pieces = []
    for start in range(0, len(targets), chunk_tokens):
        chunk = (states[start : start + chunk_tokens], targets[start : start + chunk_tokens])
        if torch.is_grad_enabled():  # backward recomputes this chunk's logits, none kept
            pieces.append(checkpoint(one_chunk, *chunk, use_reentrant=False))
        else:
            pieces.append(one_chunk(*chunk))
    token_loss = torch.cat(pieces) if pieces else states.new_zeros(0, dtype=torch.float32)
    return token_loss, rows


def packed_row(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A right-padded batch as one padding-free row [1, tokens]: its samples' tokens in order,
    ``position_ids`` restarting at 0 at each, each sample's first label IGNORE_INDEX (no loss term
    across a boundary), and ``segments``, each token's sample [tokens]."""
    mask = batch["attention_mask"].bool()
    labels = batch["labels"].clone()
    labels[:, 0] = IGNORE_INDEX
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    samples = torch.arange(mask.shape[0], device=mask.device).unsqueeze(1).expand_as(mask)
    return {
        "input_ids": batch["input_ids"][mask].unsqueeze(0),
        "labels": labels[mask].unsqueeze(0),
        "position_ids": positions[mask].unsqueeze(0),
        "segments": samples[mask],
    }


def response_loss_sums(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    *,
    chunk_tokens: int = 256,
    fused: FusedLoss = "auto",
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(FloatTensor[B] summed response-token cross-entropy, LongTensor[B] response tokens) of
    each sample, the model (DDP/peft-wrapped or not) run on the batch, or (``packed``) on its
    samples as one padding-free row (``packed_row``): the same sums, no padding computed."""
    labels = row_labels = batch["labels"]
    if packed:
        row = packed_row(batch)
        row_labels = row["labels"]
        hidden = final_hidden_states(model, row["input_ids"], None, row["position_ids"])
    else:
        hidden = final_hidden_states(model, batch["input_ids"], batch["attention_mask"])
    lm = causal_lm(model)
    softcap = getattr(lm.config, "final_logit_softcapping", None)
    token_loss, rows = response_token_losses(
        hidden, row_labels, lm.get_output_embeddings(), chunk_tokens=chunk_tokens, softcap=softcap, fused=fused
    )
    if packed:  # a term's sample: that of the token it predicts
        rows = row["segments"][(row_labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)[1] + 1]
    sums = token_loss.new_zeros(len(labels)).index_add(0, rows, token_loss)
    if not len(token_loss):  # still a graph through the model (DDP expects every gradient)
        sums = sums + 0.0 * hidden.float().sum(dim=(1, 2))
    return sums, (labels[:, 1:] != IGNORE_INDEX).sum(dim=1)


def response_loss(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    *,
    chunk_tokens: int = 256,
    fused: FusedLoss = "auto",
    packed: bool = False,
) -> torch.Tensor:
    """FloatTensor[B]: what ``response_token_loss`` gives from full logits, computed chunk by
    chunk from the final hidden states (differentiable; 0 for a sample with no response)."""
    sums, counts = response_loss_sums(model, batch, chunk_tokens=chunk_tokens, fused=fused, packed=packed)
    return sums / counts.clamp(min=1)
