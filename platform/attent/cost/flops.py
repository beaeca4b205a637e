"""FLOPs per sample, counted on the meta device with torch's own counter (no memory, no weights),
and throughput measured by real steps (``--measure``)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from attent.tasks.task import Probe


@dataclass(frozen=True)
class SampleFlops:
    train: float  # one sample's training step: forward and backward (recomputation included)
    score: float  # one sample's scoring forward
    parameters: int  # of the model
    trainable: int  # of them, those the optimiser updates


def count_flops(probe: Probe) -> SampleFlops:
    """The FLOPs of a one-sample training step and scoring forward of the probe's model, built
    on the meta device. Frozen weights get no weight gradient, so LoRA's backward is counted as it
    runs; gradient checkpointing's recomputed forward too. A model of identical blocks
    (``Probe.build_with_blocks``) is counted with one block and with two, and the difference,
    one block's, taken ``depth - 1`` times over the first: the same figures, in a tenth of the
    time of a 32-block model's count."""
    if probe.build_with_blocks is None or probe.depth < 3:
        return _count(probe, probe.build_model)
    one, two = (_count(probe, lambda n=n: probe.build_with_blocks(n)) for n in (1, 2))
    extra = probe.depth - 1
    return SampleFlops(
        one.train + extra * (two.train - one.train),
        one.score + extra * (two.score - one.score),
        one.parameters + extra * (two.parameters - one.parameters),
        one.trainable + extra * (two.trainable - one.trainable),
    )


def _count(probe: Probe, build) -> SampleFlops:
    with torch.device("meta"):
        model = build()
    batch = probe.batch(1, torch.device("meta"))
    model.train()
    with FlopCounterMode(display=False) as counter:
        probe.train_loss(model, batch).sum().backward()
    train = counter.get_total_flops()
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        probe.score_loss(model, batch)
    parameters = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return SampleFlops(float(train), float(counter.get_total_flops()), parameters, trainable)


@dataclass(frozen=True)
class Throughput:
    device: str  # where it was measured ("cuda: NVIDIA H100 80GB HBM3", "cpu")
    batch_size: int
    train_samples_per_s: float
    score_samples_per_s: float
    threads: int = 0  # torch's CPU threads during the steps
    # the task's own loader on its data here (None: its data is not here), with its processes:
    # 0 loads in the training process, between steps
    loader_samples_per_s: float | None = None
    loader_workers: int = 0

    def rates(self) -> tuple[float, float]:
        """(training, scoring) samples/s with the input pipeline: where the loader runs in
        worker processes beside the step, the slower of the two; where it runs in the step's
        own process (no loader workers), the step and the loading take turns."""
        loader = self.loader_samples_per_s
        if loader is None:
            return self.train_samples_per_s, self.score_samples_per_s
        if self.loader_workers:
            return min(self.train_samples_per_s, loader), min(self.score_samples_per_s, loader)
        return 1 / (1 / self.train_samples_per_s + 1 / loader), 1 / (1 / self.score_samples_per_s + 1 / loader)


def measure(
    probe: Probe,
    device: torch.device,
    *,
    batch_size: int,
    precision: str,
    score_batch_size: int | None = None,
    grad_clip: float | None = None,
    steps: int = 3,
    min_seconds: float = 1.0,
) -> Throughput:
    """Samples per second of real training steps (forward, backward, gradient clipping where
    the run clips, AdamW) and scoring forwards (of ``score_batch_size``, the scoring pass's)
    of the probe's model with random weights on ``device``, after one untimed step of each:
    at least ``steps`` steps and ``min_seconds`` of each, so that a small model's steps of a
    millisecond are timed over many."""
    with device:
        model = probe.build_model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-6, fused=device.type == "cuda" or None)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if precision == "bf16" and device.type == "cuda"
        else contextlib.nullcontext()
    )

    def train_step(batch) -> None:
        with autocast:
            loss = probe.train_loss(model, batch).float().mean()
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(trainable, grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def score_step(batch) -> None:
        with torch.no_grad(), autocast:
            probe.score_loss(model, batch)

    rates = []
    for mode, step, size in ((True, train_step, batch_size), (False, score_step, score_batch_size or batch_size)):
        model.train(mode)
        batch = probe.batch(size, device)
        step(batch)  # allocations, kernel selection
        _synchronize(device)
        start, done = time.perf_counter(), 0
        while done < steps or time.perf_counter() - start < min_seconds:
            step(batch)
            done += 1
            _synchronize(device)
        rates.append(done * size / (time.perf_counter() - start))
    name = f"cuda: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else device.type
    return Throughput(name, batch_size, rates[0], rates[1], torch.get_num_threads())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
