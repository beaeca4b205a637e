"""How fast each workload really trains: its model-FLOPs utilisation (MFU) on the A100, from
published measured times, and each accelerator's speed against the A100 from published measured
throughput (not from peak FLOPs: an H100's dense peak is 3.17 times an A100's, its measured
training throughput 2 to 2.4 times). Every figure names where it comes from; an estimate says so.

MFU here is as ``attent plan`` counts FLOPs: every FLOP the step runs, gradient checkpointing's
recomputed forward included (what MosaicML calls HFU), at the precision's dense peak."""

from __future__ import annotations

from dataclasses import dataclass

from attent.cost.accelerators import ACCELERATORS, REFERENCE


@dataclass(frozen=True)
class Figure:
    value: float
    source: str
    estimate: bool = False  # not a measurement: chosen between or carried from measured ones

    def describe(self) -> str:
        """The figure with where it comes from, in one line."""
        return f"{self.value:g} ({'estimate: ' if self.estimate else ''}{self.source})"


# workload kind (``Probe.workload``) -> MFU on an A100 80GB in bf16
MFU: dict[str, Figure] = {
    "llm": Figure(
        0.37,
        "Qwen-7B's README, LoRA on one A100-SXM4-80G, bf16, flash attention 2, gradient checkpointing, "
        "8 sequences of 512 tokens in 1.5 s: 2,731 tokens/s at 42.5 GFLOPs a token counted with the "
        "recomputed forward (Llama 2's own pre-training, 184,320 A100-hours for 2.0T tokens of 7B, is 0.39)",
    ),
    "mae": Figure(
        0.25,
        "between DailyMAE (MAE-B/16, 800 ImageNet-1k epochs in 18 h on 8 A100s: 0.37 counted at 224 px, "
        "an upper bound as it trains its early epochs at lower resolution) and the MAE reference code "
        "(ViT-L/16, 800 epochs in ~42 h on 64 V100s: 0.10), nearer DailyMAE's decoded, GPU-bound pipeline, "
        "which the decoded cache gives",
        estimate=True,
    ),
    "vit": Figure(
        0.3,
        "between DeiT-B (300 ImageNet-1k epochs in 53 h on 8 V100s: 0.21) and NVIDIA NeMo's ViT g/14 "
        "(693 samples/s on 8 A100s: 0.45)",
        estimate=True,
    ),
    "other": Figure(0.3, "the ViT's, for a task without a probe", estimate=True),
}

_LLM_FOUNDRY = (
    "MosaicML llm-foundry's training benchmarks, MPT-7B at 1,024 tokens on 8 GPUs, bf16, activation "
    "checkpointing: 10,203 tokens/s a GPU on H100 80GB, 4,357 on A100 80GB"
)
_NEMO_VIT = (
    "NVIDIA NeMo's ViT performance page, ViT g/14 on one 8-GPU node in the same configuration: "
    "1,428 samples/s on DGX H100, 693 on DGX A100"
)
_SAME_CHIP = "the same chip and clocks as the A100 80GB; compute-bound training uses little of its bandwidth"
# accelerator -> workload family -> training throughput against the A100 80GB's (tensor-core precisions)
SPEED: dict[str, dict[str, Figure]] = {
    "a100-80gb": {"llm": Figure(1.0, "the reference"), "vision": Figure(1.0, "the reference")},
    "a100-40gb": {"llm": Figure(1.0, _SAME_CHIP, True), "vision": Figure(1.0, _SAME_CHIP, True)},
    "h100": {"llm": Figure(round(10_203 / 4_357, 2), _LLM_FOUNDRY), "vision": Figure(round(1_428 / 693, 2), _NEMO_VIT)},
    "h200": {
        "llm": Figure(round(10_203 / 4_357, 2), "the H100's: the same compute and more bandwidth", True),
        "vision": Figure(round(1_428 / 693, 2), "the H100's: the same compute and more bandwidth", True),
    },
    "l4": {
        "llm": Figure(
            round(121 / 312, 2), "the dense bf16 peaks' ratio: no published measured training throughput", True
        ),
        "vision": Figure(
            round(121 / 312, 2), "the dense bf16 peaks' ratio: no published measured training throughput", True
        ),
    },
}


def utilisation(kind: str) -> Figure:
    """The MFU table's figure for a workload kind (the A100's), ``other``'s where it has none."""
    return MFU.get(kind, MFU["other"])


def speed(gpu: str, kind: str, precision: str = "bf16", tf32: bool = False) -> Figure:
    """``gpu``'s training throughput against the A100 80GB's for a workload kind, measured on
    the tensor cores; in fp32 without TF32 (no published measurement) the peaks' ratio."""
    reference, accelerator = ACCELERATORS[REFERENCE], ACCELERATORS[gpu]
    if precision != "bf16" and not tf32:
        ratio = accelerator.peak(precision) / reference.peak(precision)
        return Figure(ratio, "the fp32 peaks' ratio: no published measured fp32 training throughput", True)
    return SPEED[gpu]["llm" if kind == "llm" else "vision"]
