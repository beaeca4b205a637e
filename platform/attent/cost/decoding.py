"""An evaluation's greedy decoding, priced by the memory it reads rather than the FLOPs it
computes: a decoding step multiplies one token per sequence by every weight, so it reads the
whole model (and each sequence's KV cache) for 2 x parameters FLOPs a sequence, far below what
the tensor cores could do at the batch sizes evaluation uses; its time is bytes / bandwidth."""

from __future__ import annotations

import math

from attent.tasks.task import Decoding


def bytes_read(decoding: Decoding, parameters: int, prompt_tokens: float, workers: int) -> float:
    """Bytes one evaluation reads on all its ranks: each rank decodes its shard of the answers in
    batches, each step reading the weights once and each sequence's KV cache at its mean context
    over the answer (prompt + half the new tokens)."""
    shard = math.ceil(decoding.answers / workers)
    batches = math.ceil(shard / decoding.batch)
    context = prompt_tokens + decoding.new_tokens / 2
    weights = batches * parameters * decoding.bytes_per_parameter
    caches = shard * decoding.kv_bytes_per_token * context
    return workers * decoding.new_tokens * (weights + caches)


def decoding_seconds(
    decoding: Decoding, parameters: int, prompt_tokens: float, workers: int, bandwidth: float
) -> float:
    """Device-seconds of one evaluation on all its ranks at ``bandwidth`` bytes/s. Every batch
    decodes all ``new_tokens`` (an upper bound on its steps) at the datasheet's bandwidth (a
    lower bound on each step's time)."""
    return bytes_read(decoding, parameters, prompt_tokens, workers) / bandwidth
