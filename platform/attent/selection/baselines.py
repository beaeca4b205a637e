"""Pure functions behind the baseline sampling methods the paper compares AtteNT with."""

from __future__ import annotations

import torch


def group_counts(groups: torch.Tensor, num_groups: int | None = None) -> torch.Tensor:
    return torch.bincount(groups, minlength=num_groups or 0).double()


def class_balanced_weights(groups: torch.Tensor) -> torch.Tensor:
    """Per-sample sampling weight 1 / frequency of its class: every class gets equal total mass."""
    return 1.0 / group_counts(groups)[groups]


def group_sample_weights(groups: torch.Tensor, group_weights: torch.Tensor) -> torch.Tensor:
    """Per-sample weight so that group g receives a share group_weights[g] / sum of the budget
    (e.g. modalities 1:2:2), spread evenly over the group's samples."""
    num_groups = int(groups.max()) + 1
    if group_weights.numel() < num_groups:
        raise ValueError(f"group_weights has {group_weights.numel()} entries but the data has {num_groups} groups")
    return group_weights.double()[groups] / group_counts(groups, num_groups)[groups]


def group_mean_losses(scores: torch.Tensor, groups: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Mean per-sample loss of each group over scored samples (NaN where none is scored)."""
    scored = ~torch.isnan(scores)
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, groups[scored], scores[scored].double())
    counts = torch.bincount(groups[scored], minlength=num_groups).double()
    return sums / counts


def gradnorm_update(
    weights: torch.Tensor, group_losses: torch.Tensor, initial_losses: torch.Tensor, *, alpha: float, step: float
) -> torch.Tensor:
    """One GradNorm-style update of per-group weights (Chen et al., 2018).

    GradNorm wants each group's weighted gradient norm w_g G_g to equal mean(G) * r_g^alpha, where
    r_g = (L_g / L_g(0)) / mean(L / L(0)) is the group's relative inverse training rate. The
    gradient norm G_g is proxied by the group's mean per-sample loss (for cross-entropy the
    gradient w.r.t. the logits grows monotonically with it), so no extra backward is needed.
    Weights move a fraction ``step`` of the way (in log space) and are renormalised to sum to the
    number of groups. Groups with no observation keep their weight.
    """
    known = ~(torch.isnan(group_losses) | torch.isnan(initial_losses)) & (initial_losses > 0)
    if known.sum() < 2:
        return weights
    rate = group_losses[known] / initial_losses[known]
    rate = rate / rate.mean()
    grad_norm = group_losses[known].clamp_min(1e-12)
    target = grad_norm.mean() * rate.pow(alpha)
    new = weights.clone()
    new[known] = weights[known] * (target / (weights[known] * grad_norm)).pow(step)
    return new * (weights.numel() / new.sum())


def infobatch_prune(
    scores: torch.Tensor, prune: float, *, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """InfoBatch (Qin et al., 2024): randomly drop a fraction ``prune`` of the samples whose loss
    is below the mean, and up-weight the kept ones by 1/(1-prune) so the expected gradient is
    unchanged. Unscored (NaN) samples are always kept. Returns (subset, per-sample loss weights)."""
    weights = torch.ones(scores.numel())
    scored = ~torch.isnan(scores)
    if not scored.any() or prune == 0:
        return torch.arange(scores.numel()), weights
    well_learned = scored & (scores < scores[scored].mean())
    dropped = well_learned & (torch.rand(scores.numel(), generator=generator) < prune)
    weights[well_learned & ~dropped] = 1.0 / (1.0 - prune)
    return (~dropped).nonzero().squeeze(1), weights


def infobatch_prune_for_budget(budget: float, kept: list[float], prune: float, plan) -> float:
    """The prune ratio at which InfoBatch's mean kept ratio over the run is ``budget``, from a run
    at ``prune`` that kept ``kept[e]`` of the data in epoch e.

    In each pruning epoch of ``plan`` (InfoBatch's ``build_plan``: the epochs it re-selects) after
    the first (which has no losses yet and keeps everything) it drops ``prune`` x the below-mean
    share b_e = (1 - kept[e]) / prune; solving mean kept = budget for the prune ratio assumes the
    same shares b_e. Capped at 0.99: a budget below InfoBatch's floor (every below-mean sample
    dropped) cannot be met, and the report shows the budget reached.

    Args:
        budget: the mean share of the data to keep over the run.
        kept: the share each epoch kept in the run at ``prune``.
        prune: that run's prune ratio.
        plan: the run's ``Plan``.

    Returns:
        The prune ratio, in [0, 0.99].

    Raises:
        ValueError: the run at ``prune`` pruned nothing to calibrate from.
    """
    pruning = sum(1 for planned in plan if planned.selects)
    below = [(1.0 - k) / prune for k in kept[1:pruning]] if prune > 0 else []
    if not below or sum(below) <= 0:
        raise ValueError("the reference InfoBatch run pruned nothing: there is no below-mean share to calibrate from")
    wanted = len(plan) * (1.0 - budget) / sum(below)
    return min(max(wanted, 0.0), 0.99)
