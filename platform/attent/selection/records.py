"""A re-selection's record (MLflow's selection history) and the layout of the Selector's saved state."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from .methods import Pool
from .strategies import hardness, overlap

# The layout of ``Selector.state_dict``; a state of another format is refused in one line.
STATE_FORMAT = 3


@dataclass
class SelectionRecord:
    """One re-selection (or the return to all data), as logged to MLflow's selection history."""

    epoch: int
    method: str
    strategy: str
    ratio: float  # the plan's ratio (InfoBatch: the share its pruning kept)
    selected: int  # subset size
    score_mean: float  # over all scored samples
    score_std: float
    score_min: float
    score_max: float
    selected_score_mean: float
    seconds: float
    hardness: float = math.nan  # share of the pick in the hard top-k of the scores: uniform 0, hard 1
    overlap: float = math.nan  # share of the pick that was in the previous pick
    # rank correlation of training-forward and scoring-pass losses over the samples both gave
    # (trained on in the interval before, then re-scored): whether mixing the two is sound
    score_agreement: float = math.nan
    indices: torch.Tensor | None = field(default=None, repr=False)

    def summary(self) -> dict:
        """The record without its indices (the fields MLflow logs)."""
        out = asdict(self)
        out.pop("indices")
        return out


def selection_record(
    scores: torch.Tensor,
    subset: torch.Tensor,
    previous: torch.Tensor | None,
    selection,
    epoch: int,
    ratio: float,
    seconds: float,
    score_agreement: float,
) -> SelectionRecord:
    """The record of a pick ``subset`` made from ``scores`` after ``previous``.

    Args:
        scores: every sample's score when the pick was made (NaN: never scored).
        subset: the pick (global indices).
        previous: the pick before (None: the first).
        selection: the run's ``SelectionConfig`` (its method and strategy are recorded).
        epoch: the epoch it trains.
        ratio: the plan's ratio (the share kept where the method decides it).
        seconds: the time the pick took.
        score_agreement: of the scoring pass before it (NaN: none).

    Returns:
        The record, statistics over the scored samples.
    """
    scored = scores[~torch.isnan(scores)]
    chosen = scores[subset]
    chosen = chosen[~torch.isnan(chosen)]

    def stat(values: torch.Tensor, statistic) -> float:
        return float(statistic(values)) if values.numel() else float("nan")

    # hardness against the scores the pick was made from, never-scored ones ranked highest
    filled = Pool(scores, scores.unsqueeze(1), torch.Generator()).filled_scores()
    return SelectionRecord(
        epoch=epoch,
        method=selection.method,
        strategy=selection.strategy,
        ratio=ratio,
        selected=subset.numel(),
        score_mean=stat(scored, torch.mean),
        score_std=stat(scored, torch.std) if scored.numel() > 1 else 0.0,
        score_min=stat(scored, torch.min),
        score_max=stat(scored, torch.max),
        selected_score_mean=stat(chosen, torch.mean),
        seconds=seconds,
        hardness=hardness(subset, filled) if scored.numel() else math.nan,
        overlap=overlap(subset, previous, scores.numel()),
        score_agreement=score_agreement,
        indices=subset.clone(),
    )


def check_state_format(state: dict, what: str) -> None:
    """Refuses, in one line, a state this version cannot read.

    Raises:
        ValueError: ``state`` is of another format than ``STATE_FORMAT``.
    """
    found = state.get("format", 1) if isinstance(state, dict) else None
    if found != STATE_FORMAT:
        raise ValueError(
            f"{what} is of selection state format {found}, this attent reads format {STATE_FORMAT}: "
            "resume with the attent version that wrote it, or start the run afresh"
        )
