"""Where an LLM training step's time goes on one device: a benchmark run's configuration set up as
its run was, one warm-up epoch, then one epoch under torch.profiler, one under cProfile and one
plain (training only). The run is read from an MLflow store (``attent bench --local`` on a GPU
node writes ``mlflow.db``: the verdict run of --method and --seed in --experiment) or from a
``runs.json`` of the saved H100 results. No Ray is started; the profiled epochs are not recorded.

    python benchmarks/llm/llm_gpu_profile.py sqlite:///mlflow.db --experiment llm-size-b32 --method full --seed 0 \\
        --out prof task.data_dir=$PWD/data [more key=value overrides] [--tag NAME]
    python benchmarks/llm/llm_gpu_profile.py benchmarks/results/llm_size/h100/runs.json --method full --out prof

With ``--timing N`` it skips both profilers and times N plain epochs after the warm-up (for
comparing settings: precision, the base model's dtype, batch size, ``--compile``).

Writes ``NAME.summary.json`` (wall per step, the device's busy share, kernel launches and host
syncs per step, the top operators by host and by device time), ``NAME.profile.txt`` (operator
tables and the top Python functions) and ``machine.json`` into ``--out``, by default a new folder
``benchmarks/results/llm_gpu_profile/<date>-<machine>-<commit>/``; NAME defaults to the method.
Building the profiler's tables takes minutes for an epoch of many kernels (2.5 min for 126,000 on
an H100 node).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from attent import contract
from attent.experiment.files import parse_overrides
from attent.experiment.schema import ExperimentConfig
from attent.selection.config import deep_merge

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync", "cudaEventSynchronize")


def recorded_config(args) -> dict[str, Any]:
    """The configuration the verdict run of ``args.method`` and ``args.seed`` trained with."""
    if args.source.endswith(".json"):
        recorded = json.loads(Path(args.source).read_text())
        return next(
            r
            for r in recorded["runs"]
            if r["method"] == args.method and r["seed"] == args.seed and r["stage"] == contract.BENCH_STAGE_VERDICT
        )["config"]
    import yaml
    from mlflow import MlflowClient

    client = MlflowClient(args.source)
    experiment = client.get_experiment_by_name(args.experiment or "")
    if experiment is None:
        sys.exit(f"no experiment {args.experiment!r} in {args.source}: name the benchmark with --experiment")
    found = client.search_runs(
        [experiment.experiment_id],
        " and ".join(
            [
                f"tags.`{contract.TAG_BENCH_METHOD}` = '{args.method}'",
                f"params.seed = '{args.seed}'",
                f"tags.`{contract.TAG_BENCH_STAGE}` = '{contract.BENCH_STAGE_VERDICT}'",
                "attributes.status = 'FINISHED'",
            ]
        ),
        max_results=1,
    )
    if not found:
        sys.exit(f"no finished verdict run of {args.method}, seed {args.seed} in {args.experiment}")
    with tempfile.TemporaryDirectory() as scratch:
        return yaml.safe_load(Path(client.download_artifacts(found[0].info.run_id, "config.yaml", scratch)).read_text())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: which recorded run, what to change in it, and what to measure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="an MLflow tracking URI (with --experiment), or a saved runs.json")
    parser.add_argument("--experiment", help="the benchmark's MLflow experiment (its name)")
    parser.add_argument("--method", default="full")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="results folder (default: a new stamped one under results/llm_gpu_profile/)")
    parser.add_argument("--tag", help="the files' name (default: the method)")
    parser.add_argument("--timing", type=int, metavar="N", help="no profilers: time N plain epochs after the warm-up")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (dynamic shapes)")
    parser.add_argument("overrides", nargs="*", help="key=value settings over the recorded configuration")
    return parser.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    import torch
    from attent.engine.recipe import TrainingRecipe, WorkerContext

    data = deep_merge(recorded_config(args), parse_overrides(args.overrides))
    data["train"]["epochs"] = max(1 + (args.timing or 3), data["train"]["epochs"])  # warm-up, then the measured
    cfg = ExperimentConfig.model_validate(data).resolved()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out, tag = harness.results_folder(args.out), args.tag or args.method

    recipe = TrainingRecipe(cfg, WorkerContext(device=device))
    compiled = (lambda model: torch.compile(model, dynamic=True)) if args.compile else (lambda model: model)
    recipe.setup(wrap_model=lambda model: compiled(model.to(device)))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def epoch(number: int) -> tuple[float, int]:
        sync()
        started = time.perf_counter()
        recipe.selector.begin_epoch(0)  # all data, at the learning rate of epoch ``number``
        steps = recipe.train_one_epoch(number)  # training only: no scoring pass, no evaluation
        sync()
        return time.perf_counter() - started, steps

    warm_s, steps = epoch(0)
    head = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "method": args.method,
        "seed": args.seed,
        "overrides": args.overrides,
        "compile": args.compile,
        "batch_size": cfg.train.batch_size,
        "precision": cfg.train.precision,
        "steps_per_epoch": steps,
    }
    if args.timing:
        summary = time_plain_epochs(epoch, args.timing, device, head, warm_s)
        (out / f"{tag}.summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary), flush=True)
        return
    profile_epochs(epoch, device, head, warm_s, out, tag)


def time_plain_epochs(epoch, count: int, device, head: dict[str, Any], warm_s: float) -> dict[str, Any]:
    """``count`` plain epochs after the warm-up: the median epoch's seconds per step and samples
    per second, and the peak device memory."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    plain = [epoch(number)[0] for number in range(1, 1 + count)]
    median_s = statistics.median_high(plain)  # a measured epoch, the upper one of an even count
    steps = head["steps_per_epoch"]
    return {
        **head,
        "epoch_s": {"warm_up": warm_s, "plain": plain},
        "s_per_step_plain": median_s / steps,
        "samples_per_s": steps * head["batch_size"] / median_s,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }


def profile_epochs(epoch, device, head: dict[str, Any], warm_s: float, out: Path, tag: str) -> None:
    """One epoch under torch.profiler, one under cProfile and one plain; writes ``tag.summary.json``
    and ``tag.profile.txt`` into ``out`` and prints the summary without its operator lists."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        profiled_s, _ = epoch(1)
    profiler = cProfile.Profile()
    profiler.enable()
    cprofiled_s, _ = epoch(2)
    profiler.disable()
    plain_s, _ = epoch(3)

    steps = head["steps_per_epoch"]
    events = prof.key_averages()
    # Kernels only: a GPU-side annotation (the optimiser's step) spans kernels already counted
    device_us = sum(
        e.self_device_time_total for e in events if e.device_type.name == "CUDA" and not e.is_user_annotation
    )
    launches = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")  # the H100 summaries counted these
    kernel_launches = sum(e.count for e in events if e.key in launches)
    syncs = {e.key: e.count for e in events if e.key in SYNCS}
    by_host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
    by_device = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:25]
    python = io.StringIO()
    pstats.Stats(profiler, stream=python).sort_stats("cumulative").print_stats(40)
    summary = {
        **head,
        "epoch_s": {"warm_up": warm_s, "torch_profiler": profiled_s, "cprofile": cprofiled_s, "plain": plain_s},
        "s_per_step_plain": plain_s / steps,
        "device_busy_s": device_us / 1e6,
        "device_busy_share": device_us / 1e6 / profiled_s,
        "kernel_launches_per_step": kernel_launches / steps,
        "host_syncs_per_step": {k: v / steps for k, v in syncs.items()},
        "top_by_host": [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in by_host],
        "top_by_device": [(e.key, e.count, e.self_device_time_total / 1e3) for e in by_device],
    }
    (out / f"{tag}.summary.json").write_text(json.dumps(summary, indent=1))
    table = events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)
    if device.type == "cuda":
        table += "\n\n" + events.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=60)
    (out / f"{tag}.profile.txt").write_text(table + "\n\n" + python.getvalue())
    print(json.dumps({k: v for k, v in summary.items() if not k.startswith("top_")}, indent=1), flush=True)


if __name__ == "__main__":
    main()
