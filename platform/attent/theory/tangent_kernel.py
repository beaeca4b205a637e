"""The empirical (attention) neural tangent kernel of any model, and its drift during training.

    K_θ(x_i, x_j) = Σ_e ⟨∂f_θ(x_i)_e / ∂θ, ∂f_θ(x_j)_e / ∂θ⟩

over the trainable parameters θ (a dict of tensors) and the entries e of one sample's output.
For a scalar output per sample this is the usual empirical NTK. For a vector- or matrix-valued
output (the attention learner's n × d_v) it is the *trace* of the matrix-valued kernel, i.e. the
sum over output entries of the entry-wise kernels: the kernel that the squared-error functional
gradient Σ_e (f_e − f*_e) ∂f_e/∂θ sees when every entry carries the same error. It is not the
kernel of the summed output Σ_e f_e (whose cross-entry terms this leaves out).

Reuse on any ``nn.Module`` whose output for one sample is a scalar (as ``attent.engine.antk`` tracks
the ANTK of a training run):

    params = {n: p for n, p in model.named_parameters() if p.requires_grad}   # or a subset
    K = empirical_kernel(model, params, probe_inputs, chunk=16)                # [N, N]

The module is called on a batch of one sample at a time (``inputs[i:i+1]``) through
``torch.func.functional_call``: put it in ``eval()`` mode (batch-norm statistics and dropout do not
go through ``vmap``). Parameters left out of ``params`` stay fixed. A function
``fn(params, *sample)`` (one sample, no batch axis) works the same way. Per-sample Jacobians are
computed ``chunk`` samples at a time (vmap over jacrev) and kept: memory N × E × P numbers (E
output entries per sample, P parameters), so give a probe set of tens of samples, or a subset of
the parameters (the last layers, LoRA adapters), for a large model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

Inputs = torch.Tensor | tuple[torch.Tensor, ...]


def per_sample_function(fn: nn.Module | Callable, buffers: Mapping[str, torch.Tensor] | None = None) -> Callable:
    """``g(params, *sample)``: the model's output for one sample (no batch axis)."""
    if not isinstance(fn, nn.Module):
        return fn
    module, fixed = fn, dict(buffers or {})

    def one_sample(params, *sample):
        batch = tuple(x.unsqueeze(0) for x in sample)
        return functional_call(module, {**fixed, **params}, batch).squeeze(0)

    return one_sample


def jacobian_features(
    fn: nn.Module | Callable,
    params: Mapping[str, torch.Tensor],
    inputs: Inputs,
    *,
    chunk: int = 32,
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per-sample Jacobians ∂f(x_i)/∂θ as [N, E, P] (E output entries, P parameters)."""
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    params = {name: p.detach() for name, p in params.items()}
    jacobian = vmap(jacrev(per_sample_function(fn, buffers)), in_dims=(None, *([0] * len(inputs))))
    count, blocks = inputs[0].shape[0], []
    for start in range(0, count, chunk):
        sample = tuple(x[start : start + chunk] for x in inputs)
        with torch.no_grad():  # function transforms ignore an outer no_grad; it keeps frozen weights out
            jac = jacobian(params, *sample)  # {name: [c, *out, *param]}
        c = sample[0].shape[0]
        entries = next(iter(jac.values())).shape[1 : 1 + _output_rank(jac, params)].numel()
        blocks.append(torch.cat([jac[name].reshape(c, entries, -1) for name in params], dim=-1))
    return torch.cat(blocks)


def _output_rank(jac: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor]) -> int:
    name = next(iter(params))
    return jac[name].dim() - 1 - params[name].dim()


def empirical_kernel(
    fn: nn.Module | Callable,
    params: Mapping[str, torch.Tensor],
    inputs: Inputs,
    *,
    chunk: int = 32,
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """K [N, N] with K_ij = Σ_e ⟨∂f(x_i)_e/∂θ, ∂f(x_j)_e/∂θ⟩ (see the module docstring)."""
    features = jacobian_features(fn, params, inputs, chunk=chunk, buffers=buffers)
    return torch.einsum("iep,jep->ij", features, features)


def brute_force_kernel(
    fn: nn.Module | Callable,
    params: Mapping[str, torch.Tensor],
    inputs: Inputs,
    *,
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The same kernel the slow way, as a check: one torch.autograd.grad per sample and output
    entry, then dot products."""
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    leaves = {name: p.detach().clone().requires_grad_(True) for name, p in params.items()}
    one_sample = per_sample_function(fn, buffers)
    rows = []
    for i in range(inputs[0].shape[0]):
        output = one_sample(leaves, *(x[i] for x in inputs)).reshape(-1)
        grads = [
            torch.cat([g.reshape(-1) for g in torch.autograd.grad(entry, list(leaves.values()), retain_graph=True)])
            for entry in output
        ]
        rows.append(torch.stack(grads).detach())  # [E, P]
    count = len(rows)
    kernel = torch.empty(count, count, dtype=rows[0].dtype)
    for i in range(count):
        for j in range(count):
            kernel[i, j] = sum(torch.dot(rows[i][e], rows[j][e]) for e in range(rows[i].shape[0]))
    return kernel


def relative_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖_F / ‖b‖_F."""
    return (torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b)).item()


def alignment(a: torch.Tensor, b: torch.Tensor) -> float:
    """⟨a, b⟩_F / (‖a‖_F ‖b‖_F): the cosine between two kernels, blind to their scale."""
    return (torch.sum(a * b) / (torch.linalg.matrix_norm(a) * torch.linalg.matrix_norm(b))).item()


def kernel_drift(kernels: list[torch.Tensor]) -> dict[str, list[float]]:
    """For kernels at successive checkpoints: the relative distance of each to the last
    (``to_final``), to the first (``to_initial``) and to the previous one (``step``; 0 for the first),
    and the alignment with the last, ⟨K_t, K_T⟩_F / (‖K_t‖_F ‖K_T‖_F) (``alignment_to_final``: 1 when
    the kernels differ by a scale factor only)."""
    final, initial = kernels[-1], kernels[0]
    return {
        "to_final": [relative_distance(k, final) for k in kernels],
        "alignment_to_final": [alignment(k, final) for k in kernels],
        "to_initial": [relative_distance(k, initial) for k in kernels],
        "step": [0.0] + [relative_distance(k, prev) for prev, k in zip(kernels, kernels[1:])],
    }
