"""The paper's attention learner: one layer, one head,

    f_θ(S) = softmax(Q Kᵀ / √d) V,   Q = S W^Q,  K = S W^K,  V = S W^V,

for a sequence S ∈ R^{n×d} (n elements, d features) and θ = (W^Q, W^K, W^V) with
W^Q, W^K ∈ R^{d×d_k}, W^V ∈ R^{d×d_v}. The scale is 1/√d, d the token dimension, as the paper
writes it (with d_k = d it is the usual 1/√d_k). The appendix's two variants:

* masked self-attention: element j attends to elements k ≤ j only (a causal mask), so the
  output at j does not depend on later elements;
* cross-attention: queries from one sequence S (n_q × d), keys and values from a context
  C (n_k × d): f_θ(S, C) = softmax(S W^Q (C W^K)ᵀ / √d) C W^V, an n_q × d_v output.

Everything is written on plain tensors with a dict of weights, so the same functions serve the
closed-form gradients, autograd (torch.func) and training; leading batch dimensions broadcast.
"""

from __future__ import annotations

import math

import torch
from torch import nn

KINDS = ("self", "masked", "cross")
WEIGHT_NAMES = ("W_Q", "W_K", "W_V")


def init_weights(
    dim: int,
    key_dim: int | None = None,
    value_dim: int | None = None,
    *,
    scale: float = 1.0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """W^Q, W^K (d × d_k) and W^V (d × d_v) with i.i.d. N(0, scale²/d) entries: for unit-variance
    tokens, queries, keys and values then have entries of variance scale²."""
    key_dim, value_dim = key_dim or dim, value_dim or dim
    std = scale / math.sqrt(dim)
    shapes = {"W_Q": (dim, key_dim), "W_K": (dim, key_dim), "W_V": (dim, value_dim)}
    return {name: torch.randn(*shape, generator=generator, dtype=dtype) * std for name, shape in shapes.items()}


def attention_weights(queries: torch.Tensor, keys: torch.Tensor, dim: int, causal: bool = False) -> torch.Tensor:
    """A = softmax(Q Kᵀ / √d) over the keys (last axis); with ``causal`` A[j, k] = 0 for k > j."""
    scores = queries @ keys.transpose(-1, -2) / math.sqrt(dim)
    if causal:
        n_q, n_k = scores.shape[-2:]
        later = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(later, float("-inf"))
    return softmax(scores)


def softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis, written out: the same values as ``torch.softmax``, but for rows of
    a few keys torch 2.14's CPU kernel is ~5x slower (512 × 8 × 8: ~4 ms against ~0.6 ms), which
    would dominate the teaching experiment's timings. Each row needs one finite score."""
    exp = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    return exp / exp.sum(dim=-1, keepdim=True)


def attend(
    weights: dict[str, torch.Tensor], S: torch.Tensor, context: torch.Tensor | None = None, *, causal: bool = False
) -> torch.Tensor:
    """f_θ(S) (self-attention), or f_θ(S, context) (cross-attention: keys and values from the
    context). S: [..., n, d]; returns [..., n, d_v]."""
    if causal and context is not None:
        raise ValueError("the causal mask is defined for self-attention only (context must be None)")
    source = S if context is None else context
    queries, keys, values = S @ weights["W_Q"], source @ weights["W_K"], source @ weights["W_V"]
    return attention_weights(queries, keys, S.shape[-1], causal) @ values


class AttentionLearner(nn.Module):
    """The learner as an nn.Module (parameters ``W_Q``, ``W_K``, ``W_V``), for code that wants
    one: ``kind`` is ``self``, ``masked`` (causal) or ``cross`` (``forward(S, context)``)."""

    def __init__(
        self,
        dim: int,
        key_dim: int | None = None,
        value_dim: int | None = None,
        *,
        kind: str = "self",
        scale: float = 1.0,
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown attention kind {kind!r}; choose one of {', '.join(KINDS)}")
        self.kind = kind
        for name, value in init_weights(dim, key_dim, value_dim, scale=scale, generator=generator, dtype=dtype).items():
            setattr(self, name, nn.Parameter(value))

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in WEIGHT_NAMES}

    def forward(self, S: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        if (self.kind == "cross") != (context is not None):
            raise ValueError("cross-attention takes a context; self and masked attention take none")
        return attend(self.weights(), S, context, causal=self.kind == "masked")
