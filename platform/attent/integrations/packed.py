"""Per-sample losses of packed and padding-free batches: several samples in one row.

A padding-free collator (TRL's ``DataCollatorForLanguageModeling(padding_free=True)``,
transformers' ``DataCollatorWithFlattening``) concatenates a batch's samples into one row, with
``position_ids`` restarting at 0 at each sample and no attention mask; TRL's dataset packing puts
several samples in each of several rows the same way. The model keeps the samples apart from the
positions alone (transformers' masking utilities read a new sample wherever the position is not
the previous one plus 1; flash attention reads ``cu_seq_lens``), and so does this module:

    segment_ids        each token's sample (0..B-1 in batch order, -1 on padding), from
                       position_ids or cu_seq_lens (both: they must agree)
    mask_boundaries    labels -100 at each sample's first token: in a packed row the next-token
                       target of a sample's last token is the next sample's first token
    packed_sums        each sample's summed next-token loss terms and their count (S [B], n [B]),
                       from per-token terms [rows, T - 1] (TRL's fused head: ``-log_probs``)
    packed_logit_sums  the same from logits [rows, T, V] and labels [rows, T]
    batch_segments     segment_ids of a batch of model inputs (None for a padded batch), the
                       trailing padding of ``pad_to_multiple_of`` read as no sample
    packed_inputs      a packed batch's model inputs as its per-sample loss's forward takes them
    attention_problem  why a model's attention would not keep packed samples apart, if it would not

A loss term never crosses a boundary, whatever the labels say: the term of a sample's last token
(whose target is the next sample's first token) is dropped. TRL's padding-free collator labels
each sample's first token -100 for exactly this, so there its loss and this split agree.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
# Attention implementations whose varlen kernels take the samples' boundaries from position_ids
# or cu_seq_lens (transformers' flash-attention integration), and those that honour them through
# the masks transformers' masking utilities build (for a model that builds its masks there).
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
MASKED_ATTENTION = ("sdpa", "eager", "flex_attention")
MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask", "create_masks_for_generate")


def segment_ids(
    position_ids: torch.Tensor | None = None,
    cu_seq_lens: torch.Tensor | None = None,
    padding: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """Each token's sample in a packed batch, numbered in batch order (row by row).

    A sample starts at each row's first token and wherever a position is not the previous one
    plus 1 (as transformers' ``find_packed_sequence_indices`` reads packed rows), or at each
    offset of ``cu_seq_lens`` (flattened over the rows, as flash attention's varlen kernels
    read it). An unpacked batch reads as one sample per row.

    Args:
        position_ids: [rows, T] (or [T]: one row).
        cu_seq_lens: [B + 1] cumulative sample lengths over the flattened rows, 0 first and
            rows * T last (TRL's ``cu_seq_lens_q``, flash attention's ``cu_seqlens``).
        padding: [rows, T] bool, True on tokens that belong to no sample (e.g. the trailing
            padding of ``pad_to_multiple_of``): their segment is -1 and they count as no sample.

    Returns:
        (segments [rows, T] long, -1 on padding; B, the number of samples).

    Raises:
        ValueError: neither ``position_ids`` nor ``cu_seq_lens`` given, a malformed
            ``cu_seq_lens``, or the two disagreeing on where samples start.

    Example:
        >>> segments, samples = segment_ids(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]]))
        >>> segments.tolist(), samples
        ([[0, 0, 0, 1, 1, 2, 2, 2, 2]], 3)
    """
    starts = None
    if position_ids is not None:
        starts = _starts_from_positions(position_ids)
    if cu_seq_lens is not None:
        shape = starts.shape if starts is not None else (padding.shape if padding is not None else None)
        from_offsets = _starts_from_offsets(cu_seq_lens, shape)
        if starts is not None and not torch.equal(from_offsets, starts.to(from_offsets.device)):
            raise ValueError("position_ids and cu_seq_lens disagree on where the packed samples start")
        starts = from_offsets
    if starts is None:
        raise ValueError("a packed batch needs position_ids or cu_seq_lens to tell its samples apart")
    if padding is not None:
        padding = padding.to(starts.device).expand_as(starts)
        starts = starts & ~padding
    segments = starts.flatten().cumsum(0).view_as(starts) - 1
    if padding is not None:
        segments = segments.masked_fill(padding, -1)
    return segments, int(starts.sum())


def _starts_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """[rows, T] bool: True where a sample starts (a row's first token, a position not the
    previous one plus 1)."""
    positions = position_ids if position_ids.ndim == 2 else position_ids.reshape(1, -1)
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    return starts


def _starts_from_offsets(cu_seq_lens: torch.Tensor, shape: torch.Size | tuple | None) -> torch.Tensor:
    """[rows, T] bool from cumulative lengths over the flattened rows (one row if no shape)."""
    offsets = cu_seq_lens.flatten().long()
    total = int(offsets[-1]) if offsets.numel() else 0
    rows, width = (shape[0], shape[1]) if shape is not None else (1, total)
    if offsets.numel() < 2 or int(offsets[0]) != 0 or total != rows * width or bool((offsets.diff() <= 0).any()):
        raise ValueError(f"cu_seq_lens must rise from 0 to the batch's {rows * width} tokens, got {offsets.tolist()}")
    starts = torch.zeros(rows * width, dtype=torch.bool, device=offsets.device)
    starts[offsets[:-1]] = True
    starts = starts.view(rows, width)
    starts[:, 0] = True  # a sample never spans two rows
    return starts


def mask_boundaries(labels: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """``labels`` with -100 at each sample's first token and on padding: the next-token target
    the previous sample's last token would otherwise be scored on.

    Args:
        labels: [rows, T] token labels, -100 where a token carries no loss.
        segments: [rows, T] from ``segment_ids``.

    Returns:
        A new labels tensor [rows, T].

    Example:
        >>> segments, _ = segment_ids(torch.tensor([[0, 1, 2, 0, 1]]))
        >>> mask_boundaries(torch.tensor([[5, 6, 7, 8, 9]]), segments).tolist()
        [[-100, 6, 7, -100, 9]]
    """
    first = torch.ones_like(segments, dtype=torch.bool)
    first[:, 1:] = segments[:, 1:] != segments[:, :-1]
    return labels.masked_fill(first.to(labels.device) | (segments < 0).to(labels.device), IGNORE_INDEX)


def packed_sums(
    token_terms: torch.Tensor, label_mask: torch.Tensor, segments: torch.Tensor, samples: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's summed next-token loss terms and their count.

    Term t is the loss of predicting token t + 1 from position t (a causal LM's shifted loss,
    TRL's fused head's ``-log_probs``): it belongs to token t's sample, and counts only where
    ``label_mask`` holds and token t + 1 is of the same sample (no term crosses a boundary).

    Args:
        token_terms: [rows, T - 1] per-token loss terms (any value where not counted).
        label_mask: [rows, T - 1] bool, whether the term's label is not -100.
        segments: [rows, T] from ``segment_ids``.
        samples: B, the number of samples (``segment_ids``' second value).

    Returns:
        (S [B], n [B]): the summed terms (in ``token_terms``' dtype, differentiable) and their
        count (long), in batch order.

    Raises:
        ValueError: shapes that do not line up.

    Example:
        >>> segments, samples = segment_ids(torch.tensor([[0, 1, 2, 0, 1]]))
        >>> terms = torch.tensor([[1.0, 2.0, 4.0, 8.0]])
        >>> sums, counts = packed_sums(terms, torch.ones(1, 4, dtype=torch.bool), segments, samples)
        >>> sums.tolist(), counts.tolist()
        ([3.0, 8.0], [2, 1])
    """
    rows, width = segments.shape
    if token_terms.shape != (rows, width - 1) or label_mask.shape != token_terms.shape:
        raise ValueError(
            f"next-token terms of a batch of {tuple(segments.shape)} tokens need [{rows}, {width - 1}] terms "
            f"and label mask, got {tuple(token_terms.shape)} and {tuple(label_mask.shape)}"
        )
    segments = segments.to(token_terms.device)
    source = segments[:, :-1]
    keep = label_mask.to(token_terms.device).bool() & (source == segments[:, 1:]) & (source >= 0)
    index = source.clamp(min=0).flatten()
    terms = torch.where(keep, token_terms, torch.zeros_like(token_terms)).flatten()
    sums = token_terms.new_zeros(samples).index_add(0, index, terms)
    counts = torch.zeros(samples, dtype=torch.long, device=token_terms.device).index_add(
        0, index, keep.flatten().long()
    )
    return sums, counts


def packed_logit_sums(
    logits: torch.Tensor, labels: torch.Tensor, segments: torch.Tensor, samples: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's summed next-token cross-entropies and their count, from a causal LM's logits
    (in float32 whatever their dtype, as transformers' losses upcast).

    Args:
        logits: [rows, T, V].
        labels: [rows, T], -100 where a token carries no loss.
        segments: [rows, T] from ``segment_ids``.
        samples: B.

    Returns:
        (S [B], n [B]), as ``packed_sums``.
    """
    shifted = labels[:, 1:]
    terms = F.cross_entropy(
        logits[:, :-1].float().flatten(0, 1), shifted.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    ).view_as(shifted)
    return packed_sums(terms, shifted != IGNORE_INDEX, segments, samples)


def batch_segments(inputs: dict[str, Any], pad_token_id: int | None = None) -> tuple[torch.Tensor, int] | None:
    """(segments, B) of a padding-free batch of model inputs; None if it has an attention mask
    or neither ``position_ids`` nor ``cu_seq_lens_q`` / ``cu_seqlens`` (a padded batch: one
    sample per row). ``pad_token_id``: a trailing run of pad tokens at position 0 (TRL's
    ``pad_to_multiple_of``, which pads the row with one-token "samples") is padding, not samples.
    """
    if inputs.get("attention_mask") is not None:
        return None
    positions = inputs.get("position_ids")
    offsets = next((inputs[key] for key in ("cu_seq_lens_q", "cu_seqlens") if inputs.get(key) is not None), None)
    if positions is None and offsets is None:
        return None
    padding, input_ids = None, inputs.get("input_ids")
    if positions is not None and input_ids is not None and positions.shape[0] != input_ids.shape[0]:
        positions = positions.expand(input_ids.shape[0], -1)  # one row of positions shared by every row
    if pad_token_id is not None and positions is not None and input_ids is not None:
        padding = trailing_padding(input_ids, positions, pad_token_id)
    return segment_ids(positions, offsets if offsets is not None and offsets.ndim == 1 else None, padding)


def packed_inputs(inputs: dict[str, Any], segments: torch.Tensor) -> dict[str, Any]:
    """``inputs`` of a packed batch as a per-sample loss's forward takes them: ``use_cache=False``
    (a cache turns transformers' packed-row masks off) and labels masked at the boundaries
    (``mask_boundaries``).

    Args:
        inputs: the batch's model inputs, with or without labels.
        segments: [rows, T] from ``segment_ids`` (``batch_segments``).

    Returns:
        A new dict of inputs.
    """
    inputs = {**inputs, "use_cache": False}
    if inputs.get("labels") is not None:
        inputs["labels"] = mask_boundaries(inputs["labels"], segments)
    return inputs


def trailing_padding(input_ids: torch.Tensor, position_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """[rows, T] bool: each row's trailing run of pad tokens at position 0."""
    positions = position_ids if position_ids.ndim == 2 else position_ids.reshape(1, -1)
    pad = (input_ids == pad_token_id) & (positions.to(input_ids.device) == 0)
    # a token is trailing padding if it and every token after it are
    return pad.flip(-1).long().cumprod(-1).flip(-1).bool()


def attention_problem(model: torch.nn.Module) -> str | None:
    """Why ``model`` would let a packed row's samples attend to each other; None if its attention
    honours packed ``position_ids``: a varlen flash-attention kernel, or sdpa, eager or flex
    attention of a model whose masks transformers' masking utilities build (they detect packed
    rows from the positions where there is no attention mask and no cache). The model's class,
    its bases and its backbone's are looked at, so a subclass of one that does is one that does.

    Args:
        model: a transformers model, or a DDP or peft wrapper of one.

    Returns:
        The problem in a few words, or None.
    """
    inner = getattr(model, "module", model)  # DDP
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner  # peft
    implementation = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    name = type(inner).__name__
    if implementation is None:
        return f"{name} names no attention implementation, so AtteNT cannot tell whether it keeps packed samples apart"
    if implementation in VARLEN_ATTENTION or "flash" in implementation:
        return None
    if implementation not in MASKED_ATTENTION:
        return (
            f"attn_implementation={implementation!r} of {name} is none known to keep packed samples apart "
            f"({', '.join(MASKED_ATTENTION)} and flash attention are), so each sample of a packed row might "
            "attend to the ones before it"
        )
    if not builds_masks(inner):
        return (
            f"{name} builds its attention masks outside transformers' masking utilities, so under "
            f"attn_implementation={implementation!r} each sample of a packed row would attend to the ones before it"
        )
    return None


def varlen_attention(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the one inside a DDP or peft wrapper) attends by a varlen flash
    kernel, which runs a packed row's samples each on its own; sdpa, eager and flex attention run
    the row as one sequence under a block-diagonal mask (``attention_problem``), whose cost grows
    with the row's length squared.

    Args:
        model: a transformers model, or a DDP or peft wrapper of one.

    Returns:
        True for a flash-attention implementation.
    """
    inner = getattr(model, "module", model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    implementation = getattr(getattr(inner, "config", None), "_attn_implementation", None) or ""
    return implementation in VARLEN_ATTENTION or "flash" in implementation


def builds_masks(model: torch.nn.Module) -> bool:
    """Whether the modules of ``model``'s classes (and its backbone's) build attention masks with
    transformers' masking utilities (import one of its mask builders)."""
    classes = list(type(model).__mro__) + list(type(getattr(model, "base_model", model)).__mro__)
    for module in {sys.modules.get(cls.__module__) for cls in classes}:
        for builder in MASK_BUILDERS:
            if getattr(getattr(module, builder, None), "__module__", "").endswith("masking_utils"):
                return True
    return False
