"""``attent plan``'s estimate: every run of an experiment or sweep file (downstream jobs
included), its work and FLOPs, and the device time and money they take on a named accelerator:
at each workload's measured utilisation on the A100 carried by measured throughput to the
accelerator (``attent.cost.rates``), at a stated MFU, or at the rates measured here (``--measure``:
the model's steps and the task's own loader). Evaluation's greedy decoding is priced by the
memory it reads (``attent.cost.decoding``)."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from attent.cost.accelerators import ACCELERATORS, Accelerator
from attent.cost.flops import SampleFlops, Throughput, count_flops, measure
from attent.cost.lengths import Lengths, run_lengths
from attent.cost.options import Options
from attent.cost.pipeline import measure_loader
from attent.cost.samples import flops_key, train_samples
from attent.cost.seconds import device_seconds
from attent.cost.work import Work, planned_work
from attent.experiment.schema import ExperimentConfig
from attent.selection.scoring_pass import SCORING_BATCH_FACTOR
from attent.tasks.registry import task_class
from attent.tasks.task import Probe

CPU = "this machine's cpu"


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
    utilisation: float | None  # the MFU on the priced accelerator (None: measured on a CPU, no peak)
    cost: float | None
    assumptions: tuple[str, ...] = ()
    tokens: float | None = None  # a language model's tokens a sample: its batches' padded width
    sources: tuple[str, ...] = ()  # where the utilisation, the accelerator's speed and the tokens come from

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
    accelerator: str  # the table's key, or CPU for a CPU measurement
    source: str
    utilisation: str  # how the MFU was had: per workload, stated or measured
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


@dataclass
class _Pricing:
    """What every run of one estimate shares: the options, the accelerator, the device measured
    on (None: nothing measured), and what was counted or measured once for runs alike."""

    options: Options
    accelerator: Accelerator
    local: torch.device | None
    result: Estimate
    counted: dict[str, SampleFlops] = field(default_factory=dict)
    measured: dict[str, Throughput] = field(default_factory=dict)
    lengths: dict[str, Lengths] = field(default_factory=dict)


def estimate(file: str | Path, configs: list[ExperimentConfig], options: Options) -> Estimate:
    """The estimate of ``configs`` (a file's runs, downstream jobs after their run)."""
    if options.gpu not in ACCELERATORS:
        raise ValueError(f"--gpu {options.gpu!r} is not in the table; choose one of {', '.join(ACCELERATORS)}")
    accelerator = ACCELERATORS[options.gpu]
    local = _local_device() if options.measure else None
    on_cpu = local is not None and local.type != "cuda"
    if local is not None:
        how = f"measured on {local}: the model's steps and, where its data is here, its own loader"
    elif options.mfu is not None:
        how = f"stated: MFU {options.mfu:g}"
    else:
        how = "per workload: its measured MFU on the A100, carried by measured throughput"
    result = Estimate(
        str(file), CPU if on_cpu else options.gpu, "measured" if on_cpu else accelerator.source, how,
        options.price_per_gpu_hour,
    )  # fmt: skip
    pricing = _Pricing(options, accelerator, local, result)
    for run in (run for cfg in configs for run in (cfg, *_downstream_runs(cfg))):
        result.runs.append(_price_run(run, pricing))
    return result


def _price_run(cfg: ExperimentConfig, pricing: _Pricing) -> RunEstimate:
    probe, flops, tokens, lengths = _probe_and_flops(cfg, pricing)
    samples = train_samples(cfg, probe, pricing.options.samples)
    work = planned_work(
        cfg, samples, eval_samples=probe.eval_samples if probe else 0, eval_forwards=probe.eval_forwards if probe else 1
    )
    throughput = _throughput(cfg, probe, pricing) if pricing.local is not None and probe is not None else None
    seconds = device_seconds(
        cfg, work, flops, probe, tokens, pricing.accelerator,
        mfu=pricing.options.mfu, throughput=throughput, local=pricing.local,
    )  # fmt: skip
    hours, price = (seconds.method + seconds.evaluation) / 3600, pricing.options.price_per_gpu_hour
    return RunEstimate(
        run=cfg.name,
        task=cfg.task.name,
        sample=probe.sample if probe else "given --flops-per-sample",
        workers=max(1, cfg.ray.max_workers),
        epochs=cfg.train.epochs,
        precision=cfg.train.precision,
        work=work,
        flops=flops,
        method_gpu_hours=seconds.method / 3600,
        eval_gpu_hours=seconds.evaluation / 3600,
        utilisation=seconds.utilisation,
        cost=None if price is None else hours * price,
        assumptions=probe.assumptions if probe else (),
        tokens=tokens,
        sources=(*lengths, *seconds.sources),
    )


def _downstream_runs(cfg: ExperimentConfig) -> list[ExperimentConfig]:
    return [cfg.downstream_experiment(job, pretrained=None) for job in cfg.downstream]


def _probe_and_flops(
    cfg: ExperimentConfig, pricing: _Pricing
) -> tuple[Probe | None, SampleFlops, float | None, tuple[str, ...]]:
    """The run's probe (a language model's at the width its batches are padded to), its counted
    FLOPs, that width (None: not a language model) and where its lengths come from."""
    try:
        probe = task_class(cfg.task.name).probe(cfg.task)
    except NotImplementedError as exc:
        given = pricing.options.flops_per_sample
        if given is None:
            raise ValueError(str(exc)) from None
        return None, SampleFlops(given, given / 3, 0, 0), None, ()
    tokens, sources = None, ()
    if probe.lengths is not None and probe.resized is not None:
        data = cfg.task.model_dump_json(exclude={"eval"})
        if data not in pricing.lengths:  # the data tokenized once for runs alike
            pricing.lengths[data] = run_lengths(probe, getattr(cfg.task, "dataset", ""), cfg.task.max_length)
        lengths, batch = pricing.lengths[data], cfg.train.batch_size
        tokens = lengths.padded(batch)
        shown = f"{tokens:,.0f} tokens (the longest of {batch} drawn; of max {cfg.task.max_length:,})"
        probe = replace(probe.resized(max(1, round(tokens))), sample=shown)
        sources = (f"tokens a sample: {lengths.source}",)
    key = flops_key(cfg, probe)
    if key not in pricing.counted:
        pricing.counted[key] = count_flops(probe)
    return probe, pricing.counted[key], tokens, sources


def _local_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _throughput(cfg: ExperimentConfig, probe: Probe, pricing: _Pricing) -> Throughput:
    """The run's model steps and loader measured here (once for runs alike), on a CPU with the
    threads a worker of the run gets (``ray.cpus_per_worker``, as Ray and local mode give it)."""
    local = pricing.local
    threads = max(1, int(cfg.ray.cpus_per_worker)) if local.type == "cpu" else torch.get_num_threads()
    score_batch = cfg.train.scoring_batch_size or SCORING_BATCH_FACTOR.get(local.type, 2) * cfg.train.batch_size
    key = "|".join(
        (flops_key(cfg, probe), cfg.task.model_dump_json(exclude={"eval"}), str(cfg.train.batch_size), str(score_batch),
         cfg.train.precision, str(threads), str(cfg.train.grad_clip))
    )  # fmt: skip
    if key not in pricing.measured:
        with _threads(threads):
            steps = measure(
                probe, local, batch_size=cfg.train.batch_size, precision=cfg.train.precision,
                score_batch_size=score_batch, grad_clip=cfg.train.grad_clip,
            )  # fmt: skip
            loader = measure_loader(cfg, local.type)
        if loader is not None:
            steps = replace(steps, loader_samples_per_s=loader[0], loader_workers=loader[1])
        pricing.measured[key] = steps
        pricing.result.measurements.append(steps)
    return pricing.measured[key]


@contextlib.contextmanager
def _threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
