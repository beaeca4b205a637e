"""An evaluation's greedy decoding, priced by the memory it reads rather than the FLOPs it
computes: a decoding step multiplies one token per sequence by every weight, so it reads the
whole model (and each sequence's KV cache) for 2 x parameters FLOPs a sequence, far below what
the tensor cores could do at the batch sizes evaluation uses; its time is bytes / bandwidth."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Decoding:
    """What one evaluation generates and what each of its decoding steps reads."""

    answers: int  # sequences greedily decoded, over all ranks
    new_tokens: int  # steps a batch decodes at most (``max_new_tokens``; a batch stops at its longest answer)
    batch: int  # sequences decoded together, on each rank
    bytes_per_parameter: int  # of the weights read each step (the model's dtype)
    kv_bytes_per_token: int  # K and V of one token in every layer

    def bytes_read(self, parameters: int, prompt_tokens: float, workers: int) -> float:
        """Bytes one evaluation reads on all its ranks: each step the weights once, and each
        sequence's KV cache at its mean context over the answer (prompt + half the new tokens)."""
        shard = math.ceil(self.answers / workers)
        batches, last = divmod(shard, self.batch)
        context = prompt_tokens + self.new_tokens / 2
        steps_bytes = (batches + (last > 0)) * parameters * self.bytes_per_parameter
        sequences_bytes = shard * self.kv_bytes_per_token * context
        return workers * self.new_tokens * (steps_bytes + sequences_bytes)

    def seconds(self, parameters: int, prompt_tokens: float, workers: int, bandwidth: float) -> float:
        """Device-seconds of one evaluation on all its ranks at ``bandwidth`` bytes/s. Every
        batch decodes all ``new_tokens`` (an upper bound on its steps) at the datasheet's
        bandwidth (a lower bound on each step's time)."""
        return self.bytes_read(parameters, prompt_tokens, workers) / bandwidth
