"""Epoch checkpoints through Ray Train: model (trainable tensors and buffers only, so a LoRA
run stores its adapters, not the frozen base), optimiser, teacher, counters and history."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import contract


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    buffers = {name for name, _ in model.named_buffers()}
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if k in trainable or k in buffers}


def load_trainable_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    really_missing = [k for k in missing if k not in frozen]
    if unexpected or really_missing:
        raise RuntimeError(f"checkpoint does not match the model: missing {really_missing[:5]}, "
                           f"unexpected {unexpected[:5]}")


def save(state: dict[str, Any]) -> tempfile.TemporaryDirectory:
    """Write the state to a fresh temporary directory (kept alive by the returned handle
    until Ray Train has persisted it)."""
    tmp = tempfile.TemporaryDirectory(prefix="attent-ckpt-")
    torch.save(state, Path(tmp.name) / contract.CHECKPOINT_STATE_FILE)
    return tmp


def load(directory: str | Path) -> dict[str, Any]:
    return torch.load(Path(directory) / contract.CHECKPOINT_STATE_FILE, map_location="cpu", weights_only=False)
