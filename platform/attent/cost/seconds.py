"""Device-seconds of a run's work on the priced accelerator: training steps and scoring
forwards at a FLOP rate (its workload's MFU on the A100 carried by measured throughput, a stated
MFU, or the rates measured on this machine's GPU carried the same way), evaluation forwards at
the scoring rate, greedy decoding at the memory bandwidth; or, measured on a CPU, that CPU's
own seconds."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attent.cost import rates
from attent.cost.accelerators import ACCELERATORS, REFERENCE, Accelerator, accelerator_named
from attent.cost.decoding import decoding_seconds
from attent.cost.flops import SampleFlops, Throughput
from attent.cost.work import Work
from attent.experiment.schema import ExperimentConfig
from attent.tasks.task import Probe


@dataclass(frozen=True)
class Seconds:
    method: float  # training, scoring and selection, on all the run's devices
    evaluation: float
    utilisation: float | None  # the training steps' MFU on the priced accelerator (None: a CPU's seconds)
    sources: tuple[str, ...]  # where the rates come from, in words


def device_seconds(
    cfg: ExperimentConfig,
    work: Work,
    flops: SampleFlops,
    probe: Probe | None,
    tokens: float | None,
    accelerator: Accelerator,
    *,
    mfu: float | None = None,
    throughput: Throughput | None = None,
    local: torch.device | None = None,
) -> Seconds:
    """The run's device-seconds on ``accelerator`` (see the module); ``tokens``: a language
    model's tokens a sample, the width its decoded tokens are a share of on a CPU."""
    if throughput is not None and (local is None or local.type != "cuda"):
        return _cpu_seconds(cfg, work, probe, tokens, throughput)
    train_rate, score_rate, sources = _flop_rates(cfg, flops, probe, accelerator, mfu, throughput, local)
    method = work.trained * flops.train / train_rate + work.scored * flops.score / score_rate
    evaluation = work.evaluated * flops.score / score_rate
    decoding = probe.decoding if probe else None
    if decoding is not None:
        prompt = (tokens or getattr(cfg.task, "max_length", 0)) / 2  # the probe's half-prompt sample
        evaluations = len(cfg.train.evaluation_epochs())
        workers = max(1, cfg.ray.max_workers)
        evaluation += evaluations * decoding_seconds(decoding, flops.parameters, prompt, workers, accelerator.bandwidth)
        sources += (
            f"decoding: {decoding.answers:,} answers of up to {decoding.new_tokens} tokens in batches of "
            f"{decoding.batch} an evaluation, each step reading the weights and KV cache at "
            f"{accelerator.bandwidth / 1e12:.2f} TB/s ({accelerator.name}'s datasheet)",
        )
    utilisation = train_rate / accelerator.peak(cfg.train.precision, cfg.train.tf32)
    return Seconds(method, evaluation, utilisation, sources)


def _flop_rates(
    cfg: ExperimentConfig,
    flops: SampleFlops,
    probe: Probe | None,
    accelerator: Accelerator,
    mfu: float | None,
    throughput: Throughput | None,
    local: torch.device | None,
) -> tuple[float, float, tuple[str, ...]]:
    """(training, scoring) FLOP/s on ``accelerator`` and where they come from."""
    precision, tf32 = cfg.train.precision, cfg.train.tf32
    scoring = cfg.train.scoring_precision or precision
    if throughput is None and mfu is not None:
        return mfu * accelerator.peak(precision, tf32), mfu * accelerator.peak(scoring, tf32), ("MFU: stated",)
    workload = probe.workload if probe else "other"
    key = next(k for k, a in ACCELERATORS.items() if a is accelerator)
    speed = rates.speed(key, workload, precision, tf32)
    sources = () if key == REFERENCE else (f"{accelerator.name} against the A100: x{speed.describe()}",)
    if throughput is None:  # the table's MFU on the A100, carried by the measured speed
        figure, reference = rates.utilisation(workload), ACCELERATORS[REFERENCE]
        scale = figure.value * speed.value
        sources = (f"MFU ({workload}) on the A100: {figure.describe()}", *sources)
        return scale * reference.peak(precision, tf32), scale * reference.peak(scoring, tf32), sources
    props = torch.cuda.get_device_properties(local)
    here = accelerator_named(props.name, props.total_memory)
    if here is None:
        raise ValueError(f"--measure: {props.name} is not in the accelerator table; give --mfu instead")
    carried = speed.value / rates.speed(here, workload, precision, tf32).value
    train, score = throughput.rates()
    sources = (f"measured on {props.name}: {train:,.1f} samples/s training, {score:,.1f} scoring", *sources)
    return flops.train * train * carried, flops.score * score * carried, sources


def _cpu_seconds(
    cfg: ExperimentConfig, work: Work, probe: Probe | None, tokens: float | None, throughput: Throughput
) -> Seconds:
    """This CPU's own seconds at the measured rates (steps and loader together, ``Throughput.rates``);
    a decoded token costs its share of a scoring forward (one token of the sample's width)."""
    train, score = throughput.rates()
    evaluated = work.evaluated
    decoding = probe.decoding if probe else None
    if decoding is not None:
        width = tokens or getattr(cfg.task, "max_length", 1)
        evaluated += len(cfg.train.evaluation_epochs()) * decoding.answers * decoding.new_tokens / width
    loader = throughput.loader_samples_per_s
    feeds = "its data is not here: the loader not measured" if loader is None else f"the loader {loader:,.0f}"
    source = (
        f"measured here on {throughput.threads} thread(s): steps {throughput.train_samples_per_s:,.0f} samples/s "
        f"training, {throughput.score_samples_per_s:,.0f} scoring; {feeds}; together {train:,.0f} and {score:,.0f}"
    )
    return Seconds(work.trained / train + work.scored / score, evaluated / score, None, (source,))
