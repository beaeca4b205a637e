"""How far a reader travels from ``attent train <experiment>`` to the first gradient.

Two traces of the real code, joined at the Ray Train boundary (the trainer hands the worker's
entry point to Ray):

- the driver: ``attent train`` in this process (``cli/main.py``'s ``main``), traced until the TorchTrainer is
  built — then the run goes on for real (digits, one epoch, one worker);
- the worker: the recipe on a plain torch set-up in this process, traced until its first
  ``Tensor.backward``.

Reported: the project functions on the call stack at each end (the hops: caller -> callee
between project functions), and the project files whose functions ran on the way (what a reader
has to open). Python's profiler sees every call; only files under platform/attent count.

    python benchmarks/code_reading/reading_path.py [--experiment experiments/fashion_mnist_vit.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = str(REPO / "platform" / "attent")


def project_frames(frame) -> list[str]:
    """file:function of the project frames on the stack, outermost first."""
    names = []
    while frame is not None:
        if frame.f_code.co_filename.startswith(PROJECT):
            names.append(f"{os.path.relpath(frame.f_code.co_filename, PROJECT)}:{frame.f_code.co_name}")
        frame = frame.f_back
    return names[::-1]


class Trace:
    """Records the project files whose functions run, until ``stop(frame)`` says so; keeps that
    frame's project stack."""

    def __init__(self, stop):
        self.stop, self.files, self.stack = stop, [], None

    def __call__(self, frame, event, arg):
        if self.stack is not None or event != "call":
            return
        path = frame.f_code.co_filename
        if path.startswith(PROJECT):
            name = os.path.relpath(path, PROJECT)
            if name not in self.files:
                self.files.append(name)
        if self.stop(frame):
            self.stack = project_frames(frame)

    def __enter__(self):
        sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


def is_code(frame, filename: str, function: str) -> bool:
    return frame.f_code.co_name == function and frame.f_code.co_filename.endswith(filename)


def driver_path(experiment: str, workdir: Path) -> Trace:
    try:
        from attent.cli.main import main
    except ImportError:  # the layout before cli/
        from attent.cli import main

    os.chdir(workdir)
    with Trace(lambda f: is_code(f, "ray/train/v2/api/data_parallel_trainer.py", "__init__")) as trace:
        main(
            [
                "train",
                experiment,
                "train.epochs=1",
                "ray.num_workers=1",
                "task.train_limit=500",
                f"mlflow.tracking_uri=sqlite:///{workdir / 'mlflow.db'}",
                f"ray.storage_path={workdir / 'ray'}",
            ]
        )
    return trace


def worker_path(experiment: str) -> Trace:
    try:
        from attent.experiment.files import load_experiment
    except ImportError:  # the layout before experiment/
        from attent.config import load_experiment
    try:
        from attent.engine.recipe import TrainingRecipe, WorkerContext
    except ImportError:  # the layout before engine/recipe.py
        from attent.engine.loop import TrainingRecipe, WorkerContext
    cfg = load_experiment(experiment, ["task.train_limit=500"]).resolved()
    with Trace(lambda f: is_code(f, "torch/_tensor.py", "backward")) as trace:
        recipe = TrainingRecipe(cfg, WorkerContext())
        recipe.setup()
        recipe.run_epoch(0)
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default=str(REPO / "experiments/fashion_mnist_vit.yaml"))
    args = parser.parse_args()
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        driver = driver_path(args.experiment, Path(tmp))
        os.chdir(here)
    worker = worker_path(args.experiment)
    # the worker's entry point (driver side of the boundary) calls into the recipe
    stack = driver.stack + ["<Ray Train: the worker's entry point>"] + worker.stack
    files = list(dict.fromkeys(driver.files + worker.files))
    hops = sum(1 for a, b in zip(stack, stack[1:]) if "<" not in a + b)
    files_on_stack = list(dict.fromkeys(s.split(":")[0] for s in stack if "<" not in s))
    print("\n".join(stack))
    print(
        json.dumps(
            {
                "hops": hops,
                "functions_on_path": len(stack) - 1,
                "files_on_path": len(files_on_stack),
                "files_run_before_first_gradient": len(files),
                "files": files,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
