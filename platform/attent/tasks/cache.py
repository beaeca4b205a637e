"""Decoded caches: a data set's images decoded once, at the training size, into memory-mapped
integer arrays (``attent data cache``), which every epoch and every loader process then reads
instead of the image files (no decoding, no resizing; one copy in the page cache for all the
processes of a node).

A cache folder holds one data set at one image size::

    index.json                 what it holds: kind, image size, source, each split's sample count
                               and listing digest, each array's dtype and shape
    <split>.<array>.npy        uint8 [N, S, S, 3] rgb / image, uint16 [N, S, S] depth,
                               uint8 [N, S, S] semseg (numpy's .npy: memory-mapped as it lies)

Its default place is beside the data, ``<data_path>/.attent-cache/<S>px``; a task's
``cache_path`` says whether and where to read one (``locate``). A task compares a split's listing
(the samples' relative paths, in order) with the cache's digest and refuses a cache built from
other files. Standard library only at import (numpy when arrays are read or written): the task
configs and ``attent validate`` check a cache's index without numpy or torch.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

FORMAT = 1  # index.json's "format": bumped when the layout changes (older caches are refused)
INDEX = "index.json"
FOLDER = ".attent-cache"  # beside the data: <data_path>/.attent-cache/<S>px
AUTO, REQUIRED = "auto", "required"  # cache_path keywords (anything else names a folder)
KEYWORDS = (AUTO, REQUIRED)
CHUNK = 64  # rows a build worker decodes per task


def default_folder(data_path: str | os.PathLike, img_size: int) -> Path:
    """Where ``attent data cache`` writes by default and ``cache_path: auto`` looks."""
    return Path(data_path).expanduser() / FOLDER / f"{img_size}px"


def command(data_path: str | os.PathLike, img_size: int) -> str:
    """The command that builds the cache of a data set at a size (for error messages)."""
    return f"attent data cache {data_path} --img-size {img_size}"


def listing_digest(keys: Iterable[str]) -> str:
    """A split's identity: the sha256 of its samples' relative paths, one a line, in order."""
    digest = hashlib.sha256()
    for key in keys:
        digest.update(key.encode() + b"\n")
    return digest.hexdigest()


def read_index(folder: str | os.PathLike) -> dict[str, Any]:
    """A cache folder's index.json; FileNotFoundError / ValueError naming the folder otherwise."""
    path = Path(folder).expanduser() / INDEX
    if not path.is_file():
        raise FileNotFoundError(f"{path.parent} holds no decoded cache ({INDEX} is missing)")
    try:
        index = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); rebuild the cache") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ValueError(
            f"{path} is a cache of format {index.get('format') if isinstance(index, dict) else '?'}, "
            f"this attent reads format {FORMAT}; rebuild it (`attent data cache ... --force`)"
        )
    return index


def locate(cache_path: str | None, data_path: str | os.PathLike, img_size: int) -> Path | None:
    """The cache folder a task reads, from its ``cache_path``: None, never; ``"auto"``, the
    default folder when it holds a cache (else None: the image files are decoded as before);
    ``"required"``, the default folder, refused without a cache there; a folder, that one,
    refused without a cache. Refusals say the command that builds it."""
    if cache_path is None:
        return None
    folder = default_folder(data_path, img_size) if cache_path in KEYWORDS else Path(cache_path).expanduser()
    if (folder / INDEX).is_file():
        return folder
    if cache_path == AUTO:
        return None
    raise FileNotFoundError(
        f"cache_path={cache_path!r}: {folder} holds no decoded cache; build it with "
        f"`{command(data_path, img_size)}"
        + ("`" if cache_path in KEYWORDS else f" --out {folder}`")
        + " (or set task.cache_path: auto to decode the image files when there is none)"
    )


def check(
    index: dict[str, Any], folder: Path, *, kind: str, img_size: int, split: str, keys: Sequence[str]
) -> dict[str, Any]:
    """The index's entry for ``split``, after checking the cache holds this kind of data at this
    size and exactly these samples (ValueError saying how to rebuild it otherwise)."""
    rebuild = f"rebuild it (`attent data cache {index.get('source', '<data>')} --img-size {img_size} --force`)"
    if index.get("kind") != kind or index.get("img_size") != img_size:
        raise ValueError(
            f"{folder} caches {index.get('kind')} data at {index.get('img_size')} px, not {kind} at "
            f"{img_size} px; point cache_path at a cache of this size, or {rebuild}"
        )
    entry = index.get("splits", {}).get(split)
    if entry is None:
        raise ValueError(f"{folder} has no split {split!r} (it has {sorted(index.get('splits', {}))}); {rebuild}")
    if entry["count"] != len(keys) or entry["listing"] != listing_digest(keys):
        raise ValueError(
            f"{folder} was built from other files than {split!r} holds now ({entry['count']} samples "
            f"cached, {len(keys)} found, or other names); {rebuild}"
        )
    return entry


class MappedArray:
    """One array of a cache, memory-mapped read-only on first use in each process. Pickles as
    its path: DataLoader workers and Ray actors map the file themselves and share the pages."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._array: np.ndarray | None = None

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            import numpy as np

            self._array = np.load(self.path, mmap_mode="r")
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    def __len__(self) -> int:
        return self.shape[0]

    def row(self, i: int) -> np.ndarray:
        """Row i, copied out of the map (a writable array torch can take)."""
        return self.array[i].copy()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_array": None}


def arrays(folder: Path, split: str, names: Iterable[str]) -> dict[str, MappedArray]:
    return {name: MappedArray(folder / f"{split}.{name}.npy") for name in names}


# --- building -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """One split to cache: its samples (relative paths, for the digest), what decodes sample i
    into {array name: numpy array of the array's row shape}, and the arrays' row shapes and
    dtypes."""

    keys: Sequence[str]
    decode: Callable[[int], dict[str, np.ndarray]]  # picklable (a module function, a partial)
    rows: dict[str, tuple[tuple[int, ...], str]]  # name -> (row shape, dtype)
    extra: dict[str, Any] | None = None  # recorded in the split's index entry


_WORK: dict[str, Any] = {}  # a build worker's split and open arrays


def _open_for_writing(folder: Path, split_name: str, split: Split) -> None:
    import numpy as np

    _WORK["decode"] = split.decode
    _WORK["out"] = {name: np.load(folder / f"{split_name}.{name}.npy", mmap_mode="r+") for name in split.rows}


def _fill(rows: range) -> None:
    out = _WORK["out"]
    for i in rows:
        for name, value in _WORK["decode"](i).items():
            out[name][i] = value
    for array in out.values():
        array.flush()


def _build_split(folder: Path, name: str, split: Split, workers: int, progress: Callable[[str], None] | None) -> None:
    import numpy as np

    n = len(split.keys)
    for array, (shape, dtype) in split.rows.items():
        np.lib.format.open_memmap(folder / f"{name}.{array}.npy", mode="w+", dtype=np.dtype(dtype), shape=(n, *shape))
    chunks = [range(start, min(n, start + CHUNK)) for start in range(0, n, CHUNK)]
    if workers <= 1 or len(chunks) == 1:
        _open_for_writing(folder, name, split)
        for done, rows in enumerate(chunks, 1):
            _fill(rows)
            if progress and done % 50 == 0:
                progress(f"{name}: {rows.stop}/{n} samples")
        _WORK.clear()
        return
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with context.Pool(workers, initializer=_open_for_writing, initargs=(folder, name, split)) as pool:
        for done, _ in enumerate(pool.imap_unordered(_fill, chunks), 1):
            if progress and done % 50 == 0:
                progress(f"{name}: {min(n, done * CHUNK)}/{n} samples")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, e.g. what Ray or a cgroup gives it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build(
    out: str | os.PathLike,
    *,
    kind: str,
    img_size: int,
    source: str | os.PathLike,
    splits: dict[str, Split],
    workers: int | None = None,
    force: bool = False,
    meta: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Decode every sample of every split once into ``out`` (a new folder, or an old cache with
    ``force``): written into a sibling temporary folder by ``workers`` processes (default: the
    CPUs this process may use), its index last, then moved into place. Returns the index, with
    the build's seconds and bytes."""
    out = Path(out).expanduser()
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to rebuild it")
    workers = workers or available_cpus()
    start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        entries = {}
        for name, split in splits.items():
            _build_split(temporary, name, split, workers, progress)
            entries[name] = {
                "count": len(split.keys),
                "listing": listing_digest(split.keys),
                "arrays": {a: {"shape": [len(split.keys), *s], "dtype": d} for a, (s, d) in split.rows.items()},
                **(split.extra or {}),
            }
        index = {
            "format": FORMAT,
            "kind": kind,
            "img_size": img_size,
            "source": str(Path(source).expanduser().resolve()),
            "splits": entries,
            **(meta or {}),
        }
        (temporary / INDEX).write_text(json.dumps(index, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(temporary, out)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    size = sum(f.stat().st_size for f in out.iterdir())
    return {**index, "seconds": time.perf_counter() - start, "bytes": size, "workers": workers, "out": str(out)}


# --- config fields --------------------------------------------------------------------------

CONFIG_HELP = (
    "the decoded cache (`attent data cache`) to read the images from: auto (default), "
    "<data_path>/.attent-cache/<img_size>px when it is there, else the image files; required, "
    "that folder, refused without a cache; a folder; null, the image files"
)


def absolute(cache_path: str | None, base: Path) -> str | None:
    """A config's cache_path with a relative folder made absolute against ``base`` (keywords and
    absolute folders as they are)."""
    if cache_path is None or cache_path in KEYWORDS or Path(cache_path).expanduser().is_absolute():
        return cache_path
    return str((base / cache_path).resolve())


def check_config(cache_path: str | None, data_path: str | os.PathLike, img_size: int) -> None:
    """What ``attent validate`` and the driver check of a cache_path before Ray starts: a
    required or named cache is there (FileNotFoundError with the command otherwise), and its
    index is readable, of this size."""
    folder = locate(cache_path, data_path, img_size)
    if folder is not None and cache_path != AUTO:
        index = read_index(folder)
        if index.get("img_size") != img_size:
            raise ValueError(f"{folder} caches images at {index.get('img_size')} px, the task reads {img_size} px")
