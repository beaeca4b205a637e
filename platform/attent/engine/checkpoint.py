"""Epoch checkpoints through Ray Train: model (trainable tensors and buffers only, so a LoRA
run stores its adapters, not the frozen base), optimiser, selector, counters and history."""

from __future__ import annotations

import hashlib
import posixpath
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import contract
from .faults import CheckpointError


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    buffers = {name for name, _ in model.named_buffers()}
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if k in trainable or k in buffers}


def load_trainable_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    # every name of a frozen tensor: a tied one (an LM head sharing the embedding) has two
    frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    really_missing = [k for k in missing if k not in frozen]
    if unexpected or really_missing:
        raise RuntimeError(
            f"checkpoint does not match the model: missing {really_missing[:5]}, unexpected {unexpected[:5]}"
        )


DIGEST_SUFFIX = ".sha256"  # beside the state file: a checkpoint is checked when it is read


def save(state: dict[str, Any]) -> tempfile.TemporaryDirectory:
    """Write the state and its SHA-256 to a fresh temporary directory (kept alive by the returned
    handle until Ray Train has persisted it)."""
    tmp = tempfile.TemporaryDirectory(prefix="attent-ckpt-")
    path = Path(tmp.name) / contract.CHECKPOINT_STATE_FILE
    torch.save(state, path)
    path.with_name(path.name + DIGEST_SUFFIX).write_text(digest(path))
    return tmp


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def load(directory: str | Path) -> dict[str, Any]:
    """The state of one checkpoint; CheckpointError when it is missing, altered or unreadable."""
    path = Path(directory) / contract.CHECKPOINT_STATE_FILE
    recorded = path.with_name(path.name + DIGEST_SUFFIX)
    if not path.is_file():
        raise CheckpointError(f"no {path.name}")
    if recorded.is_file() and recorded.read_text().strip() != digest(path):  # older checkpoints have none
        raise CheckpointError(f"{path.name} differs from its recorded SHA-256 (altered or truncated)")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # unpickling, zip and I/O errors of a damaged file
        raise CheckpointError(f"{path.name} does not load ({type(exc).__name__}: {exc})") from exc


def load_newest_intact(filesystem, folder: str) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """The state of the newest readable checkpoint in the run's folder ``folder`` (on the pyarrow
    ``filesystem`` of Ray's storage), or None when the run has none yet; and the (path, why) of
    each checkpoint skipped. CheckpointError, naming them and the fix, when none can be read.

    The folder, not Ray Train's latest registered checkpoint, is the truth: a worker that dies
    right after ``ray.train.report`` has persisted its checkpoint before Ray's controller
    registered it, and restoring the registered one would lose that epoch."""
    import pyarrow.fs
    from ray.train import Checkpoint

    listed = filesystem.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True))
    candidates = sorted(
        (
            info.path
            for info in listed
            if info.type == pyarrow.fs.FileType.Directory and posixpath.basename(info.path).startswith("checkpoint_")
        ),
        reverse=True,
    )  # Ray names them checkpoint_<timestamp>: newest first
    if not candidates:
        return None, []
    skipped = []
    for path in candidates:
        try:
            with Checkpoint(path, filesystem=filesystem).as_directory() as directory:
                return load(directory), skipped
        except (CheckpointError, OSError) as exc:
            skipped.append((path, str(exc)))
    raise CheckpointError(
        f"no checkpoint of this run can be read: {'; '.join(f'{p}: {why}' for p, why in skipped)}. Fix: restore "
        f"them from a copy, or delete {folder} to train the run from the start"
    )


# --- Ray Train's local mode -----------------------------------------------------------------------
# With ``ray.num_workers: 0`` Ray Train runs the training function in the calling process and
# persists no checkpoint (its local mode has no storage context). The engine writes them itself,
# where and as Ray Train would (``<storage_path>/<name>/checkpoint_<timestamp>``), so that a re-run
# resumes the same way whichever mode wrote the newest one.


def run_storage(storage_path: str, name: str):
    """(pyarrow filesystem, folder) of the run's checkpoints: a local path or a storage URI."""
    import pyarrow.fs

    if "://" in storage_path:
        filesystem, root = pyarrow.fs.FileSystem.from_uri(storage_path)
    else:
        filesystem, root = pyarrow.fs.LocalFileSystem(), str(Path(storage_path).expanduser().resolve())
    return filesystem, posixpath.join(root, name)


def persist(directory: str, filesystem, folder: str, keep: int) -> str:
    """Copy a saved checkpoint ``directory`` into the run's folder under Ray Train's name for it,
    then delete all but the newest ``keep`` (Ray Train's ``CheckpointConfig.num_to_keep``)."""
    import pyarrow.fs

    # Ray Train's stamp (local time to the microsecond), so both modes' checkpoints sort together
    target = posixpath.join(folder, f"checkpoint_{datetime.now().strftime('%Y-%m-%d_%H-%M-%S.%f')}")
    filesystem.create_dir(target, recursive=True)
    pyarrow.fs.copy_files(
        directory, target, source_filesystem=pyarrow.fs.LocalFileSystem(), destination_filesystem=filesystem
    )
    listed = filesystem.get_file_info(pyarrow.fs.FileSelector(folder))
    saved = sorted(
        info.path
        for info in listed
        if info.type == pyarrow.fs.FileType.Directory and posixpath.basename(info.path).startswith("checkpoint_")
    )
    for old in saved[:-keep]:
        filesystem.delete_dir(old)
    return target
