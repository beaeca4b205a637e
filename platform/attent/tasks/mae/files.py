"""The multi-modal data layout MultiMAE reads, and the checks run before anything heavy loads.

``<root>/<split>/{rgb,depth,semseg}/<class>/<name>.png``: the same ``<class>/<name>`` set in every
modality folder of a split; rgb 8-bit RGB, depth 16-bit in ``depth_unit_m`` units (0 = invalid),
semseg 8-bit class ids (255 = ignore); optional ``<root>/dataset.json`` names the classes.
Standard library only: `attent validate` and the CLI check data without importing torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MODALITIES = ("rgb", "depth", "semseg")
SPLITS = ("train", "test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")  # rgb may be JPEG; depth and semseg are PNG
METADATA = "dataset.json"
IGNORE_INDEX = 255  # semseg id of pixels without a label
HOW_TO_GET = (
    "generate offline scenes with `attent data scenes --out DIR`, or prepare NYUv2 / ImageNet-S50 as MultiMAE does"
)
LAYOUT = "<root>/<split>/{rgb,depth,semseg}/<class>/<name>.png"
EXAMPLES = 3  # mismatched files shown in an error


def read_metadata(root: str | os.PathLike) -> dict | None:
    """root/dataset.json as a dict, or None when there is none (real data need not have one)."""
    path = Path(root).expanduser() / METADATA
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(meta).__name__}")
    return meta


def _listdir(folder: Path, *, dirs: bool) -> list[str]:
    """Sorted names of the sub-folders (dirs) or the image files of a folder (os.scandir: fast)."""
    with os.scandir(folder) as entries:
        if dirs:
            return sorted(e.name for e in entries if e.is_dir())
        return sorted(e.name for e in entries if e.is_file() and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES)


def scan_modality(folder: Path) -> dict[str, str]:
    """{"<class>/<stem>": "<class>/<file name>"} of one modality folder of a split."""
    found: dict[str, str] = {}
    for cls in _listdir(folder, dirs=True):
        for name in _listdir(folder / cls, dirs=False):
            key = f"{cls}/{os.path.splitext(name)[0]}"
            if key in found:
                raise ValueError(f"{folder} has two files for {key}: {found[key]} and {cls}/{name}")
            found[key] = f"{cls}/{name}"
    return found


def _mismatch(root: Path, split: str, listings: dict[str, dict[str, str]]) -> str | None:
    """A description of the files missing from some modality of a split, or None."""
    keys = set().union(*listings.values())
    missing = [(m, k) for k in sorted(keys) for m, files in listings.items() if k not in files]
    if not missing:
        return None
    examples = []
    for modality, key in missing[:EXAMPLES]:
        has = next(m for m, files in listings.items() if key in files)
        examples.append(f"{has} has {split}/{listings[has][key]} but {modality} has no such file")
    return (
        f"{root}/{split}: {len(missing)} file(s) missing from some modality folder, e.g. "
        f"{'; '.join(examples)}. Every modality needs the same <class>/<name> files"
    )


def scan_split(root: str | os.PathLike, split: str, modalities: tuple[str, ...] = MODALITIES) -> list[dict[str, str]]:
    """The samples of a split, sorted by class then name, each {modality: "<class>/<file>"};
    raises as check_multimodal_root does."""
    root = Path(root).expanduser()
    listings = {}
    for modality in modalities:
        folder = root / split / modality
        if not folder.is_dir():
            raise FileNotFoundError(f"modality folder {folder} is missing (expected {LAYOUT}); {HOW_TO_GET}")
        listings[modality] = scan_modality(folder)
    problem = _mismatch(root, split, listings)
    if problem:
        raise ValueError(problem)
    keys = sorted(listings[modalities[0]])
    if not keys:
        raise ValueError(f"{root}/{split} holds no images (expected {LAYOUT}); {HOW_TO_GET}")
    return [{m: listings[m][k] for m in modalities} for k in keys]


def scan_root(
    root: str | os.PathLike, *, splits: tuple[str, ...] = SPLITS, modalities: tuple[str, ...] = MODALITIES
) -> dict[str, list[dict[str, str]]]:
    """{split: scan_split(...)} after the checks of check_multimodal_root (one listing each)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"multi-modal data root {root} does not exist (expected {LAYOUT}); {HOW_TO_GET}")
    unknown = [m for m in modalities if m not in MODALITIES]
    if unknown or not modalities:
        raise ValueError(f"modalities {list(modalities)} must be a non-empty subset of {MODALITIES}")
    meta, found = read_metadata(root), {}
    for split in splits:
        found[split] = scan_split(root, split, tuple(modalities))
        if meta and "scene_classes" in meta:
            classes = {s[modalities[0]].split("/")[0] for s in found[split]}
            extra = sorted(classes - set(meta["scene_classes"]))
            if extra:
                raise ValueError(
                    f"{root}/{split} has class folders {extra} that {root / METADATA} "
                    f"does not list in scene_classes {meta['scene_classes']}"
                )
    return found


def check_multimodal_root(
    root: str | os.PathLike, *, splits: tuple[str, ...] = SPLITS, modalities: tuple[str, ...] = MODALITIES
) -> None:
    """Refuse a root that does not hold the layout: FileNotFoundError for a missing root or
    folder, ValueError for file names differing between modalities, an empty split, or class
    folders dataset.json does not name. Directory listings only, no image is decoded."""
    scan_root(root, splits=splits, modalities=modalities)
