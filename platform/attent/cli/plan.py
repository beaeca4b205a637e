"""`attent plan FILE [key=value ...]`: what each run of an experiment or sweep file costs, and all
of them together, before a GPU is paid for: its work in sample-epochs from the selection plan, its
FLOPs counted on the meta device, and GPU-hours (and money, given a price) on a named accelerator.
No Ray, no MLflow, no data or weights read (where a training set's size is known without them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_plan_command(sub) -> None:
    from ..cost.accelerators import ACCELERATORS
    from ..cost.options import Options

    p = sub.add_parser(
        "plan", help="price every run of an experiment or sweep file (work, FLOPs, GPU-hours, cost) without running it"
    )
    p.add_argument("config", help="experiment or sweep YAML")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. train.epochs=3")
    p.add_argument("--gpu", choices=sorted(ACCELERATORS), default=Options.gpu, help="the accelerator priced")
    p.add_argument(
        "--mfu",
        type=float,
        default=Options.mfu,
        help="model FLOPs utilisation on the priced GPU, for every run (default: each workload's measured MFU on the "
        "A100, carried to the GPU by its measured throughput; the table in attent.cost.rates)",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="measure the rates instead: real training and scoring steps of each model (random weights) and the task's "
        "own loader on its data where it is here, on this machine's GPU (on a CPU: the hours are this CPU's)",
    )
    p.add_argument("--price-per-gpu-hour", type=float, default=None, metavar="PRICE", help="the cost column's rate")
    p.add_argument("--samples", type=int, default=None, help="the training set's size, where nothing else says it")
    p.add_argument(
        "--flops-per-sample",
        type=float,
        default=None,
        help="a training step's FLOPs per sample, for a task without a probe",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="also write the estimate as JSON here")


def cmd_plan(args) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network: what is not here is refused, not fetched
    from ..experiment.files import load_experiment, read_yaml
    from ..sweep.spec import is_sweep_file, load_sweep

    data = read_yaml(args.config)
    if set(data) == {"benchmark"} or {"problem", "teach"} & set(data):
        raise ValueError(f"{args.config}: attent plan prices experiment and sweep files; this is not one")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise ValueError(f"--mfu {args.mfu} must lie in (0, 1]")
    if is_sweep_file(args.config):
        sweep = load_sweep(args.config, args.overrides)
        configs, labels = [cfg.resolved() for _, cfg in sweep.trials], trial_labels(sweep)
    else:
        configs, labels = [load_experiment(args.config, args.overrides).resolved()], {}
    from ..cost.estimate import estimate
    from ..cost.options import Options

    print(f"attent plan: counting the FLOPs of {len(configs)} run(s)' models on the meta device ...", file=sys.stderr)
    options = Options(
        gpu=args.gpu,
        mfu=args.mfu,
        measure=args.measure,
        price_per_gpu_hour=args.price_per_gpu_hour,
        samples=args.samples,
        flops_per_sample=args.flops_per_sample,
    )
    result = estimate(args.config, configs, options)
    print(render(result, labels))
    if args.json:
        data = result.to_json()
        for run in data["runs"]:  # a downstream job carries its own name
            run["label"] = labels.get(run["run"], "")
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
        print(f"written: {args.json}")
    return 0


def trial_labels(sweep) -> dict[str, str]:
    """Each trial's name with what the sweep file sets for it (its grid values, its trial entry)."""

    def shown(value) -> str:
        if isinstance(value, dict):
            return "/".join(str(v) for v in value.values())
        return str(value).rsplit("/", 1)[-1]  # a model or data path: its last part

    labels = {}
    for trial_id, cfg in sweep.trials:
        written = sweep.settings[trial_id]
        labels[cfg.name] = " ".join(f"{key.rsplit('.', 1)[-1]}={shown(v)}" for key, v in written.items())
    return labels


def render(result, labels: dict[str, str] | None = None) -> str:
    """The estimate as a table: one row per run (its label: how it differs from the others),
    then the total, then what it assumes."""
    labels = labels or {}
    width = min(64, max(len(f"{r.run} {labels.get(r.run, '')}".strip()) for r in result.runs))
    from ..cost.accelerators import ACCELERATORS

    accelerator = ACCELERATORS.get(result.accelerator)
    where = accelerator.name if accelerator else result.accelerator
    lines = [f"{result.file}: {len(result.runs)} run(s) on {where} ({result.source}), utilisation {result.utilisation}"]
    lines += [_measured(m) for m in result.measurements]
    header = (
        f"{'run':<{width}} {'samples':>9} {'ep':>4} {'trained':>9} {'scored':>9} {'limit':>6} {'FLOPs':>6} "
        f"{'GF/sample':>10} {'GPU-h':>9} {'eval h':>8} {'wall h':>8}{'  cost' if result.price_per_gpu_hour else ''}"
    )
    lines += [header, "-" * len(header)]
    for r in result.runs:
        cost = f" {r.cost:>8,.0f}" if r.cost is not None else ""
        name = f"{r.run} {labels[r.run]}" if labels.get(r.run) else r.run
        lines.append(
            f"{name[:width]:<{width}} {r.work.samples:>9,} {r.epochs:>4} {_short(r.work.trained):>9} "
            f"{_short(r.work.scored):>9} {r.work.limit:>6.1%} {r.flops_saving:>6.1%} "
            f"{r.flops.train / 1e9:>10,.1f} {_hours(r.method_gpu_hours):>9} {_hours(r.eval_gpu_hours):>8} "
            f"{_hours(r.wall_clock_hours):>8}{cost}"
        )
    totals = result.totals()
    cost = f" {totals['cost']:>8,.0f}" if totals["cost"] is not None else ""
    lines += [
        "-" * len(header),
        f"{'total':<{width}} {'':>9} {'':>4} {'':>9} {'':>9} {'':>6} {'':>6} {'':>10} "
        f"{_hours(totals['method_gpu_hours']):>9} {_hours(totals['eval_gpu_hours']):>8}{'':>9}{cost}",
        "trained/scored: sample-epochs back-propagated / forwarded by scoring passes; limit: 1 - (trained + "
        "scored/3) / full data's; FLOPs: the same saving in counted FLOPs; GF/sample: one sample's training step "
        "in 1e9 FLOPs; GPU-h: training and scoring on all the run's GPUs; wall h: all its hours / its GPUs "
        "(under 0.1 h: seconds)",
    ]
    samples = {(r.task, r.sample, r.flops): None for r in result.runs}
    for task, sample, flops in samples:
        lines.append(
            f"  {task} ({sample}): {flops.train / 1e9:,.2f} GFLOPs a training step, {flops.score / 1e9:,.2f} a "
            f"scoring forward, per sample; {flops.parameters / 1e6:,.1f}M parameters, {flops.trainable / 1e6:,.2f}M trained"
        )
    for source in dict.fromkeys(s for r in result.runs for s in r.sources):
        lines.append(f"  from: {source}")
    for assumption in dict.fromkeys(a for r in result.runs for a in r.assumptions):
        lines.append(f"  assumed: {assumption}")
    unpriced = sorted({r.task for r in result.runs if r.work.evaluated == 0})
    if unpriced:
        lines.append(f"  evaluation not priced for task(s) {', '.join(unpriced)} (a small share of their work)")
    if any(r.work.estimated for r in result.runs):
        lines.append("  InfoBatch's subsets are sized by its losses: drawn here on random ones")
    scaled = sorted({r.work.scaled_from for r in result.runs if r.work.scaled_from})
    if scaled:
        lines.append(f"  trained/scored: the selection run on {scaled[0]:,} samples, scaled to the training set")
    return "\n".join(lines)


def _measured(m) -> str:
    """One measurement's line: the model's steps (compute-bound), the loader, the rates priced."""
    loader = (
        "its data is not here: no loader measured"
        if m.loader_samples_per_s is None
        else f"its loader {m.loader_samples_per_s:,.1f} samples/s ({m.loader_workers} loader process(es))"
    )
    return (
        f"  measured on {m.device} ({m.threads} thread(s)), batch {m.batch_size}: {m.train_samples_per_s:,.1f} "
        f"samples/s training, {m.score_samples_per_s:,.1f} scoring (compute-bound); {loader}; priced at "
        + " and ".join(f"{rate:,.1f}" for rate in m.rates())
    )


def _hours(hours: float) -> str:
    """Hours with one decimal, or seconds where that would read 0.0."""
    return f"{hours:,.1f}" if hours >= 0.1 or hours == 0 else f"{hours * 3600:,.1f}s"


def _short(count: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return str(count)
