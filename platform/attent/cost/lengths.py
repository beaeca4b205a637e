"""Tokens per sample of a language-model run. The loader pads each batch to its longest sequence
(``collate_right_padded``), so a sample costs the expected longest of a batch of lengths drawn
at random: from the training set's own tokenized lengths where its data is here, else from a
stated length per named data set (``STATED``), each with where it comes from."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from attent.tasks.task import Probe


@dataclass(frozen=True)
class Lengths:
    """Sample lengths in tokens, as the loader sees them (truncated to ``max_length``)."""

    values: tuple[int, ...]  # tokenized lengths of (a draw of) the examples, or a stated law's quantiles
    source: str  # where they come from, in words
    measured: bool  # tokenized here; else stated

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    def padded(self, batch: int) -> float:
        """The expected longest of ``batch`` lengths drawn at random with replacement: the width
        a batch is padded to. With lengths sorted, the i-th of n is the longest with probability
        (i/n)^B - ((i-1)/n)^B."""
        ordered, n = sorted(self.values), len(self.values)
        return sum(v * ((i / n) ** batch - ((i - 1) / n) ** batch) for i, v in enumerate(ordered, 1))


@dataclass(frozen=True)
class Stated:
    """A named data set's length law where its data is not here: log-normal, of this mean. Every
    one an estimate for a run's own tokenizer and template."""

    mean: float  # tokens a sample, Alpaca prompt template included, Llama-2's tokenizer
    log_sd: float  # standard deviation of the lengths' logarithm
    source: str


_HERE = "tokenized here by SmolLM2-135M's tokenizer, which splits digits as Llama-2's does"
STATED: dict[str, Stated] = {
    "gsm8k": Stated(183, 0.29, f"GSM8K's 7,473 training examples {_HERE}"),
    "mbpp": Stated(234, 0.32, f"MBPP's 474 training tasks {_HERE}"),
    "metamathqa": Stated(
        250,
        0.4,
        "MetaMathQA-395K.json holds 396 MB in 395,000 rows: about 700 characters of query and response a row "
        "after its original question and keys, at GSM8K's 3.3 characters a token here, and the template's ~45",
    ),
    "codefeedback": Stated(500, 0.5, "about twice MBPP's: explained code rather than one function; not measured"),
    "wizardlm": Stated(450, 0.6, "open-ended instructions with long answers; not measured"),
    "wizardlm_evol_instruct_196k": Stated(
        700, 0.7, "evolved conversations, every exchange (most have one, the ShareGPT part several); not measured"
    ),
}
_QUANTILES = 400  # of a stated law: enough for the expected longest of a few hundred


def stated_lengths(dataset: str, max_length: int) -> Lengths | None:
    """The stated law's lengths (its quantiles, truncated at ``max_length``), None if unstated."""
    law = STATED.get(dataset)
    if law is None:
        return None
    mu = math.log(law.mean) - law.log_sd**2 / 2  # a log-normal of mean ``law.mean``
    normal = NormalDist(mu, law.log_sd)
    values = tuple(min(max_length, round(math.exp(normal.inv_cdf((i + 0.5) / _QUANTILES)))) for i in range(_QUANTILES))
    return Lengths(values, f"stated estimate, mean {law.mean:g} tokens: {law.source}", measured=False)


def run_lengths(probe: Probe, dataset: str, max_length: int) -> Lengths:
    """A language model's sample lengths: its probe's, tokenized from the data here, else the
    data set's stated law, else every sample at ``max_length`` (an upper bound)."""
    here = probe.lengths() if probe.lengths is not None else None
    if here is not None:
        return Lengths(here[0], here[1], measured=True)
    stated = stated_lengths(dataset, max_length)
    if stated is not None:
        return stated
    return Lengths((max_length,), "max_length: its data is not here and no length is stated", measured=False)
