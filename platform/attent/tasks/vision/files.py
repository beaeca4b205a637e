"""Where the vision datasets live on disk, and the checks the driver runs before Ray starts.
Standard library only: `attent validate` checks data without importing torch."""

from __future__ import annotations

import os
from pathlib import Path

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
FASHION_MNIST_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}
FASHION_MNIST_ENV = "ATTENT_FASHION_MNIST"
# Where Debian's `dataset-fashion-mnist` package puts the gzipped idx files.
FASHION_MNIST_DEBIAN_DIRS = (Path("/usr/share/datasets/fashion-mnist"),)
# `download: true` saves here through torchvision (which adds FashionMNIST/raw/).
DOWNLOAD_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "attent", "datasets")
# Gzipped idx files decompressed once, for every later process (read_idx).
IDX_CACHE = DOWNLOAD_ROOT.parent / "idx"

# Per-channel (mean, std) in [0, 1] units: the training set's for the fixed datasets; for
# arbitrary folders 0.5 / 0.5, which maps pixels to [-1, 1].
FASHION_MNIST_STATS = ((0.2860,), (0.3530,))
DIGITS_STATS = ((0.3053,), (0.3760,))
IMAGE_FOLDER_STATS = {1: ((0.5,), (0.5,)), 3: ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}

NATIVE_IMG_SIZE = {"fashion_mnist": 28, "digits": 8}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


# --- Fashion-MNIST --------------------------------------------------------------------------


def idx_file(folder: Path, split: str, kind: str) -> Path | None:
    """The idx file in folder, plain or gzipped, or None."""
    name = FASHION_MNIST_FILES[(split, kind)]
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def plain_idx(path: Path) -> Path | None:
    """A gzipped idx file's decompressed copy in IDX_CACHE, written by the first process that
    asks (atomically: concurrent workers race harmlessly) and named after the file's path, size
    and modification time, so a changed file gets a new copy. None where the cache cannot be
    written (the caller decompresses in memory)."""
    import gzip
    import hashlib
    import shutil
    import tempfile

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = IDX_CACHE / f"{path.name.removesuffix('.gz')}-{key}"
    if cached.is_file():
        return cached
    try:
        IDX_CACHE.mkdir(parents=True, exist_ok=True)
        target = tempfile.NamedTemporaryFile(dir=IDX_CACHE, prefix=f".{cached.name}.", delete=False)
    except OSError:
        return None
    try:
        with gzip.open(path, "rb") as source, target:
            shutil.copyfileobj(source, target, length=1 << 22)
        os.chmod(target.name, 0o644)  # a cache other users of the machine may read
        os.replace(target.name, cached)
        return cached
    finally:
        Path(target.name).unlink(missing_ok=True)


def _holds_fashion_mnist(folder: Path) -> bool:
    return all(idx_file(folder, split, kind) for split, kind in FASHION_MNIST_FILES)


def _candidate_folders(root: Path) -> list[Path]:
    """The folder itself, or the layout torchvision writes under a root."""
    return [root, root / "FashionMNIST" / "raw"]


def find_fashion_mnist(path: str | os.PathLike | None = None) -> Path:
    """The folder holding the four Fashion-MNIST idx files (each plain or .gz).

    An explicit ``path`` is the only place looked at (a typo should fail, not fall back silently).
    Otherwise: $ATTENT_FASHION_MNIST, Debian's /usr/share/datasets/fashion-mnist, then where
    ``download: true`` saves it (~/.cache/attent/datasets/FashionMNIST/raw).
    """
    if path is not None:
        roots = [Path(path).expanduser()]
    else:
        env = os.environ.get(FASHION_MNIST_ENV)
        roots = [*([Path(env).expanduser()] if env else []), *FASHION_MNIST_DEBIAN_DIRS, DOWNLOAD_ROOT]
    searched = [folder for root in roots for folder in _candidate_folders(root)]
    for folder in searched:
        if _holds_fashion_mnist(folder):
            return folder
    names = ", ".join(f"{name}[.gz]" for name in FASHION_MNIST_FILES.values())
    raise FileNotFoundError(
        f"Fashion-MNIST idx files ({names}) not found in: {', '.join(map(str, searched))}. "
        f"Get them with one of: `apt-get install dataset-fashion-mnist` (Debian/Ubuntu, installs "
        f"{FASHION_MNIST_DEBIAN_DIRS[0]}); set data_path or ${FASHION_MNIST_ENV} to a folder "
        f"holding them; or set `download: true` in the task config to fetch them with torchvision."
    )


def ensure_fashion_mnist(path: str | os.PathLike | None = None, download: bool = False) -> Path:
    """find_fashion_mnist, downloading into path (or DOWNLOAD_ROOT) if missing and allowed."""
    try:
        return find_fashion_mnist(path)
    except FileNotFoundError:
        if not download:
            raise
        return download_fashion_mnist(Path(path).expanduser() if path else DOWNLOAD_ROOT)


def download_fashion_mnist(root: Path = DOWNLOAD_ROOT) -> Path:
    """Download with torchvision into root/FashionMNIST/raw and return that folder."""
    from torchvision.datasets import FashionMNIST

    for train in (True, False):
        FashionMNIST(str(root), train=train, download=True)
    return find_fashion_mnist(root)


# --- image folders --------------------------------------------------------------------------


def scan_classes(root: Path) -> tuple[tuple[str, ...], list[Path], list[int]]:
    """Sorted class names (subfolders), image paths and their class ids."""
    classes = tuple(sorted(d.name for d in root.iterdir() if d.is_dir()))
    paths, labels = [], []
    for label, name in enumerate(classes):
        files = sorted(p for p in (root / name).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        paths += files
        labels += [label] * len(files)
    return classes, paths, labels


def has_train_test(root: Path) -> bool:
    return (root / "train").is_dir() and (root / "test").is_dir()


def check_image_folder(root: str | os.PathLike) -> Path:
    """root, if it holds at least two class subfolders with images; else a FileNotFoundError."""
    root = Path(root).expanduser()
    how = (
        "expected one subfolder per class holding its images (root/<class>/*.png), "
        "or root/train/<class>/ and root/test/<class>/"
    )
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist; {how}")
    for folder in [root / "train", root / "test"] if has_train_test(root) else [root]:
        classes, paths, _ = scan_classes(folder)
        if len(classes) < 2 or len(paths) == 0:
            raise FileNotFoundError(f"{folder} has {len(classes)} class subfolders and {len(paths)} images; {how}")
    return root
