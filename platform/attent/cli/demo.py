"""`attent demo`: the embedded default. On a local Ray and a local MLflow SQLite store, the small
time-to-accuracy benchmark's Fashion-MNIST workload — full data, AtteNT's ViT variant, random
subsets and InfoBatch, one run at a time — then its report and verdict."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..benchmark import run_benchmark

DEMO_SPEC = "benchmarks/specs/time_to_accuracy_demo.yaml"  # and its workload's experiments/fashion_mnist_vit.yaml
CLONE = Path(__file__).resolve().parents[3]  # the repository's top, in a clone or an editable install


def demo_benchmark() -> Path:
    """The demo's benchmark file: the clone's; from a wheel, the copy the wheel installs beside the
    environment (pyproject.toml's data-files: <prefix>/share/attent/, with the experiment it reads)."""
    if (CLONE / DEMO_SPEC).is_file():
        return CLONE / DEMO_SPEC
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution("attent").files or []
    except PackageNotFoundError:
        files = []
    for file in files:
        if file.as_posix().endswith(f"share/attent/{DEMO_SPEC}"):
            return Path(file.locate()).resolve()
    from ..experiment.schema import ConfigError

    raise ConfigError(
        f"the demo's benchmark ({DEMO_SPEC}) is neither in a clone nor installed with attent: reinstall it from a "
        "clone of attent's repository (pip install --force-reinstall '.[platform]' there), or run `make demo` in the "
        "clone; once attent is released on PyPI, pip install --force-reinstall 'attent[platform]'"
    )


DIGITS_OVERRIDES = ["task.dataset=digits", "task.train_limit=null", "task.test_limit=null", "train.epochs=15"]
FALLBACK_NOTICE = (
    "NOTE: Fashion-MNIST is not installed here, so this demo runs on sklearn's 8x8 digits (all 1,797, 15 epochs)\n"
    "      instead of the 600 Fashion-MNIST images for 60 epochs that the README and docs/getting-started.md describe:\n"
    "      its numbers are not theirs. For Fashion-MNIST: sudo apt-get install dataset-fashion-mnist (Debian/Ubuntu;\n"
    "      `make data` does it), or export ATTENT_FASHION_MNIST=<its idx folder>; then run the demo again."
)


def demo_overrides() -> tuple[list[str], str | None]:
    """Fashion-MNIST when Debian's package (or $ATTENT_FASHION_MNIST) is there, else digits: the
    overrides, and the notice printed at the demo's start and end when it falls back."""
    from ..tasks.vision.files import find_fashion_mnist

    try:
        find_fashion_mnist(None)
        return [], None
    except FileNotFoundError:
        return DIGITS_OVERRIDES, FALLBACK_NOTICE


def run_demo(workdir: Path, console=None) -> int:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # mlflow.db, ray_results/ and reports/ land here
    name = f"attent-demo-{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.perf_counter()
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    overrides, notice = demo_overrides()
    if notice:
        print(notice + "\n", flush=True)
    out = run_benchmark(
        demo_benchmark(),
        overrides + [f"mlflow.tracking_uri={uri}"],
        out_dir=workdir / "reports",
        name=name,
        console=console,
    )
    print(f"\nDemo wall-clock: {time.perf_counter() - start:.0f}s (Ray start-up and scheduling included)")
    print(f"Report: {out / 'time_to_accuracy.md'}, figures in {out / 'figures'}.")
    print(dashboard_hint(uri, name))
    if notice:  # said again where the results are read
        print("\n" + notice)
    return 0


def dashboard_hint(tracking_uri: str, experiment: str) -> str:
    """How to see the demo's runs: the `attent ui` command over its store, and the link that opens
    the experiment's training runs with the training view (MLflow's home page would open on its
    GenAI pages)."""
    from ..engine.dashboard import UI_DEFAULT_URL, experiment_link

    command = f"{Path(sys.executable).parent / 'attent'} ui --tracking-uri {tracking_uri}"
    link = experiment_link(tracking_uri, experiment, UI_DEFAULT_URL)
    if link is None:  # the benchmark logged nothing: nothing to open
        return f"Nothing was logged to MLflow ({tracking_uri}, experiment '{experiment}')."
    return (
        f"Everything is in MLflow ({tracking_uri}, experiment '{experiment}'). To see its training runs, start\n"
        f"  {command}\n"
        f"and open (attent ui prints it too):\n"
        f"  {link}"
    )
