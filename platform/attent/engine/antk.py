"""Empirical ANTK tracking on a fixed probe set, for any task of the engine (``antk:``).

After chosen epochs, rank 0 computes the empirical kernel

    K_ij = <df(x_i)/dθ, df(x_j)/dθ>

on ``probe_size`` training samples fixed for the run (scoring view: no augmentation), over the
model's trainable parameters θ (the LoRA adapters only, for the LLM task), f being the task's
``kernel_output``: vision, the true class's logit; MAE / MultiMAE, the reconstruction loss under
one seeded mask; LLM, the mean log-likelihood of the response tokens.

The kernel is ``attent.theory.tangent_kernel.empirical_kernel`` (torch.func: vmap over samples of
jacrev, ``sample_chunk`` samples per call), summed over blocks of at most ``param_chunk``
parameters, so memory holds probe x block Jacobian entries, not probe x all parameters (each block
re-runs the probe's forward and backward: time grows with the number of blocks).

It changes nothing trained: the unwrapped model in eval mode, gradient buffers untouched, the
random generators forked, no collective op (the other ranks wait at the epoch's report). Its time
is ``time_antk_s``, outside the epochs' time split. Logged: per tracked epoch the drift from the
previous kernel; at the end each kernel's drift to the final one and alignment with it, the
kernels (``antk/kernels.npz``) and figures (heatmaps, drift).
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from .. import contract
from ..experiment.schema import AntkConfig
from ..tasks.task import Batch, Task
from ..theory.tangent_kernel import empirical_kernel, kernel_drift, relative_distance

if TYPE_CHECKING:
    from .tracking import RunLogger

# vmap runs ops that lack a batching rule (SDPA on CPU) sample by sample: slower, still exact.
VMAP_FALLBACK_WARNING = "There is a performance drop"
STATE_KEY = "antk"  # the tracker's entry in the run's Ray Train checkpoints


def probe_indices(num_samples: int, size: int, seed: int) -> torch.Tensor:
    """``size`` distinct training indices, ascending, from a generator of their own."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(num_samples, generator=generator)[: min(size, num_samples)].sort().values


def trainable_named(task: Task, model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters the optimiser updates (``task.trainable_parameters``), by name."""
    trainable = {id(p) for p in task.trainable_parameters(model)}
    return {name: p for name, p in model.named_parameters() if id(p) in trainable}


def parameter_blocks(params: dict[str, torch.Tensor], max_block: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive groups of at most ``max_block`` parameters (a larger tensor is a block alone)."""
    blocks: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, param in params.items():
        if blocks[-1] and size + param.numel() > max_block:
            blocks.append({})
            size = 0
        blocks[-1][name] = param
        size += param.numel()
    return [block for block in blocks if block]


class TaskOutput(nn.Module):
    """``forward(*tensors)`` = ``task.kernel_output(model, batch)``, the batch rebuilt from its
    tensors: what ``empirical_kernel`` calls, one sample at a time, through functional_call."""

    def __init__(self, task: Task, model: nn.Module, batch_keys: list[str]):
        super().__init__()
        self.task, self.model, self.batch_keys = task, model, batch_keys

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.task.kernel_output(self.model, dict(zip(self.batch_keys, tensors)))


def probe_kernel(task: Task, model: nn.Module, batch: Batch, *, sample_chunk: int, param_chunk: int) -> torch.Tensor:
    """K [N, N] (float64, CPU) of ``task.kernel_output`` over the model's trainable parameters,
    block by block of at most ``param_chunk`` parameters. The model should be in eval mode."""
    if not all(isinstance(value, torch.Tensor) for value in batch.values()):
        raise TypeError(f"kernel tracking needs batches of tensors, got {sorted(batch)}")
    keys = list(batch)
    output = TaskOutput(task, model, keys)
    params = {f"model.{name}": p for name, p in trainable_named(task, model).items()}
    inputs = tuple(batch[key] for key in keys)
    kernel = None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=VMAP_FALLBACK_WARNING)
        for block in parameter_blocks(params, param_chunk):
            part = empirical_kernel(output, block, inputs, chunk=sample_chunk).double()
            kernel = part if kernel is None else kernel + part
    return ((kernel + kernel.T) / 2).cpu()  # exactly symmetric (float32 dot products are not)


class KernelTracker:
    """Rank 0's kernels of one run: the probe set, which epochs, the kernels so far."""

    def __init__(self, config: AntkConfig, epochs: int, task: Task, model: nn.Module, device: torch.device):
        self.config, self.epochs, self.task, self.model, self.device = config, epochs, task, model, device
        self.indices = probe_indices(len(task.scoring_dataset()), config.probe_size, config.seed)
        self.parameters = sum(p.numel() for p in trainable_named(task, model).values())
        self.kernels: dict[int, torch.Tensor] = {}  # epoch (0-based) after which it was taken -> K
        self.seconds: dict[int, float] = {}  # its computation time
        self._probe: Batch | None = None

    def heatmap_epochs(self) -> list[int]:
        """0-based epochs drawn as heatmaps: ``heatmap_epochs`` (1-based), else first, middle, last."""
        if self.config.heatmap_epochs is not None:
            return sorted({epoch - 1 for epoch in self.config.heatmap_epochs})
        return sorted({0, (self.epochs - 1) // 2, self.epochs - 1})

    def due(self, epoch: int) -> bool:
        return epoch in (0, self.epochs - 1) or (epoch + 1) % self.config.every == 0 or epoch in self.heatmap_epochs()

    def probe(self) -> Batch:
        """The probe samples as one batch on the device, read once."""
        if self._probe is None:
            dataset = self.task.scoring_dataset()
            batch = self.task.collate([dataset[int(i)] for i in self.indices])
            self._probe = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        return self._probe

    def compute(self) -> torch.Tensor:
        """The current model's kernel, in eval mode, the random generators left as they were."""
        was_training = self.model.training
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            self.model.eval()
            try:
                return probe_kernel(
                    self.task,
                    self.model,
                    self.probe(),
                    sample_chunk=self.config.sample_chunk,
                    param_chunk=self.config.param_chunk,
                )
            finally:
                self.model.train(was_training)

    def track(self, epoch: int) -> dict[str, float]:
        """After epoch ``epoch``: its kernel when due, and the epoch's metrics (the cumulative
        kernel time, the drift from the previous kernel)."""
        if not self.due(epoch):
            return {}
        start = time.perf_counter()
        kernel = self.compute()
        self.seconds[epoch] = time.perf_counter() - start
        earlier = [e for e in self.kernels if e < epoch]
        self.kernels[epoch] = kernel
        metrics = {contract.TIME_ANTK: sum(self.seconds.values())}
        if earlier:
            metrics[contract.ANTK_DRIFT_CONSECUTIVE] = relative_distance(kernel, self.kernels[max(earlier)])
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"indices": self.indices, "kernels": dict(self.kernels), "seconds": dict(self.seconds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not torch.equal(state["indices"], self.indices):  # antk.seed or probe_size changed
            print("[attent] antk: the probe set changed since the checkpoint; earlier kernels dropped", flush=True)
            return
        self.kernels, self.seconds = dict(state["kernels"]), dict(state["seconds"])

    def log_final(self, logger: RunLogger) -> None:
        """Each kernel's drift to the final one and alignment with it (step = its epoch), the
        kernels as ``antk/kernels.npz``, the heatmap and drift figures."""
        from . import figures

        epochs = sorted(self.kernels)
        kernels = [self.kernels[e] for e in epochs]
        drift = kernel_drift(kernels)
        for epoch, to_final, aligned in zip(epochs, drift["to_final"], drift["alignment_to_final"]):
            logger.log_metrics(
                {contract.ANTK_DRIFT_TO_FINAL: to_final, contract.ANTK_ALIGNMENT_TO_FINAL: aligned}, step=epoch
            )
        logger.log_metrics({contract.ANTK_PARAMETERS: self.parameters}, step=self.epochs)
        with tempfile.TemporaryDirectory(prefix="attent-antk-") as tmp:
            path = Path(tmp) / Path(contract.ANTK_KERNELS_ARTIFACT).name
            np.savez(
                path,
                epochs=np.array(epochs),
                kernels=torch.stack(kernels).numpy(),
                probe_indices=self.indices.numpy(),
                seconds=np.array([self.seconds[e] for e in epochs]),
            )
            logger.log_files([path], str(Path(contract.ANTK_KERNELS_ARTIFACT).parent))
        shown = [e for e in self.heatmap_epochs() if e in self.kernels]
        for name, figure in figures.antk_figures(epochs, kernels, drift, shown).items():
            logger.log_figure(figure, name)


def tracker_for(cfg, task: Task, model: nn.Module, rank: int, device: torch.device) -> KernelTracker | None:
    """The run's tracker on rank 0 when ``antk.enabled``; None elsewhere."""
    if not cfg.antk.enabled or rank != 0:
        return None
    return KernelTracker(cfg.antk, cfg.train.epochs, task, model, device)
