"""The accelerators ``attent plan`` prices runs on: peak dense throughput and memory bandwidth
from their vendors' datasheets. Dense: the datasheets' tensor-core figures "with sparsity" are
twice these. How fast a workload really trains on each, against the A100, is measured elsewhere
(``attent.cost.rates``): peaks are not speeds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Accelerator:
    name: str
    bf16: float  # FLOP/s, dense tensor cores (fp16 the same)
    tf32: float  # FLOP/s, dense tensor cores
    fp32: float  # FLOP/s, without tensor cores
    bandwidth: float  # bytes/s of device memory (HBM or GDDR): what greedy decoding is bound by
    source: str

    def peak(self, precision: str, tf32: bool = False) -> float:
        """The peak a run's matmuls reach: bf16 autocast on the tensor cores, fp32 on them only
        with TF32 allowed (``train.tf32``), else on the plain FP32 units."""
        if precision == "bf16":
            return self.bf16
        return self.tf32 if tf32 else self.fp32


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM; the 40 GB and 80 GB parts compute alike)"
_HOPPER = "NVIDIA {} Tensor Core GPU datasheet (SXM)"
ACCELERATORS: dict[str, Accelerator] = {
    "a100-80gb": Accelerator("NVIDIA A100 80GB", 312e12, 156e12, 19.5e12, 2.039e12, _A100),
    "a100-40gb": Accelerator("NVIDIA A100 40GB", 312e12, 156e12, 19.5e12, 1.555e12, _A100),
    "h100": Accelerator("NVIDIA H100 SXM", 989.4e12, 494.7e12, 66.9e12, 3.35e12, _HOPPER.format("H100")),
    "h200": Accelerator("NVIDIA H200 SXM", 989.4e12, 494.7e12, 66.9e12, 4.8e12, _HOPPER.format("H200")),
    "l4": Accelerator("NVIDIA L4", 121e12, 60e12, 30.3e12, 0.3e12, "NVIDIA L4 Tensor Core GPU datasheet"),
}
REFERENCE = "a100-80gb"  # the accelerator the utilisation table is stated on (rates.MFU)


def accelerator_named(device_name: str, memory_bytes: int) -> str | None:
    """The table's key for a CUDA device (``torch.cuda.get_device_properties``), None if absent."""
    name = device_name.upper()
    for key, word in (("h200", "H200"), ("h100", "H100"), ("l4", " L4")):
        if word in f" {name}":
            return key
    if "A100" in name:
        return "a100-80gb" if memory_bytes > 60 * 2**30 else "a100-40gb"
    return None
