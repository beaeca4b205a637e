"""Typed, validated selection settings: the `selection:` section of an experiment YAML."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from .deprecation import RENAMED_KEYS, deprecated_arguments, moved_names, renamed_keys, warn_renamed
from .schedules import (
    CycleSchedule,
    IntervalSchedule,
    PlannedEpoch,
    RatioSchedule,
    cycle_plan,
    epochs_before_annealing,
    training_progress,
)

# The values of ``selection.method``: who picks the samples. Each is a class of ``methods.METHODS``.
METHOD_NAMES = ("attent", "full", "class_weight", "group_weight", "gradnorm", "infobatch")
# Random is AtteNT's third strategy (``strategy="random"``), as the paper names Hard, Soft and
# Random. ``method="random"``, which asked for the same uniform subsets at the same schedules,
# is a deprecated alias of it; runs recorded under it keep their tags.
DEPRECATED_METHODS = {"random": {"method": "attent", "strategy": "random"}}
__getattr__ = moved_names(__name__, {"METHODS": "attent.selection.config.METHOD_NAMES"})
_EPOCHS_RENAMED = deprecated_arguments(positional=2, renamed={"total_epochs": "epochs"})

# The two variants of the paper. A preset fills every field the user did not set.
PRESETS: dict[str, dict[str, Any]] = {
    # All data in epoch 1, scores from that epoch's own forwards; then the 70% highest-loss
    # samples each epoch by the latest losses (no extra scoring pass).
    "llm": dict(
        method="attent",
        strategy="hard",
        ratio=dict(kind="fixed", start=0.7),
        interval=dict(kind="fixed", start=1),
        warmup_epochs=1,
        rescore=False,
    ),
    # Initial scoring pass, re-scoring at each (growing) interval, ratio 20%->80%, soft selection.
    # Soft draws from standardized losses at T = 4 (hardness about 0.12): the paper gives neither
    # T nor a scale; of T = 0.25, 1, 4 measured on Fashion-MNIST the softest did best (README).
    # No warm-up (warmup_epochs left unset: 0, or the released code's 1 with interval kind cycles).
    "vit": dict(
        method="attent",
        strategy="soft",
        soft_logits="standardized",
        temperature=4.0,
        ratio=dict(kind="incremental", start=0.2, end=0.8),
        interval=dict(kind="incremental", start=1, end=4),
        rescore=True,
    ),
}


def deep_merge(base: dict[str, Any], update: dict[str, Any], *, _path: tuple[str, ...] = ()) -> dict[str, Any]:
    """``update`` over ``base``, section by section: a preset's ``ratio: {kind, start, end}``
    keeps ``kind`` and ``start`` when the user sets only ``ratio.end``. Anything but a mapping
    (a value, a list, a config object) replaces what it lands on. A renamed key
    (``deprecation.RENAMED_KEYS``) is read under its new name in both before they merge."""
    renamed = RENAMED_KEYS.get(_path)
    if renamed:
        base, update = (_new_spellings(mapping, renamed, _path) for mapping in (base, update))
    merged = dict(base)
    for key, value in update.items():
        inner = merged.get(key)
        merged[key] = (
            deep_merge(inner, value, _path=(*_path, key))
            if isinstance(value, dict) and isinstance(inner, dict)
            else value
        )
    return merged


def _new_spellings(data: dict[str, Any], renamed: dict[str, str], path: tuple[str, ...]) -> dict[str, Any]:
    """Each old key under its new name, with its warning; a mapping that holds both spellings is
    left for the section's validation to refuse."""
    for old, new in renamed.items():
        if old in data and new not in data:
            data = renamed_keys(data, {old: new}, ".".join(path), stacklevel=5)
    return data


class RatioConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["fixed", "incremental", "cosine"] = "fixed"
    start: float | None = Field(
        None, description="r0; for fixed, the ratio itself (default 1.0, i.e. all data); incremental/cosine default 0.2"
    )
    end: float | None = Field(None, description="r1 (incremental/cosine); defaults to 0.8")

    @field_validator("start", "end")
    @classmethod
    def _in_unit_interval(cls, v):
        if v is not None and not 0.0 < v <= 1.0:
            raise ValueError(f"a selection ratio must lie in (0, 1], got {v}")
        return v

    @model_validator(mode="after")
    def _defaults(self) -> RatioConfig:
        # The paper's schedules run 20% -> 80%; a bare `kind: incremental` must not mean 100% -> 80%.
        if self.start is None:
            self.start = 1.0 if self.kind == "fixed" else 0.2
        # A fixed schedule has one ratio: `end` is normalised to it (a preset's 0.8 must not linger).
        self.end = self.start if self.kind == "fixed" else (0.8 if self.end is None else self.end)
        return self

    def build(self) -> RatioSchedule:
        return RatioSchedule(self.kind, self.start, self.end)


class IntervalConfig(BaseModel):
    """Two readings of the paper's "interval". ``fixed`` and ``incremental``: the epochs a pick is
    kept before the next one, a function of training progress (the paper's text: "how often the
    subset is re-sampled"). ``cycles``: the authors' released code's: a warm-up epoch on all data,
    then ``cycles`` cycles, each opening with ``start`` -> ``end`` epochs on a subset and ending on
    all data, the ratio stepping once per cycle (``schedules.CycleSchedule``)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["fixed", "incremental", "cycles"] = "fixed"
    start: int = Field(
        1,
        ge=1,
        description="I0 in epochs; for fixed, the interval itself; for cycles, the subset epochs of the first cycle",
    )
    end: int | None = Field(
        None, ge=1, description="Imax (incremental); for cycles, the subset epochs of the last cycle; defaults to start"
    )
    cycles: int | None = Field(
        None,
        ge=1,
        description="cycles: their number K after the warm-up (the released code: 10); other kinds ignore it",
    )
    redraw: bool | None = Field(
        None,
        description="cycles: re-select at every subset epoch (true) or keep "
        "the cycle's first pick (false); unset: as the released "
        "code, true for Soft only",
    )

    @model_validator(mode="after")
    def _default_end(self) -> IntervalConfig:
        if self.kind == "fixed" or self.end is None:
            self.end = self.start
        if self.kind != "cycles":  # a cycles section's leftovers (e.g. an override of its kind) must not linger
            self.cycles = self.redraw = None
        elif self.cycles is None:
            raise ValueError(
                "interval kind cycles needs interval.cycles, the number of cycles after the "
                "warm-up (the released code's: 10)"
            )
        return self

    @model_serializer(mode="wrap")
    def _without_unused(self, handler) -> dict[str, Any]:
        """The cycles' settings only in a cycles section: the other kinds' params (and run
        identities) stay what they were before cycles existed."""
        data = handler(self)
        if self.kind != "cycles" and isinstance(data, dict):
            data.pop("cycles", None)
            data.pop("redraw", None)
        return data

    def build(self) -> IntervalSchedule | CycleSchedule:
        if self.kind == "cycles":
            return CycleSchedule(self.cycles, self.start, self.end, bool(self.redraw))
        return IntervalSchedule(self.kind, self.start, self.end)


class SelectionConfig(BaseModel):
    """Who picks the training samples, how many, and how often."""

    model_config = ConfigDict(extra="forbid")

    preset: Literal["llm", "vit"] | None = None  # paper variant filling unset fields
    method: Literal[METHOD_NAMES] = "attent"  # attent, or a baseline behind the same interface
    strategy: Literal["hard", "soft", "random"] = "hard"  # attent: Hard (top-k), Soft (Gumbel-top-k), Random (uniform)
    ratio: RatioConfig = RatioConfig()  # fraction of the data selected, vs progress
    interval: IntervalConfig = IntervalConfig()  # epochs a selection is kept, vs progress; or cycles
    temperature: float = Field(1.0, gt=0, allow_inf_nan=False)  # soft: softmax(logits / T); T->0 hard, T->inf random
    soft_logits: Literal["raw", "standardized", "log"] = "raw"  # soft: logits = loss | z-scored loss | log loss
    # epochs on all data before the first selection; unset: 0, or 1 with interval kind cycles (the released code's)
    warmup_epochs: int | None = Field(None, ge=0)
    rescore: bool = False  # full scoring pass before each re-selection
    # where a re-selection's scores come from: "latest", each sample's latest loss (a training
    # forward or a pass); "training" (beyond the paper, free), the training forwards of the
    # full-data epochs before it (a cycle's, the warm-up), a pass only for samples with none
    scores: Literal["latest", "training"] = "latest"
    rescore_stale: bool = False  # beyond the paper: re-score only samples not trained on this interval
    rescore_fraction: float = Field(
        1.0, gt=0, le=1
    )  # beyond the paper: share of the samples due a score that a pass re-scores
    reweight: bool = False  # beyond the paper: loss weights k/(N pi_i), an unbiased gradient (soft, random)
    anneal: float = Field(0.0, ge=0, lt=1)  # beyond the paper: final share of the epochs on all data
    stratify: bool = False  # beyond the paper: pick within each class, its share of the budget
    group_weights: list[float] | None = None  # group_weight: weight per group (e.g. 1:2:2)
    gradnorm_alpha: float = Field(1.5, ge=0, allow_inf_nan=False)  # gradnorm: strength of the rate balancing
    gradnorm_step: float = Field(0.5, gt=0, le=1)  # gradnorm: how far weights move per update
    infobatch_prune: float = Field(0.5, ge=0, lt=1)  # infobatch: fraction of below-mean samples dropped
    infobatch_final: float = Field(0.125, ge=0, le=1)  # infobatch: final fraction of epochs on all data

    @model_validator(mode="before")
    @classmethod
    def _deprecated_method(cls, data: Any) -> Any:
        """``method="random"`` -> ``strategy="random"`` (method attent), with a FutureWarning.
        The subsets are the kept spelling's: its random stream is seeded by (seed, attent, random)."""
        if isinstance(data, dict) and data.get("method") in DEPRECATED_METHODS:
            warn_renamed(
                f"selection method {data['method']!r} (selection.method: {data['method']})",
                "selection.strategy: random (SelectionConfig(strategy='random')), AtteNT's Random "
                "strategy: the same uniform subsets at the same ratio and interval schedules",
                stacklevel=4,
            )
            data = {**data, **DEPRECATED_METHODS[data["method"]]}
        return data

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            if data["preset"] not in PRESETS:
                raise ValueError(f"unknown selection preset {data['preset']!r}; choose {', '.join(PRESETS)}")
            preset = PRESETS[data["preset"]]
            interval = data.get("interval")
            if isinstance(interval, dict) and interval.get("kind") == "cycles":
                # the preset's interval is the progress reading's: its end must not become the
                # cycles' (`{kind: cycles, cycles: 10, start: 5}` is 5 subset epochs every cycle)
                preset = {key: value for key, value in preset.items() if key != "interval"}
            data = deep_merge(preset, data)
        return data

    @model_validator(mode="after")
    def _cycles(self) -> SelectionConfig:
        """The cycles reading's defaults, as the released code runs it: one warm-up epoch; Soft
        re-draws at every subset epoch, Hard and Random keep the cycle's pick."""
        cycles = self.interval.kind == "cycles"
        if self.warmup_epochs is None:
            self.warmup_epochs = 1 if cycles else 0
        if cycles and self.interval.redraw is None:  # a copy: the section may be shared with other configs
            soft = self.method == "attent" and self.strategy == "soft"
            self.interval = self.interval.model_copy(update={"redraw": soft})
        if self.scores == "training" and not cycles:
            raise ValueError(
                "selection.scores: training takes a re-selection's scores from the full-data epochs before it, "
                "which only interval kind cycles has; for each sample's latest training loss keep scores: latest "
                "with rescore: false (the llm preset's)"
            )
        if cycles and self.anneal:
            raise ValueError(
                "selection.anneal does not combine with interval kind cycles: each cycle ends on all data already"
            )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> SelectionConfig:
        if self.method == "group_weight" and not self.group_weights:
            raise ValueError("method group_weight needs group_weights, e.g. [1, 2, 2]")
        if self.group_weights is not None and (
            not self.group_weights or min(self.group_weights) < 0 or sum(self.group_weights) <= 0
        ):
            raise ValueError("group_weights must be non-negative with a positive sum")
        if self.reweight and self.method == "attent" and self.strategy == "hard":
            raise ValueError(
                "selection.reweight needs a sample drawn at random (strategy soft or random): "
                "hard top-k never picks some samples, so no weight makes its gradient unbiased"
            )
        if (self.reweight or self.stratify) and self.method != "attent":
            raise ValueError(
                f"selection.reweight and selection.stratify apply to method attent (any strategy), not {self.method}"
            )
        return self

    @_EPOCHS_RENAMED
    def selecting_epochs(self, epochs: int) -> int:
        """Epochs in which the schedules pick subsets: all but the last ``anneal`` share, which train
        on all data (the first floor((1 - anneal) E), as InfoBatch's annealing counts)."""
        return epochs_before_annealing(epochs, self.anneal) if self.anneal else epochs

    @property
    def ratio_schedule(self) -> RatioSchedule:
        return self.ratio.build()

    @property
    def interval_schedule(self) -> IntervalSchedule | CycleSchedule:
        return self.interval.build()

    @property
    def uses_cycles(self) -> bool:
        """The released code's reading of "interval" (``interval.kind: cycles``) decides the subsets."""
        return self.interval.kind == "cycles" and self.uses_ratio_schedule

    @property
    def uses_ratio_schedule(self) -> bool:
        """Whether the ratio and interval schedules decide the subsets (not full, not InfoBatch)."""
        return self.method not in ("full", "infobatch")

    @_EPOCHS_RENAMED
    def planned_ratios(self, epochs: int) -> list[tuple[int, float]]:
        """(epoch, ratio) of every re-selection a run of ``epochs`` makes, exactly as the
        Teacher will (same progress definition, same interval rounding; with interval kind
        cycles, each cycle's first subset epoch, or each of them with ``redraw``). The epochs
        that train on all data between picks (warm-up, annealing, a cycle's full epochs) are not
        re-selections: ``epoch_plan`` lists every epoch."""
        if not self.uses_ratio_schedule:
            return []
        if self.uses_cycles:
            return [(p.epoch, p.ratio) for p in self.epoch_plan(epochs) if p.selects]
        plan, epoch = [], self.warmup_epochs
        while epoch < self.selecting_epochs(epochs):
            progress = training_progress(epoch, epochs)
            plan.append((epoch, self.ratio_schedule(progress)))
            epoch += self.interval_schedule(progress)
        return plan

    def epoch_plan(self, epochs: int) -> list[PlannedEpoch]:
        """Every epoch of a run of ``epochs``: the share of the data it trains on (1.0: all) and
        whether a re-selection opens it, as the Teacher will. Either reading of "interval": the
        progress schedules' (a pick kept until the next; all data in warm-up and annealing), or
        the released code's cycles (``schedules.cycle_plan``, which refuses an impossible plan)."""
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        if self.uses_cycles:
            return cycle_plan(epochs, self.warmup_epochs, self.interval_schedule, self.ratio_schedule)
        picks, ratio = dict(self.planned_ratios(epochs)), 1.0
        end, plan = self.selecting_epochs(epochs), []
        for epoch in range(epochs):
            ratio = picks.get(epoch, ratio)
            plan.append(PlannedEpoch(epoch, ratio if epoch < end else 1.0, epoch in picks))
        return plan

    @_EPOCHS_RENAMED
    def mean_planned_ratio(self, epochs: int) -> float:
        """The mean over epochs of the share of the data the schedules select (1 in epochs on all
        data and without a ratio schedule): the budget a run plans to spend, and 1 minus its
        ideal sample saving."""
        return sum(p.ratio for p in self.epoch_plan(epochs)) / epochs

    @_EPOCHS_RENAMED
    def ratio_reached(self, epochs: int) -> float:
        """The largest ratio a run selects (1.0 when it trains on all data at some epoch)."""
        return max(p.ratio for p in self.epoch_plan(epochs))

    @_EPOCHS_RENAMED
    def label(self, epochs: int | None = None) -> str:
        """Human-readable row label for tables, e.g. 'Soft · incremental(0.2→0.8) · incremental(1→4)'.
        Given the run's epochs, a schedule whose end is never selected says what is reached:
        'incremental(0.2→0.8, reached 0.56)'. The cycles reading, whose ratio steps per cycle and
        reaches its end: 'Soft · incremental(0.2→0.8) per cycle · cycles(4 × 1→4 subset epochs, re-drawn)'."""
        if self.method == "full":
            return "Full data"
        if self.method == "infobatch":
            return f"InfoBatch (prune {self.infobatch_prune:g})"
        head = self.strategy.capitalize() if self.method == "attent" else self.method.replace("_", " ").title()
        ratio = self.ratio_schedule.describe()
        plan = self.planned_ratios(epochs) if epochs is not None and not self.uses_cycles else []
        if self.uses_cycles and self.ratio.kind != "fixed":
            ratio += " per cycle"
        if plan and self.ratio.kind != "fixed":
            reached = max(r for _, r in plan)
            if abs(reached - self.ratio.end) > 5e-3:
                ratio = f"{ratio[:-1]}, reached {reached:.2g})"
        beyond = [
            text
            for on, text in (
                (self.scores == "training" and self.strategy != "random", "free scores"),  # Random reads none
                (self.rescore_stale, "stale-only scoring"),
                (self.rescore_fraction < 1, f"scoring {self.rescore_fraction:.0%}"),
                (self.reweight, "reweighted"),
                (self.stratify, "per class"),
                (self.anneal, f"anneal {self.anneal:.1%}"),
            )
            if on
        ]
        return " · ".join([head, ratio, self.interval_schedule.describe(), *beyond])
