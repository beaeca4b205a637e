"""One unit per selection method: what a re-selection picks, and how it weighs the picked samples.

Each method answers ``pick(pool, epoch, k)`` with a ``Pick``; the plan decides when it is asked and
for how many samples (``plan``), the Selector holds everything around it (the score table, the
random generator, checkpoints and the agreement of ranks). A new method is a class here and one line in ``METHODS``, the registry of
methods by name; its name goes in ``config.METHOD_NAMES`` and its knobs in ``SelectionConfig``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import baselines
from .config import METHOD_NAMES, SelectionConfig
from .strategies import inclusion_probabilities, select, soft_logits, soft_weights, systematic_sample, weighted_sample


@dataclass
class Pool:
    """What a method sees at a re-selection (shared tensors: read, never write)."""

    scores: torch.Tensor  # [N] latest loss of every sample; NaN: never scored
    component_scores: torch.Tensor  # [N, C] the same per loss component (C = 1 without components)
    generator: torch.Generator  # the Selector's: every rank draws the same subset

    def filled_scores(self) -> torch.Tensor:
        """Scores with never-scored samples ranked at the highest observed loss (unseen data is
        worth seeing); all zeros before any score."""
        scored = ~torch.isnan(self.scores)
        if not scored.any():
            return torch.zeros(self.scores.numel())
        return torch.where(scored, self.scores, self.scores[scored].max())


@dataclass
class Pick:
    """A re-selection's outcome."""

    subset: torch.Tensor  # ascending indices of the samples trained on
    loss_weights: torch.Tensor | None = None  # [N] per-sample loss weights; None: all 1


def stream_seed(seed: int, method: str, strategy: str) -> int:
    """The seed of a run's selection generator: independent per (seed, method, strategy), so that
    Soft and Random of one seed do not share their draws (with near-equal losses a shared stream
    made their subsets nearly identical). Stable across processes and Python versions.

    >>> stream_seed(0, "attent", "soft") == stream_seed(0, "attent", "random")
    False
    """
    digest = hashlib.sha256(f"{seed}/{method}/{strategy}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class SelectionMethod:
    """A method's decision at each re-selection. ``components``: loss components of the task
    (modalities), 0 or 1 when it has none."""

    name: ClassVar[str]

    def __init__(
        self, config: SelectionConfig, *, num_samples: int, epochs: int, groups: torch.Tensor | None, components: int
    ):
        self.config, self.num_samples, self.epochs = config, num_samples, epochs
        self.components = max(components, 1)

    def pick(self, pool: Pool, epoch: int, k: int | None) -> Pick:
        """The pick at ``epoch`` of ``k`` samples (None: the method decides how many, InfoBatch)."""
        raise NotImplementedError

    def component_weights(self) -> torch.Tensor:
        """[C] weight of each loss component in the training loss (mean 1)."""
        return torch.ones(self.components)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class FullData(SelectionMethod):
    """Every sample, every epoch: the baseline without selection."""

    name = "full"


class AtteNT(SelectionMethod):
    """The paper's teacher: Hard (top-k), Soft (Gumbel-top-k) or Random k of the latest losses;
    Random (k uniform samples at the same ratio and interval schedules, no score read) is the
    control that isolates what loss-driven choice adds.
    Beyond the paper: ``stratify`` picks within each class (its share of k), ``reweight`` draws
    with known inclusion probabilities pi_i and weighs each pick k / (N pi_i), so that the
    expected gradient of the subset's mean loss is the full data's."""

    name = "attent"

    def __init__(self, config, *, num_samples, epochs, groups, components):
        super().__init__(config, num_samples=num_samples, epochs=epochs, groups=groups, components=components)
        self.groups = require_groups(config, groups, num_samples) if config.stratify else None

    def pick(self, pool: Pool, epoch: int, k: int) -> Pick:
        cfg = self.config
        if cfg.strategy == "random":
            keys = torch.zeros(self.num_samples)
        else:
            keys = pool.filled_scores()
            keys = soft_logits(keys, cfg.soft_logits) if cfg.strategy == "soft" else keys
        if not (cfg.stratify or cfg.reweight):  # the paper's pick
            return Pick(select(keys, k, cfg.strategy, temperature=cfg.temperature, generator=pool.generator))
        strata = class_quotas(self.groups, k) if cfg.stratify else [(torch.arange(self.num_samples), k)]
        weights = torch.ones(self.num_samples) if cfg.reweight else None
        chosen = []
        for members, quota in strata:
            if cfg.reweight:  # a draw whose inclusion probabilities are known exactly
                size = (
                    soft_weights(keys[members], cfg.temperature)
                    if cfg.strategy == "soft"
                    else torch.ones(members.numel(), dtype=torch.float64)
                )
                pi = inclusion_probabilities(size, quota)
                local = systematic_sample(pi, pool.generator)
                weights[members[local]] = (k / (self.num_samples * pi[local])).float()
            else:
                local = select(
                    keys[members], quota, cfg.strategy, temperature=cfg.temperature, generator=pool.generator
                )
            chosen.append(members[local])
        return Pick(torch.cat(chosen).sort().values, weights)


class ClassWeight(SelectionMethod):
    """k samples drawn with probability 1 / their class's frequency: every class gets equal mass."""

    name = "class_weight"

    def __init__(self, config, *, num_samples, epochs, groups, components):
        super().__init__(config, num_samples=num_samples, epochs=epochs, groups=groups, components=components)
        self.groups = require_groups(config, groups, num_samples)

    def pick(self, pool: Pool, epoch: int, k: int) -> Pick:
        return Pick(weighted_sample(baselines.class_balanced_weights(self.groups), k, generator=pool.generator))


class GroupWeighted(SelectionMethod):
    """Base of the methods that weigh groups: with several loss components (modalities) the
    weights scale the components in the training loss and the subset is uniform at the budget;
    else each group of samples (class) receives its weight's share of the budget."""

    def __init__(self, config, *, num_samples, epochs, groups, components):
        super().__init__(config, num_samples=num_samples, epochs=epochs, groups=groups, components=components)
        self.per_component = components > 1
        self.groups = None if self.per_component else require_groups(config, groups, num_samples)
        num_groups = components if self.per_component else int(self.groups.max()) + 1
        self.weights = torch.ones(num_groups, dtype=torch.float64)

    def component_weights(self) -> torch.Tensor:
        return self.weights.float() if self.per_component else super().component_weights()

    def state_dict(self) -> dict:
        return {"group_weights": self.weights.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.weights = state["group_weights"].clone()


class GroupWeight(GroupWeighted):
    """Fixed weights per group, e.g. modalities 1:2:2 (``selection.group_weights``)."""

    name = "group_weight"

    def __init__(self, config, *, num_samples, epochs, groups, components):
        super().__init__(config, num_samples=num_samples, epochs=epochs, groups=groups, components=components)
        if self.per_component and len(config.group_weights) != components:
            raise ValueError(
                f"group_weights has {len(config.group_weights)} entries for {components} loss components (modalities)"
            )

    def pick(self, pool: Pool, epoch: int, k: int) -> Pick:
        weights = torch.tensor(self.config.group_weights, dtype=torch.float64)
        if self.per_component:
            self.weights = weights * (weights.numel() / weights.sum())
        return Pick(group_budget(weights, self.groups, self.num_samples, k, pool.generator))


class GradNorm(GroupWeighted):
    """GradNorm-style group weights (Chen et al., 2018), updated at each re-selection from the
    groups' mean losses against their first ones (``baselines.gradnorm_update``)."""

    name = "gradnorm"

    def __init__(self, config, *, num_samples, epochs, groups, components):
        super().__init__(config, num_samples=num_samples, epochs=epochs, groups=groups, components=components)
        self.initial_losses = torch.full_like(self.weights, float("nan"))

    def pick(self, pool: Pool, epoch: int, k: int) -> Pick:
        if self.per_component:
            losses = pool.component_scores.double().nanmean(dim=0)
        else:
            losses = baselines.group_mean_losses(pool.scores, self.groups, self.weights.numel())
        self.initial_losses = torch.where(torch.isnan(self.initial_losses), losses, self.initial_losses)
        self.weights = baselines.gradnorm_update(
            self.weights, losses, self.initial_losses, alpha=self.config.gradnorm_alpha, step=self.config.gradnorm_step
        )
        return Pick(group_budget(self.weights, self.groups, self.num_samples, k, pool.generator))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "initial_group_losses": self.initial_losses.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.initial_losses = state["initial_group_losses"].clone()


class InfoBatch(SelectionMethod):
    """InfoBatch (Qin et al., 2024): each epoch, drop a random share of the below-mean-loss
    samples and up-weight the kept ones (the latest losses, no scoring pass); the plan trains the
    epochs after the first floor(δ·E), δ = 1 − final, on all data (as its official code does)."""

    name = "infobatch"

    def pick(self, pool: Pool, epoch: int, k: int | None) -> Pick:
        subset, weights = baselines.infobatch_prune(pool.scores, self.config.infobatch_prune, generator=pool.generator)
        return Pick(subset, weights)


def require_groups(config: SelectionConfig, groups: torch.Tensor | None, num_samples: int) -> torch.Tensor:
    if groups is None or groups.numel() != num_samples:
        raise ValueError(
            f"method {config.method} needs one group label (class) per sample, "
            "or a task with several loss components (modalities)"
        )
    return groups.long().cpu()


def class_quotas(groups: torch.Tensor, k: int) -> list[tuple[torch.Tensor, int]]:
    """(members, quota) per class: k shared in proportion to the classes' sizes, rounded by the
    largest remainders (ties to the lower class id) so that the quotas sum to k."""
    counts = torch.bincount(groups).double()
    exact = counts * k / counts.sum()
    quotas = exact.floor().long()
    remainders = (exact - quotas).tolist()
    for c in sorted(range(len(remainders)), key=lambda c: (-remainders[c], c))[: k - int(quotas.sum())]:
        quotas[c] += 1
    return [((groups == c).nonzero().squeeze(1), int(q)) for c, q in enumerate(quotas.tolist()) if q > 0]


def group_budget(
    group_weights: torch.Tensor, groups: torch.Tensor | None, num_samples: int, k: int, generator: torch.Generator
) -> torch.Tensor:
    """k samples, each group its share ``group_weights`` of them; uniform without groups (loss
    components: every sample holds every component)."""
    weights = torch.ones(num_samples) if groups is None else baselines.group_sample_weights(groups, group_weights)
    return weighted_sample(weights, min(k, int((weights > 0).sum())), generator=generator)


METHODS: dict[str, type[SelectionMethod]] = {
    method.name: method for method in (AtteNT, FullData, ClassWeight, GroupWeight, GradNorm, InfoBatch)
}
if set(METHODS) != set(METHOD_NAMES):
    raise ImportError(f"selection methods {sorted(METHODS)} differ from config.METHOD_NAMES {sorted(METHOD_NAMES)}")
