"""The kubelet's side of a pod's volumes, replayed on a folder here (no Kubernetes on this machine)."""

from __future__ import annotations

import os
from pathlib import Path

RW_MASK, EXEC_MASK, SETGID = 0o660, 0o110, 0o2000  # pkg/volume/volume_linux.go's rwMask, execMask, ModeSetgid


def kubelet_mount(root: Path, fs_group: int, policy: str | None) -> bool:
    """What the kubelet does to a writable volume at each mount for a pod with ``fsGroup``
    (Kubernetes' pkg/volume/volume_linux.go, SetVolumeOwnership): with ``fsGroupChangePolicy:
    OnRootMismatch`` nothing where the volume's top already belongs to the group, setgid and group
    rwx; else (``Always``, the default) every file and folder goes to the group, files gain group
    read and write (0660), folders also group execute and setgid. Returns whether it changed them."""
    top = root.stat()
    if policy == "OnRootMismatch":
        wanted = RW_MASK | EXEC_MASK
        if top.st_gid == fs_group and top.st_mode & SETGID and top.st_mode & wanted == wanted:
            return False
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        os.chown(path, -1, fs_group)
        os.chmod(path, (mode & 0o7777) | RW_MASK | (EXEC_MASK | SETGID if path.is_dir() else 0))
    return True
