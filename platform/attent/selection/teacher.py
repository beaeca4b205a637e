"""The AtteNT teacher: a score table over the training set and, at each epoch boundary, the
decision the plan holds for the epoch (a scoring pass, a re-selection, all data or the pick kept).
Stateful but thin: the epochs are ``plan``'s, which samples are scored and which losses are written
is the ``ScoringPolicy``'s, each method's choice is its unit in ``methods``; the teacher keeps the
table, the generator, the state and the agreement of ranks."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch

from .config import SelectionConfig
from .distributed import all_gather_observations
from .methods import METHODS, Pool
from .plan import Plan, PlannedEpoch, build_plan
from .schedules import budget
from .scoring import ScoringPolicy
from .strategies import hardness, overlap, rank_correlation

# A scoring pass: given the (global) indices to score, yields (indices, losses) for this rank's share.
ScoreFn = Callable[[torch.Tensor], Iterable[tuple[torch.Tensor, torch.Tensor]]]
# The layout of ``Teacher.state_dict``; a state of another format is refused in one line.
STATE_FORMAT = 2
NONFINITE = ("raise", "skip")


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
        out = asdict(self)
        out.pop("indices")
        return out


def stream_seed(seed: int, method: str, strategy: str) -> int:
    """The seed of a teacher's random stream: independent per (seed, method, strategy), so that
    Soft and Random of one seed do not share their draws (with near-equal losses a shared stream
    made their subsets nearly identical). Stable across processes and Python versions."""
    digest = hashlib.sha256(f"{seed}/{method}/{strategy}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def check_state_format(state: dict, what: str) -> None:
    """Refuses, in one line, a state this version cannot read."""
    found = state.get("format", 1) if isinstance(state, dict) else None
    if found != STATE_FORMAT:
        raise ValueError(
            f"{what} is of selection state format {found}, this attent reads format {STATE_FORMAT}: "
            "resume with the attent version that wrote it, or start the run afresh"
        )


class Teacher:
    """Keeps the latest per-sample loss of every training sample and yields each epoch's subset.

    Per epoch: ``begin_epoch(epoch, score_fn)`` (a scoring pass and a re-selection where the plan
    says so), training on ``subset`` through a ``SubsetSampler`` while ``observe`` collects the
    per-sample losses of its forwards (kept on their device), then ``end_epoch()``, which merges
    them into the table (a collective under torch.distributed: every rank holds the same table
    and draws the same subset from the same generator). ``nonfinite``: a NaN or inf loss stops the
    run ("raise", at the merge) or is left out of the table ("skip"), the sample keeping its score.
    """

    def __init__(
        self,
        num_samples: int,
        config: SelectionConfig,
        epochs: int,
        *,
        seed: int = 0,
        groups: torch.Tensor | None = None,
        components: int = 0,
        nonfinite: str = "raise",
    ):
        if num_samples < 1:
            raise ValueError("the training set is empty: nothing to select from")
        if nonfinite not in NONFINITE:
            raise ValueError(f"nonfinite={nonfinite!r}: choose 'raise' or 'skip'")
        self.config, self.num_samples, self.epochs, self.nonfinite = config, num_samples, epochs, nonfinite
        self.plan: Plan = build_plan(config, epochs)  # refuses an impossible plan before training starts
        self.scoring = ScoringPolicy.of(config)
        self.method = METHODS[config.method](
            config, num_samples=num_samples, epochs=epochs, groups=groups, components=components
        )
        self.scores = torch.full((num_samples,), float("nan"))
        self.component_scores = torch.full((num_samples, max(components, 1)), float("nan"))
        self.trained = torch.zeros(num_samples, dtype=torch.bool)  # observed in training since the last pick
        self.generator = torch.Generator().manual_seed(stream_seed(seed, config.method, config.strategy))
        self.subset = torch.arange(num_samples)
        self.loss_weights = torch.ones(num_samples)
        self.epoch = -1  # the epoch prepared last: begin_epoch of it again (a resume inside it) keeps it
        self.score_agreement = math.nan  # of the latest scoring pass
        self.history: list[SelectionRecord] = []
        self.seconds = {"scoring": 0.0, "selection": 0.0}  # cumulative, for the time split
        self.skipped = 0  # this rank's non-finite losses left out of the table (nonfinite="skip")
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._in_pass = False  # inside a scoring pass: its observations are not training forwards

    # --- observations -----------------------------------------------------------------------
    def observe(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        """Record per-sample losses seen in a forward pass, [B], or [B, C] per loss component (the
        score is their sum). Kept on their device until ``sync``: nothing here waits on a GPU."""
        components = self.component_scores.shape[1]
        losses = losses.detach().float().reshape(-1, components)
        indices = torch.as_tensor(indices).detach().reshape(-1)
        if indices.numel() != losses.shape[0]:
            raise ValueError(
                f"{indices.numel()} indices but losses of shape {tuple(losses.shape)} "
                f"({components} component(s) expected)"
            )
        self._pending.append((indices, losses))

    def sync(self) -> None:
        """Merge every rank's pending observations into the table (a collective under DDP)."""
        indices, losses = self._take_pending()
        indices, losses = all_gather_observations(indices, losses)
        if not self._in_pass:
            self.trained[indices] = True
        if self.scoring.writes(self._in_pass, self.subset.numel() == self.num_samples):
            self.component_scores[indices] = losses
            self.scores[indices] = losses.sum(dim=1)

    def _take_pending(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's pending observations on the CPU, in one transfer per kind, checked."""
        components = self.component_scores.shape[1]
        pending, self._pending = self._pending, []
        if not pending:
            return torch.empty(0, dtype=torch.long), torch.empty(0, components)
        device = pending[0][1].device
        losses = torch.cat([loss.to(device) for _, loss in pending]).cpu()
        indices = torch.cat([i.to(device, torch.long) for i, _ in pending]).cpu()
        finite = torch.isfinite(losses).all(1)
        if not finite.all():
            if self.nonfinite == "raise":
                raise ValueError(
                    f"non-finite per-sample loss for samples {indices[~finite][:8].tolist()}: the model diverged "
                    "or the data holds invalid values (nonfinite='skip' trains on, leaving such losses out of the scores)"
                )
            self.skipped += int((~finite).sum())
            indices, losses = indices[finite], losses[finite]
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.num_samples):
            # a negative index would silently overwrite another sample's score
            raise ValueError(
                f"sample indices must lie in [0, {self.num_samples}), got "
                f"[{int(indices.min())}, {int(indices.max())}]: batches must carry "
                "their position in the training set"
            )
        return indices, losses

    # --- the epoch boundary -----------------------------------------------------------------
    def needs_scoring(self, epoch: int) -> bool:
        """A scoring pass is due before ``epoch``'s re-selection (and the epoch is not prepared yet)."""
        return epoch != self.epoch and self.scoring.pass_due(self.plan[epoch], self.scores)

    def begin_epoch(self, epoch: int, score_fn: ScoreFn | None = None) -> torch.Tensor:
        """Prepare epoch ``epoch`` as planned: a scoring pass and a re-selection where due, all data
        again, or the pick kept; returns the (global) subset. Every rank calls it (it may run
        collectives). The epoch prepared last (a state restored inside it) is kept as it is."""
        if epoch == self.epoch:
            return self.subset
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch {epoch} lies outside the run's {self.epochs} epochs")
        self.sync()
        due = self.needs_scoring(epoch)
        self.epoch, planned = epoch, self.plan[epoch]
        if due:
            if score_fn is None:
                raise ValueError(f"epoch {epoch} needs a scoring pass but no score_fn was given")
            self.score(score_fn)
        if planned.selects:
            self._reselect(planned)
        elif planned.all_data and self.subset.numel() < self.num_samples:
            self._all_data(epoch)
        return self.subset

    def end_epoch(self) -> None:
        self.sync()

    def score(self, score_fn: ScoreFn) -> None:
        """Run a scoring pass: ``score_fn(indices)`` yields (indices, losses) for this rank's share
        of the samples the scoring policy has due."""
        start = time.perf_counter()
        training_losses, trained = self.scores.clone(), self.trained.clone()
        indices = self.scoring.pass_indices(self.scores, self.trained, self.generator)
        self._in_pass = True
        try:
            for batch_indices, losses in score_fn(indices):
                self.observe(batch_indices, losses)
            self.sync()
        finally:
            self._in_pass = False
        both = indices[trained[indices] & ~torch.isnan(training_losses[indices])]
        self.score_agreement = rank_correlation(training_losses[both], self.scores[both])
        self.seconds["scoring"] += time.perf_counter() - start

    @property
    def selected_ratio(self) -> float:
        return self.subset.numel() / self.num_samples

    def _reselect(self, planned: PlannedEpoch) -> None:
        start = time.perf_counter()
        pool = Pool(self.scores, self.component_scores, self.generator)
        k = None if planned.ratio is None else budget(self.num_samples, planned.ratio)
        pick = self.method.pick(pool, planned.epoch, k)
        previous = self.history[-1].indices if self.history else None
        self.subset = pick.subset
        self.loss_weights = torch.ones(self.num_samples) if pick.loss_weights is None else pick.loss_weights
        self.trained.zero_()  # a new interval begins
        self.seconds["selection"] += time.perf_counter() - start
        ratio = self.selected_ratio if planned.ratio is None else planned.ratio
        self.history.append(self._record(planned.epoch, ratio, time.perf_counter() - start, previous))
        self.score_agreement = math.nan  # belongs to this pick's scoring pass

    def _all_data(self, epoch: int) -> None:
        """Back to all data, unweighted, with no pick and no scoring pass: the final ``anneal``
        share of the epochs, InfoBatch's final epochs, or the full epochs that end each cycle."""
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
        Between epochs it is the same on every rank; inside one it holds this rank's losses
        observed so far (not merged yet), which a resumed rank merges at the epoch's end."""
        return {
            "format": STATE_FORMAT,
            "num_samples": self.num_samples,
            "scores": self.scores.clone(),
            "component_scores": self.component_scores.clone(),
            "generator": self.generator.get_state(),
            "subset": self.subset.clone(),
            "loss_weights": self.loss_weights.clone(),
            "epoch": self.epoch,
            "seconds": dict(self.seconds),
            "trained": self.trained.clone(),
            "skipped": self.skipped,
            "pending": [(i.detach().cpu(), loss.detach().cpu()) for i, loss in self._pending],
            "method": self.method.state_dict(),
            "history": [(r.summary(), r.indices) for r in self.history],
        }

    def load_state_dict(self, state: dict) -> None:
        check_state_format(state, "the teacher's state")
        if state["num_samples"] != self.num_samples:
            raise ValueError(f"checkpoint teacher has {state['num_samples']} samples, this dataset {self.num_samples}")
        self.scores, self.component_scores = state["scores"].clone(), state["component_scores"].clone()
        self.generator.set_state(state["generator"])
        self.subset, self.loss_weights = state["subset"].clone(), state["loss_weights"].clone()
        self.epoch, self.trained, self.skipped = state["epoch"], state["trained"].clone(), state["skipped"]
        self.seconds = dict(state["seconds"])
        self.method.load_state_dict(state["method"])
        self.history = [SelectionRecord(**summary, indices=idx) for summary, idx in state["history"]]
        self._pending = [(i.clone(), loss.clone()) for i, loss in state["pending"]]
