"""The AtteNT teacher: a score table over the training set and the decision, at epoch
boundaries, of which samples the learner sees next. Stateful but thin: the choices themselves
are the pure functions in ``core`` and ``baselines``."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import torch

from . import baselines
from .config import SelectionConfig
from .core import budget, select, weighted_sample
from .distributed import all_gather_observations
from .schedules import training_progress

# A scoring pass: given the (global) indices to score, yields (indices, losses) for this rank's share.
ScoreFn = Callable[[torch.Tensor], Iterable[tuple[torch.Tensor, torch.Tensor]]]


@dataclass
class SelectionRecord:
    """One re-selection, as logged to MLflow's selection history."""
    epoch: int
    method: str
    strategy: str
    ratio: float            # scheduled ratio r(p)
    selected: int           # subset size (may differ from ratio*N for infobatch)
    score_mean: float       # over all scored samples
    score_std: float
    score_min: float
    score_max: float
    selected_score_mean: float
    seconds: float
    indices: torch.Tensor | None = field(default=None, repr=False)

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("indices")
        return out


class Teacher:
    """Keeps the latest per-sample loss of every training sample and yields each epoch's subset.

    Per epoch the engine calls ``begin_epoch(epoch, score_fn)`` (which may run a full scoring pass
    and re-select), trains on ``subset`` through a ``SubsetSampler`` while feeding ``observe`` the
    per-sample losses of its own forward passes, then ``end_epoch()``. Under torch.distributed
    every rank holds the same table and draws the same subset from the same generator.
    """

    def __init__(self, num_samples: int, config: SelectionConfig, total_epochs: int, *, seed: int = 0,
                 groups: torch.Tensor | None = None, components: int = 0):
        if num_samples < 1:
            raise ValueError("the training set is empty: nothing to select from")
        if total_epochs < 1:
            raise ValueError(f"total_epochs must be >= 1, got {total_epochs}")
        # Loss components (modalities) are the groups of group_weight and GradNorm when a task has
        # several: their weights scale each component's loss; the subset is uniform at the budget.
        self.component_mode = config.method in ("group_weight", "gradnorm") and components > 1
        if config.method in ("class_weight", "group_weight", "gradnorm") and not self.component_mode:
            if groups is None or groups.numel() != num_samples:
                raise ValueError(f"method {config.method} needs one group label (class) per sample, "
                                 "or a task with several loss components (modalities)")
        self.config, self.num_samples, self.total_epochs = config, num_samples, total_epochs
        self.groups = None if groups is None else groups.long().cpu()
        self.num_groups = components if self.component_mode else 0 if groups is None else int(self.groups.max()) + 1
        if self.component_mode and config.method == "group_weight" and len(config.group_weights) != components:
            raise ValueError(f"group_weights has {len(config.group_weights)} entries for {components} "
                             f"loss components (modalities)")
        self.scores = torch.full((num_samples,), float("nan"))
        self.trained = torch.zeros(num_samples, dtype=torch.bool)  # observed in training since the last selection
        self._scoring = False  # inside a scoring pass: its observations are not training forwards
        self.component_scores = torch.full((num_samples, max(components, 1)), float("nan"))
        self.generator = torch.Generator().manual_seed(seed)
        self.subset = torch.arange(num_samples)
        self.loss_weights = torch.ones(num_samples)
        self.epoch = 0
        self.next_selection = math.inf if config.method == "full" else config.warmup_epochs
        self.history: list[SelectionRecord] = []
        self.seconds = {"scoring": 0.0, "selection": 0.0}  # cumulative, for the time split
        self.group_weights = torch.ones(max(self.num_groups, 1), dtype=torch.float64)
        self.initial_group_losses = torch.full((max(self.num_groups, 1),), float("nan"), dtype=torch.float64)
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    # --- observations -----------------------------------------------------------------------
    def observe(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        """Record per-sample losses seen in a forward pass (kept locally until ``sync``):
        [B], or [B, C] per loss component (the score is their sum)."""
        losses = losses.detach().float().cpu().reshape(-1, self.component_scores.shape[1])
        indices = indices.detach().long().reshape(-1).cpu()
        if indices.numel() != losses.shape[0] or losses.shape[1] != self.component_scores.shape[1]:
            raise ValueError(f"{indices.numel()} indices but losses of shape {tuple(losses.shape)} "
                             f"({self.component_scores.shape[1]} component(s) expected)")
        finite = torch.isfinite(losses)
        if not finite.all():
            raise ValueError(f"non-finite per-sample loss for samples {indices[~finite.all(1)][:8].tolist()}: "
                             "the model diverged or the data holds invalid values")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.num_samples):
            # a negative index would silently overwrite another sample's score
            raise ValueError(f"sample indices must lie in [0, {self.num_samples}), got "
                             f"[{int(indices.min())}, {int(indices.max())}]: batches must carry "
                             "their position in the training set")
        self._pending.append((indices, losses))

    def sync(self) -> None:
        """Merge every rank's pending observations into the table (a collective under DDP)."""
        if self._pending:
            indices = torch.cat([i for i, _ in self._pending])
            losses = torch.cat([l for _, l in self._pending])
        else:
            indices, losses = torch.empty(0, dtype=torch.long), torch.empty(0, self.component_scores.shape[1])
        self._pending = []
        indices, losses = all_gather_observations(indices, losses)
        self.component_scores[indices] = losses
        if not self._scoring:
            self.trained[indices] = True
        self.scores[indices] = losses.sum(dim=1)

    # --- the epoch boundary -----------------------------------------------------------------
    def is_selection_epoch(self, epoch: int) -> bool:
        return epoch >= self.next_selection

    def needs_scoring(self, epoch: int) -> bool:
        """A full scoring pass is due: a loss-driven re-selection with rescoring on, or with
        samples never scored yet."""
        loss_driven = (self.config.method == "attent" and self.config.strategy != "random") or \
            self.config.method == "gradnorm"
        return loss_driven and self.is_selection_epoch(epoch) and (
            self.config.rescore or bool(torch.isnan(self.scores).any()))

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
        return self.subset

    def end_epoch(self) -> None:
        self.sync()

    def score(self, score_fn: ScoreFn) -> None:
        """Run a scoring pass: ``score_fn(indices)`` yields (indices, losses) for this rank's share
        of ``indices`` — every sample, or with ``rescore_stale`` only the stale ones."""
        start = time.perf_counter()
        self._scoring = True
        try:
            for indices, losses in score_fn(self.stale_indices()):
                self.observe(indices, losses)
            self.sync()
        finally:
            self._scoring = False
        self.seconds["scoring"] += time.perf_counter() - start

    def stale_indices(self) -> torch.Tensor:
        """The samples a scoring pass scores. With ``rescore_stale`` (beyond the paper): only those
        whose latest score predates the current interval (or that were never scored); samples
        trained on since the last re-selection keep the loss of their latest training forward."""
        if not self.config.rescore_stale:
            return torch.arange(self.num_samples)
        return (~self.trained | torch.isnan(self.scores)).nonzero().squeeze(1)

    @property
    def selected_ratio(self) -> float:
        return self.subset.numel() / self.num_samples

    def _reselect(self, epoch: int) -> None:
        start = time.perf_counter()
        cfg, p = self.config, training_progress(epoch, self.total_epochs)
        ratio = cfg.ratio_schedule(p)
        k = budget(self.num_samples, ratio)
        weights = torch.ones(self.num_samples)
        if cfg.method == "attent" or cfg.method == "random":
            scores = torch.zeros(self.num_samples) if cfg.strategy == "random" else self._filled_scores()
            subset = select(scores, k, cfg.strategy, temperature=cfg.temperature, generator=self.generator)
        elif cfg.method == "class_weight":
            subset = weighted_sample(baselines.class_balanced_weights(self.groups), k, generator=self.generator)
        elif cfg.method == "group_weight":
            group_w = torch.tensor(cfg.group_weights, dtype=torch.float64)
            if self.component_mode:
                self.group_weights = group_w * (group_w.numel() / group_w.sum())
            subset = self._group_budget(group_w, k)
        elif cfg.method == "gradnorm":
            losses = self._group_losses()
            self.initial_group_losses = torch.where(torch.isnan(self.initial_group_losses), losses,
                                                    self.initial_group_losses)
            self.group_weights = baselines.gradnorm_update(
                self.group_weights, losses, self.initial_group_losses,
                alpha=cfg.gradnorm_alpha, step=cfg.gradnorm_step)
            subset = self._group_budget(self.group_weights, k)
        elif cfg.method == "infobatch":
            ratio = 1.0
            if epoch < math.ceil((1 - cfg.infobatch_final) * self.total_epochs):
                subset, weights = baselines.infobatch_prune(self.scores, cfg.infobatch_prune,
                                                            generator=self.generator)
            else:  # annealing: the final epochs see all data, unweighted
                subset = torch.arange(self.num_samples)
        else:
            raise ValueError(f"unknown selection method {cfg.method!r}")
        self.subset, self.loss_weights = subset, weights
        interval = 1 if cfg.method == "infobatch" else cfg.interval_schedule(p)
        self.next_selection = epoch + interval
        self.trained.zero_()  # a new interval begins
        self.seconds["selection"] += time.perf_counter() - start
        self.history.append(self._record(epoch, ratio, time.perf_counter() - start))

    def _filled_scores(self) -> torch.Tensor:
        # Samples never scored rank with the highest observed loss: unseen data is worth seeing.
        scored = ~torch.isnan(self.scores)
        if not scored.any():
            return torch.zeros(self.num_samples)
        return torch.where(scored, self.scores, self.scores[scored].max())

    @property
    def component_weights(self) -> torch.Tensor:
        """Weight of each loss component in the training loss (mean 1; all 1 outside the group
        baselines on a task with components)."""
        if not self.component_mode:
            return torch.ones(self.component_scores.shape[1])
        return self.group_weights.float()

    def _group_losses(self) -> torch.Tensor:
        """Mean latest loss of each group: per component, or per group of samples."""
        if self.component_mode:
            return self.component_scores.double().nanmean(dim=0)
        return baselines.group_mean_losses(self.scores, self.groups, self.num_groups)

    def _group_budget(self, group_weights: torch.Tensor, k: int) -> torch.Tensor:
        if self.component_mode:  # every sample holds every component: a uniform subset
            return self._weighted_budget(torch.ones(self.num_samples), k)
        return self._weighted_budget(baselines.group_sample_weights(self.groups, group_weights), k)

    def _weighted_budget(self, weights: torch.Tensor, k: int) -> torch.Tensor:
        return weighted_sample(weights, min(k, int((weights > 0).sum())), generator=self.generator)

    def _record(self, epoch: int, ratio: float, seconds: float) -> SelectionRecord:
        scored = self.scores[~torch.isnan(self.scores)]
        chosen = self.scores[self.subset]
        chosen = chosen[~torch.isnan(chosen)]
        stat = (lambda t, f: float(f(t)) if t.numel() else float("nan"))
        return SelectionRecord(
            epoch=epoch, method=self.config.method, strategy=self.config.strategy, ratio=ratio,
            selected=self.subset.numel(), score_mean=stat(scored, torch.mean),
            score_std=stat(scored, torch.std) if scored.numel() > 1 else 0.0,
            score_min=stat(scored, torch.min), score_max=stat(scored, torch.max),
            selected_score_mean=stat(chosen, torch.mean), seconds=seconds, indices=self.subset.clone())

    # --- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed for a resumed run to draw the same subsets as an uninterrupted one.
        Call it after ``end_epoch()`` (observations must be merged; merging is a collective)."""
        if self._pending:
            raise RuntimeError("unmerged observations: call sync() or end_epoch() before state_dict()")
        return {
            "num_samples": self.num_samples, "scores": self.scores.clone(),
            "component_scores": self.component_scores.clone(),
            "generator": self.generator.get_state(), "subset": self.subset.clone(),
            "loss_weights": self.loss_weights.clone(), "epoch": self.epoch,
            "next_selection": self.next_selection, "seconds": dict(self.seconds),
            "trained": self.trained.clone(),
            "group_weights": self.group_weights.clone(),
            "initial_group_losses": self.initial_group_losses.clone(),
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
        self.group_weights = state["group_weights"].clone()
        self.initial_group_losses = state["initial_group_losses"].clone()
        self.history = [SelectionRecord(**summary, indices=idx) for summary, idx in state["history"]]
        self._pending = []
