"""`attent validate FILE`: an experiment, sweep, benchmark or theory file parsed, every run
expanded and checked (MLflow store, resources, data), nothing run; with ``--decode`` every data
file opened as well. Also what `attent bench --dry-run` prints."""

from __future__ import annotations

import sys


def validate(args) -> int:
    """``args.config`` with ``args.overrides`` (``args.workload``: only these workloads of a
    benchmark): parsed, every run expanded and checked; nothing runs. The YAML is read before
    anything heavy is imported, so a bad file is refused at once. ``args.decode`` opens every
    data file as well."""
    from ..experiment.files import load_experiment, read_yaml
    from ..sweep.spec import describe_sweep, is_sweep_file, load_sweep

    data = read_yaml(args.config)
    if {"problem", "teach"} & set(data):  # the theory lab's files (attent theory FILE)
        from ..theory.config import load

        cfg = load(args.config, args.overrides).resolved()
        from ..engine.preflight import check_theory

        check_theory(cfg)  # what `attent theory` checks before its first run
        print(
            f"{args.config}: OK — theory lab, {len(cfg.seeds)} seed(s), teaching rules {list(cfg.teach.rules)}, "
            f"{cfg.teach.max_iterations} iterations\nMLflow {cfg.mlflow.tracking_uri} (experiment "
            f"{cfg.mlflow.experiment!r})"
        )
        return 0
    if set(data) == {"benchmark"}:
        from ..benchmark import describe, load_benchmark

        spec, runs = load_benchmark(args.config, args.overrides, workloads=getattr(args, "workload", None))
        configs = [run.experiment.resolved() for run in runs]
        summary = describe(spec, runs)
    elif is_sweep_file(args.config):
        sweep = load_sweep(args.config, args.overrides)
        configs = [cfg.resolved() for _, cfg in sweep.trials]
        summary = describe_sweep(sweep)
    else:
        configs = [load_experiment(args.config, args.overrides).resolved()]
        cfg = configs[0]
        summary = (
            f"task {cfg.task.name}, {cfg.train.epochs} epochs, selection "
            f"{cfg.plan.label}, {cfg.ray.num_workers} worker(s)\n{cfg.plan.describe()}"
        )
    from ..engine.preflight import check_experiment

    check_experiment(*configs)  # MLflow store, resources, data
    if getattr(args, "decode", False):
        decode_files(configs)
    print(
        f"{args.config}: OK — {summary}\nMLflow {configs[0].mlflow.tracking_uri} "
        f"(experiment {configs[0].mlflow.experiment!r})"
    )
    return 0


def decode_files(configs) -> None:
    """Open every data file of the runs' tasks (once per distinct task data), with progress; a
    DataError naming each unreadable file."""
    from PIL import Image

    from ..tasks.config import DataError

    tasks = {}
    for cfg in configs:
        for task in [cfg.task] + [
            cfg.downstream_experiment(job, pretrained=None).resolved().task for job in cfg.downstream
        ]:
            tasks.setdefault(task.model_dump_json(include={"name", "data_path", "dataset"}), task)
    paths = list(dict.fromkeys(path for task in tasks.values() for path in task.data_files()))
    bad, step = [], max(1, len(paths) // 10)
    for number, (path, what) in enumerate(paths, 1):
        try:
            with Image.open(path) as image:
                image.load()
        except Exception as exc:  # noqa: BLE001 -- PIL raises many kinds for a broken file
            bad.append(f"{path} ({what}: {type(exc).__name__}: {' '.join(str(exc).split())})")
        if number % step == 0 or number == len(paths):
            print(f"decoded {number}/{len(paths)} files, {len(bad)} unreadable", file=sys.stderr, flush=True)
    if bad:
        raise DataError(
            f"{len(bad)} of {len(paths)} data files cannot be read: {'; '.join(bad[:20])}"
            + (f"; and {len(bad) - 20} more" if len(bad) > 20 else "")
            + ". Fix: replace or delete them"
        )
