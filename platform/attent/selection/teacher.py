"""The AtteNT teacher: a score table over the training set and the decision, at epoch
boundaries, of which samples the learner sees next. Stateful but thin: each method's choice is
its unit in ``methods``; the teacher keeps the table, the schedules, the generator, the state
and the agreement of ranks."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch

from .config import SelectionConfig
from .deprecation import deprecated_arguments, warn_renamed
from .distributed import all_gather_observations
from .methods import METHODS, Pool
from .schedules import training_progress
from .strategies import budget, hardness, overlap, rank_correlation

# A scoring pass: given the (global) indices to score, yields (indices, losses) for this rank's share.
ScoreFn = Callable[[torch.Tensor], Iterable[tuple[torch.Tensor, torch.Tensor]]]


@dataclass
class SelectionRecord:
    """One re-selection, as logged to MLflow's selection history."""

    epoch: int
    method: str
    strategy: str
    ratio: float  # scheduled ratio r(p)
    selected: int  # subset size (may differ from ratio*N for infobatch)
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
        out = asdict(self)
        out.pop("indices")
        return out


def stream_seed(seed: int, method: str, strategy: str) -> int:
    """The seed of a teacher's random stream: independent per (seed, method, strategy), so that
    Soft and Random of one seed do not share their draws (with near-equal losses a shared stream
    made their subsets nearly identical). Stable across processes and Python versions."""
    digest = hashlib.sha256(f"{seed}/{method}/{strategy}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class Teacher:
    """Keeps the latest per-sample loss of every training sample and yields each epoch's subset.

    Per epoch the engine calls ``begin_epoch(epoch, score_fn)`` (which may run a full scoring pass
    and re-select), trains on ``subset`` through a ``SubsetSampler`` while feeding ``observe`` the
    per-sample losses of its own forward passes, then ``end_epoch()``. Under torch.distributed
    every rank holds the same table and draws the same subset from the same generator.
    """

    @deprecated_arguments(positional=4, renamed={"total_epochs": "epochs"})
    def __init__(
        self,
        num_samples: int,
        config: SelectionConfig,
        epochs: int,
        *,
        seed: int = 0,
        groups: torch.Tensor | None = None,
        components: int = 0,
    ):
        if num_samples < 1:
            raise ValueError("the training set is empty: nothing to select from")
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        self.config, self.num_samples, self.epochs = config, num_samples, epochs
        self.method = METHODS[config.method](
            config, num_samples=num_samples, epochs=epochs, groups=groups, components=components
        )
        self.scores = torch.full((num_samples,), float("nan"))
        self.trained = torch.zeros(num_samples, dtype=torch.bool)  # observed in training since the last selection
        self._scoring = False  # inside a scoring pass: its observations are not training forwards
        self.component_scores = torch.full((num_samples, max(components, 1)), float("nan"))
        self.generator = torch.Generator().manual_seed(stream_seed(seed, config.method, config.strategy))
        self.subset = torch.arange(num_samples)
        self.loss_weights = torch.ones(num_samples)
        self.epoch = 0
        # The released code's reading of "interval" (cycles): the plan, epoch by epoch, fixed
        # up front (it refuses an impossible one here, before training starts).
        self.plan = config.epoch_plan(epochs) if config.uses_cycles and self.method.selects else None
        self.next_selection = (
            self._next_planned(-1)
            if self.plan is not None
            else config.warmup_epochs
            if self.method.selects
            else math.inf
        )
        self.selecting_epochs = config.selecting_epochs(epochs)  # then annealing: all data
        self.score_agreement = math.nan  # of the latest scoring pass
        self.history: list[SelectionRecord] = []
        self.seconds = {"scoring": 0.0, "selection": 0.0}  # cumulative, for the time split
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        # A NaN or inf loss: "raise" stops (the engine's way: its run diverged), "skip" leaves it
        # out of the table, the sample keeping its previous score (the Hugging Face trainer's, as
        # Trainer trains on; an inf must never make a sample the hardest)
        self.nonfinite = "raise"

    @property
    def total_epochs(self) -> int:
        """Deprecated spelling of ``epochs``, removed in 0.3.0."""
        warn_renamed("Teacher.total_epochs", "Teacher.epochs", stacklevel=3)
        return self.epochs

    # --- observations -----------------------------------------------------------------------
    def observe(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        """Record per-sample losses seen in a forward pass (kept locally until ``sync``):
        [B], or [B, C] per loss component (the score is their sum)."""
        losses = losses.detach().float().cpu().reshape(-1, self.component_scores.shape[1])
        indices = indices.detach().long().reshape(-1).cpu()
        if indices.numel() != losses.shape[0] or losses.shape[1] != self.component_scores.shape[1]:
            raise ValueError(
                f"{indices.numel()} indices but losses of shape {tuple(losses.shape)} "
                f"({self.component_scores.shape[1]} component(s) expected)"
            )
        finite = torch.isfinite(losses).all(1)
        if not finite.all():
            if self.nonfinite == "raise":
                raise ValueError(
                    f"non-finite per-sample loss for samples {indices[~finite][:8].tolist()}: "
                    "the model diverged or the data holds invalid values"
                )
            indices, losses = indices[finite], losses[finite]
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.num_samples):
            # a negative index would silently overwrite another sample's score
            raise ValueError(
                f"sample indices must lie in [0, {self.num_samples}), got "
                f"[{int(indices.min())}, {int(indices.max())}]: batches must carry "
                "their position in the training set"
            )
        self._pending.append((indices, losses))

    def sync(self) -> None:
        """Merge every rank's pending observations into the table (a collective under DDP)."""
        if self._pending:
            indices = torch.cat([i for i, _ in self._pending])
            losses = torch.cat([loss for _, loss in self._pending])
        else:
            indices, losses = torch.empty(0, dtype=torch.long), torch.empty(0, self.component_scores.shape[1])
        self._pending = []
        indices, losses = all_gather_observations(indices, losses)
        if not self._scoring:
            self.trained[indices] = True
        if self._scoring or self.config.scores == "latest" or self.subset.numel() == self.num_samples:
            self.component_scores[indices] = losses
            self.scores[indices] = losses.sum(dim=1)

    # --- the epoch boundary -----------------------------------------------------------------
    def is_selection_epoch(self, epoch: int) -> bool:
        if self.plan is not None:
            return epoch < len(self.plan) and self.plan[epoch].selects
        return self.next_selection <= epoch < self.selecting_epochs

    def trains_on_all(self, epoch: int) -> bool:
        """The epoch trains on all data with no pick: annealing, or a cycle's full epochs."""
        if self.plan is not None:
            return epoch < len(self.plan) and self.plan[epoch].all_data
        return epoch >= self.selecting_epochs

    def scheduled_ratio(self, epoch: int) -> float:
        """The ratio a re-selection at ``epoch`` picks: the ratio schedule at the run's progress,
        or with cycles at the cycle's place among them."""
        if self.plan is not None:
            return self.plan[epoch].ratio
        return self.config.ratio_schedule(training_progress(epoch, self.epochs))

    def _next_planned(self, epoch: int) -> float:
        """The first planned re-selection after ``epoch`` (cycles), inf if none."""
        return next((p.epoch for p in self.plan[epoch + 1 :] if p.selects), math.inf)

    def needs_scoring(self, epoch: int) -> bool:
        """A full scoring pass is due: a loss-driven re-selection with rescoring on, or with
        samples never scored yet."""
        rescore = self.config.rescore and self.config.scores == "latest"  # free scores need no pass
        return (
            self.method.needs_scores
            and self.is_selection_epoch(epoch)
            and (rescore or bool(torch.isnan(self.scores).any()))
        )

    def begin_epoch(self, epoch: int, score_fn: ScoreFn | None = None) -> torch.Tensor:
        """Prepare epoch ``epoch``: score and re-select if due; returns the (global) subset.
        Every rank must call it (it may run collectives)."""
        self.sync()
        self.epoch = epoch
        if self.needs_scoring(epoch):
            if score_fn is None:
                raise ValueError(f"epoch {epoch} needs a scoring pass but no score_fn was given")
            self.score(score_fn)
        if self.is_selection_epoch(epoch):
            self._reselect(epoch)
        elif self.trains_on_all(epoch) and self.subset.numel() < self.num_samples:
            self._all_data(epoch)
        return self.subset

    def end_epoch(self) -> None:
        self.sync()

    def score(self, score_fn: ScoreFn) -> None:
        """Run a scoring pass: ``score_fn(indices)`` yields (indices, losses) for this rank's share
        of ``indices`` — every sample, or with ``rescore_stale`` only the stale ones."""
        start = time.perf_counter()
        training_losses, trained = self.scores.clone(), self.trained.clone()
        indices = self.stale_indices()
        self._scoring = True
        try:
            for batch_indices, losses in score_fn(indices):
                self.observe(batch_indices, losses)
            self.sync()
        finally:
            self._scoring = False
        both = indices[trained[indices] & ~torch.isnan(training_losses[indices])]
        self.score_agreement = rank_correlation(training_losses[both], self.scores[both])
        self.seconds["scoring"] += time.perf_counter() - start

    def stale_indices(self) -> torch.Tensor:
        """The samples a scoring pass scores: all of them, as in the paper, or (beyond it)
        - with ``rescore_stale``, only those not trained on since the last re-selection: the
          others keep the loss of their latest training forward;
        - with ``rescore_fraction`` < 1, a random share of those due (never-scored samples
          always): the others keep their latest score."""
        cfg = self.config
        if cfg.scores == "training":  # free scores: a pass only for samples no full-data epoch scored
            return torch.isnan(self.scores).nonzero().squeeze(1)
        due = (
            (~self.trained | torch.isnan(self.scores))
            if cfg.rescore_stale
            else torch.ones(self.num_samples, dtype=torch.bool)
        )
        if cfg.rescore_fraction < 1:
            known = (due & ~torch.isnan(self.scores)).nonzero().squeeze(1)
            keep = round(cfg.rescore_fraction * known.numel())
            due[known] = False
            due[known[torch.randperm(known.numel(), generator=self.generator)[:keep]]] = True
        return due.nonzero().squeeze(1)

    @property
    def selected_ratio(self) -> float:
        return self.subset.numel() / self.num_samples

    def _reselect(self, epoch: int) -> None:
        start = time.perf_counter()
        ratio = self.scheduled_ratio(epoch)
        pool = Pool(self.scores, self.component_scores, self.generator)
        pick = self.method.pick(pool, epoch, budget(self.num_samples, ratio))
        previous = self.history[-1].indices if self.history else None
        self.subset = pick.subset
        self.loss_weights = torch.ones(self.num_samples) if pick.loss_weights is None else pick.loss_weights
        if self.plan is not None:
            self.next_selection = self._next_planned(epoch)
        else:
            self.next_selection = epoch + (
                pick.interval or self.config.interval_schedule(training_progress(epoch, self.epochs))
            )
        self.trained.zero_()  # a new interval begins
        self.seconds["selection"] += time.perf_counter() - start
        ratio = ratio if pick.ratio is None else pick.ratio
        self.history.append(self._record(epoch, ratio, time.perf_counter() - start, previous))
        self.score_agreement = math.nan  # belongs to this pick's scoring pass

    def _all_data(self, epoch: int) -> None:
        """Back to all data, unweighted, with no pick and no scoring pass: the final ``anneal``
        share of the epochs (beyond the paper), or the full epochs that end each cycle."""
        previous = self.subset
        self.subset, self.loss_weights = torch.arange(self.num_samples), torch.ones(self.num_samples)
        self.history.append(self._record(epoch, 1.0, 0.0, previous))

    @property
    def component_weights(self) -> torch.Tensor:
        """Weight of each loss component in the training loss (mean 1; all 1 outside the group
        baselines on a task with components)."""
        return self.method.component_weights()

    def _record(self, epoch: int, ratio: float, seconds: float, previous: torch.Tensor | None) -> SelectionRecord:
        scored = self.scores[~torch.isnan(self.scores)]
        # hardness against the scores the pick was made from (never-scored ones ranked highest)
        ranked = Pool(self.scores, self.component_scores, self.generator).filled_scores()
        chosen = self.scores[self.subset]
        chosen = chosen[~torch.isnan(chosen)]

        def stat(values: torch.Tensor, statistic) -> float:
            return float(statistic(values)) if values.numel() else float("nan")

        return SelectionRecord(
            epoch=epoch,
            method=self.config.method,
            strategy=self.config.strategy,
            ratio=ratio,
            selected=self.subset.numel(),
            score_mean=stat(scored, torch.mean),
            score_std=stat(scored, torch.std) if scored.numel() > 1 else 0.0,
            score_min=stat(scored, torch.min),
            score_max=stat(scored, torch.max),
            selected_score_mean=stat(chosen, torch.mean),
            seconds=seconds,
            hardness=hardness(self.subset, ranked) if scored.numel() else math.nan,
            overlap=overlap(self.subset, previous, self.num_samples),
            score_agreement=self.score_agreement,
            indices=self.subset.clone(),
        )

    # --- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed for a resumed run to draw the same subsets as an uninterrupted one.
        Call it after ``end_epoch()`` (observations must be merged; merging is a collective)."""
        if self._pending:
            raise RuntimeError("unmerged observations: call sync() or end_epoch() before state_dict()")
        return {
            "num_samples": self.num_samples,
            "scores": self.scores.clone(),
            "component_scores": self.component_scores.clone(),
            "generator": self.generator.get_state(),
            "subset": self.subset.clone(),
            "loss_weights": self.loss_weights.clone(),
            "epoch": self.epoch,
            "next_selection": self.next_selection,
            "seconds": dict(self.seconds),
            "trained": self.trained.clone(),
            **self.method.state_dict(),
            "history": [(r.summary(), r.indices) for r in self.history],
        }

    def load_state_dict(self, state: dict) -> None:
        if state["num_samples"] != self.num_samples:
            raise ValueError(f"checkpoint teacher has {state['num_samples']} samples, this dataset {self.num_samples}")
        self.scores = state["scores"].clone()
        if "component_scores" in state:  # checkpoints from before loss components lack it
            self.component_scores = state["component_scores"].clone()
        self.generator.set_state(state["generator"])
        self.subset, self.loss_weights = state["subset"].clone(), state["loss_weights"].clone()
        self.epoch, self.next_selection = state["epoch"], state["next_selection"]
        if "trained" in state:  # checkpoints from before stale-only re-scoring lack it
            self.trained = state["trained"].clone()
        self.seconds = dict(state["seconds"])
        self.method.load_state_dict(state)
        self.history = [SelectionRecord(**summary, indices=idx) for summary, idx in state["history"]]
        self._pending = []
