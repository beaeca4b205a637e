"""``attent plan``'s estimate: every run of an experiment or sweep file (downstream jobs
included), its work and FLOPs, and the device time and money they take on a named accelerator at
a stated or measured model FLOPs utilisation (MFU)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from attent.cost.accelerators import ACCELERATORS, Accelerator, accelerator_named
from attent.cost.flops import SampleFlops, Throughput, count_flops, measure
from attent.cost.options import Options
from attent.cost.work import Work, planned_work
from attent.experiment.schema import ExperimentConfig
from attent.tasks.registry import task_class
from attent.tasks.task import Probe

_SIZE_FIELDS = {"train_limit", "val_limit", "test_limit", "split_seed", "expected_train_samples", "eval"}


@dataclass(frozen=True)
class RunEstimate:
    run: str
    task: str
    sample: str
    workers: int
    epochs: int
    precision: str
    work: Work
    flops: SampleFlops
    method_gpu_hours: float  # training and scoring, on all the run's devices together
    eval_gpu_hours: float
    utilisation: float | None  # the MFU the hours assume (None: measured on a CPU, no peak)
    cost: float | None
    assumptions: tuple[str, ...] = ()

    @property
    def method_flops(self) -> float:
        return self.work.trained * self.flops.train + self.work.scored * self.flops.score

    @property
    def flops_saving(self) -> float:
        """1 - the run's training and scoring FLOPs / those of training on all data."""
        return 1 - self.method_flops / (self.work.full * self.flops.train)

    @property
    def wall_clock_hours(self) -> float:
        return (self.method_gpu_hours + self.eval_gpu_hours) / self.workers


@dataclass
class Estimate:
    file: str
    accelerator: str  # the table's key, or "this machine's cpu" for a CPU measurement
    source: str
    utilisation: str  # how the MFU was had: stated or measured (with the throughput)
    price_per_gpu_hour: float | None
    runs: list[RunEstimate] = field(default_factory=list)
    measurements: list[Throughput] = field(default_factory=list)

    def totals(self) -> dict[str, float | None]:
        cost = [r.cost for r in self.runs]
        return {
            "runs": len(self.runs),
            "method_gpu_hours": sum(r.method_gpu_hours for r in self.runs),
            "eval_gpu_hours": sum(r.eval_gpu_hours for r in self.runs),
            "cost": None if None in cost else sum(cost),
        }

    def to_json(self) -> dict:
        def run(r: RunEstimate) -> dict:
            return {
                **asdict(r),
                "work": {**asdict(r.work), "limit": r.work.limit},
                "method_flops": r.method_flops,
                "flops_saving": r.flops_saving,
                "wall_clock_hours": r.wall_clock_hours,
            }

        return {
            "file": self.file,
            "accelerator": self.accelerator,
            "source": self.source,
            "utilisation": self.utilisation,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "runs": [run(r) for r in self.runs],
            "measurements": [asdict(m) for m in self.measurements],
            "totals": self.totals(),
        }


def estimate(file: str | Path, configs: list[ExperimentConfig], options: Options) -> Estimate:
    """The estimate of ``configs`` (a file's runs, downstream jobs after their run)."""
    if options.gpu not in ACCELERATORS:
        raise ValueError(f"--gpu {options.gpu!r} is not in the table; choose one of {', '.join(ACCELERATORS)}")
    runs = [run for cfg in configs for run in (cfg, *_downstream_runs(cfg))]
    accelerator = ACCELERATORS[options.gpu]
    counted: dict[str, SampleFlops] = {}
    measured: dict[str, Throughput] = {}
    local = _local_device() if options.measure else None
    result = Estimate(
        str(file),
        options.gpu if local is None or local.type == "cuda" else "this machine's cpu",
        accelerator.source if local is None or local.type == "cuda" else "measured",
        f"measured on {local}" if local is not None else f"stated: MFU {options.mfu:g}",
        options.price_per_gpu_hour,
    )
    for cfg in runs:
        probe, flops = _probe_and_flops(cfg, options, counted)
        samples = _train_samples(cfg, probe, options)
        work = planned_work(
            cfg,
            samples,
            eval_samples=probe.eval_samples if probe else 0,
            eval_forwards=probe.eval_forwards if probe else 1,
        )
        throughput = None
        if local is not None and probe is not None:
            key = f"{_flops_key(cfg, probe)}|{cfg.train.batch_size}|{cfg.train.precision}"
            if key not in measured:
                measured[key] = measure(probe, local, batch_size=cfg.train.batch_size, precision=cfg.train.precision)
                result.measurements.append(measured[key])
            throughput = measured[key]
        method_s, eval_s, utilisation = _device_seconds(cfg, work, flops, accelerator, options.mfu, throughput, local)
        hours = (method_s + eval_s) / 3600
        result.runs.append(
            RunEstimate(
                run=cfg.name,
                task=cfg.task.name,
                sample=probe.sample if probe else "given --flops-per-sample",
                workers=max(1, cfg.ray.max_workers),
                epochs=cfg.train.epochs,
                precision=cfg.train.precision,
                work=work,
                flops=flops,
                method_gpu_hours=method_s / 3600,
                eval_gpu_hours=eval_s / 3600,
                utilisation=utilisation,
                cost=None if options.price_per_gpu_hour is None else hours * options.price_per_gpu_hour,
                assumptions=probe.assumptions if probe else (),
            )
        )
    return result


def _downstream_runs(cfg: ExperimentConfig) -> list[ExperimentConfig]:
    return [cfg.downstream_experiment(job, pretrained=None) for job in cfg.downstream]


def _flops_key(cfg: ExperimentConfig, probe: Probe) -> str:
    return probe.key or f"{cfg.task.name}:{cfg.task.model_dump_json(exclude=_SIZE_FIELDS)}"


def _probe_and_flops(
    cfg: ExperimentConfig, options: Options, counted: dict[str, SampleFlops]
) -> tuple[Probe | None, SampleFlops]:
    try:
        probe = task_class(cfg.task.name).probe(cfg.task)
    except NotImplementedError as exc:
        if options.flops_per_sample is None:
            raise ValueError(str(exc)) from None
        return None, SampleFlops(options.flops_per_sample, options.flops_per_sample / 3, 0, 0)
    key = _flops_key(cfg, probe)
    if key not in counted:
        counted[key] = count_flops(probe)
    return probe, counted[key]


def _train_samples(cfg: ExperimentConfig, probe: Probe | None, options: Options) -> int:
    """The training set's size: ``--samples``, else ``task.expected_train_samples``, else the
    probe's (a named data set's published size), else the task built on its data here."""
    for known in (options.samples, cfg.task.expected_train_samples, probe.train_samples if probe else None):
        if known is not None:
            return known
    try:
        cfg.task.check_data()
    except (FileNotFoundError, ValueError):
        raise ValueError(
            f"run {cfg.name!r}: its training set is not on this machine and its size is unknown: set "
            "task.expected_train_samples (a downstream job's in its task: section), or give --samples"
        ) from None
    from attent.tasks.registry import build_task

    try:  # the data is here: the task reads it (Hugging Face offline: nothing fetched)
        return len(build_task(cfg.task, seed=cfg.seed).train_dataset())
    except OSError as exc:
        raise ValueError(
            f"run {cfg.name!r}: counting its training set needs what is not on this machine "
            f"({' '.join(str(exc).split())[:200]}): set task.expected_train_samples, or give --samples"
        ) from None


def _local_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _device_seconds(
    cfg: ExperimentConfig,
    work: Work,
    flops: SampleFlops,
    accelerator: Accelerator,
    mfu: float,
    throughput: Throughput | None,
    local: torch.device | None,
) -> tuple[float, float, float | None]:
    """(training and scoring, evaluation) device-seconds and the MFU they assume. Measured on a
    GPU, the utilisation of its steps carries over to ``accelerator``; measured on a CPU, the
    seconds are this machine's."""
    peak = accelerator.peak(cfg.train.precision, cfg.train.tf32)
    scoring_precision = cfg.train.scoring_precision or cfg.train.precision
    score_peak = accelerator.peak(scoring_precision, cfg.train.tf32)
    if throughput is None:
        train_u = score_u = mfu
    elif local is not None and local.type == "cuda":
        props = torch.cuda.get_device_properties(local)
        here = ACCELERATORS.get(accelerator_named(props.name, props.total_memory) or "")
        if here is None:
            raise ValueError(f"--measure: {props.name} is not in the accelerator table; give --mfu instead")
        train_u = flops.train * throughput.train_samples_per_s / here.peak(cfg.train.precision, cfg.train.tf32)
        score_u = flops.score * throughput.score_samples_per_s / here.peak(scoring_precision, cfg.train.tf32)
    else:  # a CPU: its own seconds
        method = work.trained / throughput.train_samples_per_s + work.scored / throughput.score_samples_per_s
        return method, work.evaluated / throughput.score_samples_per_s, None
    method = work.trained * flops.train / (train_u * peak) + work.scored * flops.score / (score_u * score_peak)
    return method, work.evaluated * flops.score / (score_u * score_peak), train_u
