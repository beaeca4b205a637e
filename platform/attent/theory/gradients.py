"""Closed-form parameter gradients of the attention learner, with the importance scalars ω, and
their check against autograd.

Source. The paper (Zhang et al., "Nonparametric Teaching of Attention Learners", ICLR 2026,
arXiv:2602.20461, Sec. 4.1) writes the query gradient as

    ∂f_θ(S) / ∂W^Q_(:,i) = [ d^{-1/2} S_(j,:) · ω_j ]_{n×d}

("element-specific scalars ω_j jointly determined by Q, K and V"). That line is all the stored
sources here give (paper notes quoting it; the arXiv text itself was not readable in this
environment), not the definition of ω_j nor the key and value lines. So ω is derived below in the
paper's notation, for one output entry f_(j,c) (query element j, output column c), with
A = softmax(Q Kᵀ/√d), z_jk = Σ_i Q_ji K_ki / √d and ∂A_jk/∂z_jl = A_jk (δ_kl − A_jl):

    ∂f_(j,c)/∂W^V_(:,b) = δ_cb Σ_k A_jk C_(k,:)                       (value: attention-weighted rows)
    ∂f_(j,c)/∂W^Q_(:,i) = d^{-1/2} S_(j,:) ω^Q_j,      ω^Q_j  = Σ_k A_jk (K_ki − Σ_l A_jl K_li) V_kc
    ∂f_(j,c)/∂W^K_(:,i) = d^{-1/2} Σ_l C_(l,:) ω^K_jl, ω^K_jl = A_jl Q_ji (V_lc − f_(j,c))

(C = S for self-attention, the context for cross-attention; masked attention has A_jk = 0 for
k > j and the same formulas.) Stacked over j, the query line is the paper's [d^{-1/2} S_(j,:) ω_j]
— the Jacobian of output column c with respect to W^Q_(:,i); the key gradient of f_(j,c) is the
sum of the stack [d^{-1/2} C_(l,:) ω^K_jl]_l over the key elements l.

Two readings of the per-column formula (``reading``):

* ``full``: ω uses the layer's attention A, computed from all d_k query/key columns. Exact for any
  d_k (up to rounding): the softmax couples the columns only through A, which the formula uses.
* ``column``: ω_j of column i computed as if column i were the only one, with
  A^(i) = softmax(Q_(:,i) K_(:,i)ᵀ / √d). The same as ``full`` when d_k = 1, wrong otherwise;
  ``gradient_check`` measures by how much. (The value gradient has no ω and no column index.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.func import jacrev

from .learner import attend, attention_weights, init_weights

READINGS = ("full", "column")


def importances(
    weights: dict[str, torch.Tensor],
    S: torch.Tensor,
    context: torch.Tensor | None = None,
    *,
    causal: bool = False,
    reading: str = "full",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ω^Q [n_q, d_k, d_v] indexed (j, i, c), ω^K [n_q, n_k, d_k, d_v] indexed (j, l, i, c)) for one
    sequence S [n_q, d] (and context [n_k, d])."""
    if reading not in READINGS:
        raise ValueError(f"unknown reading {reading!r}; choose one of {', '.join(READINGS)}")
    source = S if context is None else context
    Q, K, V = S @ weights["W_Q"], source @ weights["W_K"], source @ weights["W_V"]
    dim, key_dim = S.shape[-1], Q.shape[-1]
    if reading == "full":  # A_(i) = A for every column i
        A = attention_weights(Q, K, dim, causal).expand(key_dim, -1, -1)
    else:  # A_(i) = softmax(Q_(:,i) K_(:,i)ᵀ / √d), column by column
        A = attention_weights(Q.T.unsqueeze(-1), K.T.unsqueeze(-1), dim, causal)
    key_mean = torch.einsum("ijl,li->ij", A, K)  # Σ_l A_jl K_li      [i, j]
    centered = K.T.unsqueeze(1) - key_mean.unsqueeze(-1)  # K_ki − Σ_l A_jl K_li [i, j, k]
    omega_q = torch.einsum("ijk,ijk,kc->jic", A, centered, V)
    outputs = torch.einsum("ijl,lc->ijc", A, V)  # f_(j,c) under A_(i)  [i, j, c]
    deviation = V.unsqueeze(0).unsqueeze(0) - outputs.unsqueeze(2)  # V_lc − f_(j,c)    [i, j, l, c]
    omega_k = torch.einsum("ijl,ji,ijlc->jlic", A, Q, deviation)
    return omega_q, omega_k


def closed_form_jacobians(
    weights: dict[str, torch.Tensor],
    S: torch.Tensor,
    context: torch.Tensor | None = None,
    *,
    causal: bool = False,
    reading: str = "full",
) -> dict[str, torch.Tensor]:
    """∂f_(j,c)/∂W_(a,b) from the formulas above, per weight as [n_q, d_v, d, cols] (the layout of
    ``torch.func.jacrev`` for f [n_q, d_v] and W [d, cols])."""
    source = S if context is None else context
    Q, K = S @ weights["W_Q"], source @ weights["W_K"]
    A = attention_weights(Q, K, S.shape[-1], causal)
    value_dim = weights["W_V"].shape[1]
    omega_q, omega_k = importances(weights, S, context, causal=causal, reading=reading)
    scale = 1 / math.sqrt(S.shape[-1])
    eye = torch.eye(value_dim, dtype=S.dtype, device=S.device)
    return {
        "W_Q": scale * torch.einsum("ja,jic->jcai", S, omega_q),
        "W_K": scale * torch.einsum("la,jlic->jcai", source, omega_k),
        "W_V": torch.einsum("ja,cb->jcab", A @ source, eye),
    }


def autograd_jacobians(
    weights: dict[str, torch.Tensor], S: torch.Tensor, context: torch.Tensor | None = None, *, causal: bool = False
) -> dict[str, torch.Tensor]:
    """The same Jacobians by reverse-mode autograd (torch.func.jacrev)."""
    return jacrev(lambda w: attend(w, S, context, causal=causal))(weights)


@dataclass(frozen=True)
class GradientCase:
    kind: str = "self"  # self | masked | cross
    key_dim: int = 1  # d_k: query/key columns (1 = the single-column case)
    dim: int = 6  # d: token dimension
    value_dim: int = 5  # d_v
    seq_len: int = 7  # n (queries)
    context_len: int = 4  # n_k for cross-attention
    scale: float = 2.0  # weight scale: peaked attention, so errors are not hidden by uniform A

    @property
    def name(self) -> str:
        return f"{self.kind}, d_k={self.key_dim}"


DEFAULT_CASES = tuple(GradientCase(kind, key_dim) for kind in ("self", "masked", "cross") for key_dim in (1, 6))


def gradient_check(cases=DEFAULT_CASES, *, seed: int = 0, draws: int = 3) -> list[dict]:
    """Closed form against autograd, in float64, for every case × reading × weight, over ``draws``
    random (weights, sequence) pairs: the largest absolute deviation and that deviation relative to
    the largest autograd entry."""
    rows = []
    for case in cases:
        generator = torch.Generator().manual_seed(seed)
        worst: dict[tuple[str, str], list[float]] = {}
        for _ in range(draws):
            weights = init_weights(
                case.dim, case.key_dim, case.value_dim, scale=case.scale, generator=generator, dtype=torch.float64
            )
            S = torch.randn(case.seq_len, case.dim, generator=generator, dtype=torch.float64)
            context = (
                torch.randn(case.context_len, case.dim, generator=generator, dtype=torch.float64)
                if case.kind == "cross"
                else None
            )
            causal = case.kind == "masked"
            exact = autograd_jacobians(weights, S, context, causal=causal)
            for reading in READINGS:
                formula = closed_form_jacobians(weights, S, context, causal=causal, reading=reading)
                for block in ("W_V", "W_Q", "W_K"):
                    err = (formula[block] - exact[block]).abs().max().item()
                    rel = err / exact[block].abs().max().item()
                    old = worst.setdefault((reading, block), [0.0, 0.0])
                    worst[(reading, block)] = [max(old[0], err), max(old[1], rel)]
        for (reading, block), (err, rel) in worst.items():
            rows.append(
                {
                    "case": case.name,
                    "kind": case.kind,
                    "key_dim": case.key_dim,
                    "reading": reading,
                    "block": block,
                    "max_abs": err,
                    "max_rel": rel,
                }
            )
    return rows


def gradient_table(rows: list[dict]) -> str:
    """The check as a Markdown table: one row per case × reading, one column per weight."""
    lines = [
        "| case | reading of ω | W^V max abs (rel) | W^Q max abs (rel) | W^K max abs (rel) |",
        "|---|---|---:|---:|---:|",
    ]
    grouped: dict[tuple[str, str], dict[str, dict]] = {}
    for row in rows:
        grouped.setdefault((row["case"], row["reading"]), {})[row["block"]] = row
    for (case, reading), blocks in grouped.items():
        cells = [f"{blocks[b]['max_abs']:.1e} ({blocks[b]['max_rel']:.1e})" for b in ("W_V", "W_Q", "W_K")]
        lines.append(f"| {case} | {reading} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
