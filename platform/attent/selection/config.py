"""Typed, validated selection settings: the `selection:` section of an experiment YAML."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from .schedules import CycleSchedule, IntervalSchedule, RatioSchedule

# The values of ``selection.method``: who picks the samples. Each is a class of ``methods.METHODS``.
# Random is AtteNT's third strategy (``strategy="random"``), as the paper names Hard, Soft and Random.
METHOD_NAMES = ("attent", "full", "class_weight", "group_weight", "gradnorm", "infobatch")
# The methods whose pick is a share ``ratio`` of the data and nothing else: without a ratio they
# would select every sample (the group baselines also weigh the loss, so all data is a use of them).
RATIO_ONLY_METHODS = ("attent", "class_weight")

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


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` over ``base``, section by section: a preset's ``ratio: {kind, start, end}``
    keeps ``kind`` and ``start`` when the user sets only ``ratio.end``. A mapping that lands on a
    list of named mappings (``downstream: [{name: semseg, ...}]``) updates the items it names, so
    ``downstream.semseg.train.epochs=50`` reaches one job. Anything else (a value, a list, a config
    object) replaces what it lands on.

    Raises:
        ValueError: a mapping names an item the list does not have.

    >>> deep_merge({"jobs": [{"name": "a", "n": 1}, {"name": "b", "n": 2}]}, {"jobs": {"b": {"n": 3}}})
    {'jobs': [{'name': 'a', 'n': 1}, {'name': 'b', 'n': 3}]}
    """
    merged = dict(base)
    for key, value in update.items():
        inner = merged.get(key)
        if isinstance(value, dict) and isinstance(inner, dict):
            merged[key] = deep_merge(inner, value)
        elif isinstance(value, dict) and _named_items(inner):
            names = [item["name"] for item in inner]
            if unknown := sorted(set(value) - set(names)):
                raise ValueError(f"{key}: no item named {', '.join(map(repr, unknown))} (it has {', '.join(names)})")
            merged[key] = [deep_merge(item, value.get(item["name"], {})) for item in inner]
        else:
            merged[key] = value
    return merged


def _named_items(value: Any) -> bool:
    """A non-empty list of mappings, each with a ``name``."""
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) and "name" in item for item in value)


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
    """Who picks the training samples, how many, and how often: an experiment's ``selection:``
    section, and what ``Selector``, ``build_plan`` and every integration take.

    Built from keywords (or a mapping: ``SelectionConfig(**section)``). A ``preset``, ``"llm"`` or
    ``"vit"`` (the paper's two variants), fills every field left unset, section by section. Each
    field, with its default and range, is described in the configuration reference's
    ``selection`` section.

    Raises:
        pydantic.ValidationError: an unknown field or preset, a value out of its range, or
            settings that do not combine, each in one line naming the fix: AtteNT or class
            weights without a ratio, ``reweight`` with Hard's top-k, ``scores: training`` or
            ``anneal`` with an interval kind they do not fit.

    Examples:
        >>> config = SelectionConfig(preset="vit")
        >>> config.strategy, config.temperature, (config.ratio.start, config.ratio.end)
        ('soft', 4.0, (0.2, 0.8))
        >>> SelectionConfig(preset="llm", ratio={"start": 0.5}).ratio.start  # a field set beats the preset's
        0.5
    """

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
    # a NaN or inf loss, checked at the optimiser step that would use it: "raise" stops the run
    # naming the samples and the step; "skip" skips that step, the samples keeping their scores
    nonfinite: Literal["raise", "skip"] = "raise"

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
        if self.method in RATIO_ONLY_METHODS and "ratio" not in self.model_fields_set:
            raise ValueError(
                f"selection method {self.method} without a ratio would select every sample (the default "
                "ratio is 1.0): set a ratio (e.g. ratio: {kind: fixed, start: 0.5}), a preset (llm or vit), "
                "or method: full (a ratio of 1.0 set explicitly is the paper's 100 % row)"
            )
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
    def selects(self) -> bool:
        """Whether the method ever re-selects (full data never does)."""
        return self.method != "full"

    @property
    def reads_scores(self) -> bool:
        """Whether a pick reads the samples' losses, so that a scoring pass is planned before it:
        AtteNT's Hard and Soft and GradNorm's group losses; not Random, the fixed group weights,
        class weights, nor InfoBatch (which prunes by the latest training losses, never a pass)."""
        return self.method == "gradnorm" or (self.method == "attent" and self.strategy != "random")

    @property
    def uses_ratio_schedule(self) -> bool:
        """Whether the ratio and interval schedules decide the subsets (not full, not InfoBatch)."""
        return self.method not in ("full", "infobatch")


def check_streamable(selection: SelectionConfig) -> None:
    """Refuses, in one line naming the fix, settings a stream cannot follow.

    Raises:
        ValueError: a method other than AtteNT or full data, or a setting that needs the whole
            training set (``stratify``, ``reweight``, ``scores: training``, interval kind cycles).
    """
    if selection.method not in ("attent", "full"):
        raise ValueError(
            f"selection method {selection.method} needs a training set it can index: from a stream, "
            "select with method attent (hard, soft or random) or train on everything with method full"
        )
    whole_set = [name for name in ("stratify", "reweight") if getattr(selection, name)]
    whole_set += ["scores: training"] if selection.scores == "training" else []
    whole_set += ["interval kind cycles"] if selection.interval.kind == "cycles" else []
    if whole_set:
        raise ValueError(
            f"selection {', '.join(whole_set)} needs the whole training set; a stream selects from each pool "
            "alone: drop it (every pool is a re-selection)"
        )
