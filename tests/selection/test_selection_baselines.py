"""Baseline sampling methods: the pure functions and their behaviour behind the Selector."""

from __future__ import annotations

import math

import pytest
import torch
from attent.selection import baselines
from attent.selection.config import SelectionConfig
from attent.selection.selector import Selector
from hypothesis import given, settings
from hypothesis import strategies as st


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def imbalanced_groups(sizes, seed=0) -> torch.Tensor:
    groups = torch.cat([torch.full((s,), g, dtype=torch.long) for g, s in enumerate(sizes)])
    return groups[torch.randperm(groups.numel(), generator=gen(seed))]


# --- pure functions ----------------------------------------------------------------------------------
@settings(deadline=None, max_examples=50)
@given(labels=st.lists(st.integers(0, 5), min_size=1, max_size=60))
def test_class_balanced_weights_give_each_class_equal_mass(labels):
    groups = torch.tensor(labels)
    w = baselines.class_balanced_weights(groups)
    mass = torch.zeros(6, dtype=torch.float64).index_add_(0, groups, w)
    present = torch.bincount(groups, minlength=6) > 0
    assert torch.allclose(mass[present], torch.ones(int(present.sum()), dtype=torch.float64))
    assert bool((mass[~present] == 0).all())


def test_group_sample_weights_shares():
    groups = imbalanced_groups([500, 300, 200])
    w = baselines.group_sample_weights(groups, torch.tensor([1.0, 2.0, 2.0]))
    mass = torch.zeros(3, dtype=torch.float64).index_add_(0, groups, w)
    assert torch.allclose(mass / mass.sum(), torch.tensor([0.2, 0.4, 0.4], dtype=torch.float64))
    # equal within a group
    for g in range(3):
        assert torch.unique(w[groups == g]).numel() == 1
    with pytest.raises(ValueError, match="group_weights"):
        baselines.group_sample_weights(groups, torch.tensor([1.0, 2.0]))


def test_group_mean_losses_skips_unscored():
    scores = torch.tensor([1.0, float("nan"), 3.0, 4.0, float("nan")])
    groups = torch.tensor([0, 0, 0, 1, 2])
    means = baselines.group_mean_losses(scores, groups, 3)
    assert means[0] == 2.0 and means[1] == 4.0 and math.isnan(means[2])


def test_gradnorm_update_favours_slow_groups():
    w = torch.ones(3, dtype=torch.float64)
    initial = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    now = torch.tensor([0.2, 0.9, 0.5], dtype=torch.float64)  # group 1 learns slowest
    new = baselines.gradnorm_update(w, now, initial, alpha=1.5, step=0.5)
    assert new.sum() == pytest.approx(3.0)  # renormalised to the group count
    assert new[1] > new[2] > new[0]
    # equal progress and equal losses: nothing to rebalance
    same = baselines.gradnorm_update(w, initial * 0.5, initial, alpha=1.5, step=0.5)
    assert torch.allclose(same, w)
    # step scales the move in log space
    half = baselines.gradnorm_update(w, now, initial, alpha=1.5, step=0.25)
    assert 1.0 < half[1] < new[1]


def test_gradnorm_update_needs_two_known_groups():
    w = torch.tensor([1.0, 2.0], dtype=torch.float64)
    nan = float("nan")
    out = baselines.gradnorm_update(
        w,
        torch.tensor([0.5, nan], dtype=torch.float64),
        torch.tensor([1.0, 1.0], dtype=torch.float64),
        alpha=1.5,
        step=0.5,
    )
    assert torch.equal(out, w)
    # an unobserved group among observed ones: finite weights, still normalised
    w3 = torch.ones(3, dtype=torch.float64)
    out = baselines.gradnorm_update(
        w3, torch.tensor([0.2, 0.9, nan], dtype=torch.float64), torch.ones(3, dtype=torch.float64), alpha=1.5, step=0.5
    )
    assert bool(torch.isfinite(out).all()) and out.sum() == pytest.approx(3.0) and out[1] > out[0]


def test_infobatch_prune_only_below_mean():
    n, prune = 10_000, 0.5
    scores = torch.rand(n, generator=gen(0))
    scores[:10] = float("nan")  # never scored: always kept
    subset, weights = baselines.infobatch_prune(scores, prune, generator=gen(1))
    kept = torch.zeros(n, dtype=torch.bool)
    kept[subset] = True
    mean = scores[~torch.isnan(scores)].mean()
    below = ~torch.isnan(scores) & (scores < mean)
    assert bool(kept[~below].all())  # above-mean and unscored: all kept
    assert bool((weights[~below] == 1.0).all())
    assert bool((weights[below & kept] == 1.0 / (1.0 - prune)).all())
    dropped_share = float((below & ~kept).sum() / below.sum())
    assert abs(dropped_share - prune) < 5 * math.sqrt(prune * (1 - prune) / float(below.sum()))
    assert bool((subset[1:] > subset[:-1]).all())
    # the reweighting keeps the expected summed loss of the below-mean samples
    total = float(scores[below].sum())
    assert float((scores * weights)[below & kept].sum()) == pytest.approx(total, rel=0.05)


def test_infobatch_prune_degenerate_cases():
    scores = torch.rand(50, generator=gen(0))
    subset, weights = baselines.infobatch_prune(scores, 0.0, generator=gen(0))
    assert torch.equal(subset, torch.arange(50)) and torch.equal(weights, torch.ones(50))
    subset, weights = baselines.infobatch_prune(torch.full((50,), float("nan")), 0.5, generator=gen(0))
    assert torch.equal(subset, torch.arange(50)) and torch.equal(weights, torch.ones(50))
    subset, _ = baselines.infobatch_prune(torch.ones(50), 0.9, generator=gen(0))  # none below mean
    assert torch.equal(subset, torch.arange(50))


# --- behind the Selector -------------------------------------------------------------------------------
def new_selector(n: int, cfg: SelectionConfig, epochs: int, **kwargs) -> Selector:
    return Selector(range(n), selection=cfg, epochs=epochs, **kwargs)


def drive(selector: Selector, epochs, losses_fn, *, observe_all=True):
    """Run epochs; record every sample's loss (or only the subset's) from losses_fn(epoch)."""
    out = []
    n = selector.num_samples

    def score_fn(epoch):
        def fn(indices):
            losses = losses_fn(epoch)
            for idx in indices.split(64):
                yield idx, losses[idx]

        return fn

    for epoch in epochs:
        subset = selector.begin_epoch(epoch, score_fn(epoch)).clone()
        out.append((subset, selector.loss_weights.clone()))
        losses = losses_fn(epoch)
        seen = torch.arange(n) if observe_all else subset
        selector.update(losses[seen], seen)
        selector.end_epoch()
    return out


def test_infobatch_behind_the_selector():
    n, epochs = 2000, 8
    cfg = SelectionConfig(method="infobatch", infobatch_prune=0.5, infobatch_final=0.125)
    t = new_selector(n, cfg, epochs=epochs, seed=123)  # not a seed of losses_fn's streams
    losses_fn = lambda e: torch.rand(n, generator=gen(e))  # noqa: E731
    assert not t.needs_scoring(0)
    out = drive(t, range(epochs), losses_fn, observe_all=False)
    # epoch 0: nothing scored yet, so nothing pruned
    assert torch.equal(out[0][0], torch.arange(n)) and torch.equal(out[0][1], torch.ones(n))
    table = losses_fn(0)  # all of epoch 0 observed; later epochs only refresh the kept samples
    for epoch in range(1, epochs - 1):
        subset, weights = out[epoch]
        kept = torch.zeros(n, dtype=torch.bool)
        kept[subset] = True
        below = table < table.mean()
        assert bool(kept[~below].all()) and not bool(kept.all())
        assert abs(float((below & ~kept).sum() / below.sum()) - 0.5) < 0.1
        assert bool((weights[below & kept] == 2.0).all()) and bool((weights[~below] == 1.0).all())
        table[subset] = losses_fn(epoch)[subset]
    # final 1/8 of 8 epochs = the last epoch: all data, unweighted
    assert torch.equal(out[-1][0], torch.arange(n)) and torch.equal(out[-1][1], torch.ones(n))
    assert [r.epoch for r in t.history] == list(range(epochs))
    # the ratio recorded is the share each pruning kept; the final epoch trains on all data
    assert [r.ratio for r in t.history] == [r.selected / n for r in t.history] and t.history[-1].ratio == 1.0


def test_class_weight_balances_imbalanced_classes():
    sizes = [1000, 300, 100]
    groups = imbalanced_groups(sizes, seed=1)
    n = groups.numel()
    cfg = SelectionConfig(method="class_weight", ratio={"kind": "fixed", "start": 0.05})  # k = 70
    t = new_selector(n, cfg, epochs=10, seed=0, groups=groups)
    assert not t.needs_scoring(0)
    counts = torch.zeros(3)
    for subset, _ in drive(t, range(10), lambda e: torch.ones(n)):
        assert subset.numel() == 70
        counts += torch.bincount(groups[subset], minlength=3)
    shares = counts / counts.sum()
    assert bool(((shares - 1 / 3).abs() < 0.06).all()), shares  # uniform: 0.71 / 0.21 / 0.07


def test_group_weight_shares_follow_weights():
    groups = imbalanced_groups([600, 250, 150], seed=2)
    n = groups.numel()
    cfg = SelectionConfig(method="group_weight", group_weights=[1, 2, 2], ratio={"kind": "fixed", "start": 0.1})
    t = new_selector(n, cfg, epochs=10, seed=0, groups=groups)
    counts = torch.zeros(3)
    for subset, _ in drive(t, range(10), lambda e: torch.ones(n)):
        counts += torch.bincount(groups[subset], minlength=3)
    shares = counts / counts.sum()
    assert torch.allclose(shares, torch.tensor([0.2, 0.4, 0.4]), atol=0.05), shares


def test_group_weight_budget_capped_by_positive_weights():
    groups = imbalanced_groups([50, 50], seed=3)
    cfg = SelectionConfig(method="group_weight", group_weights=[0, 1], ratio={"kind": "fixed", "start": 0.8})
    t = new_selector(100, cfg, epochs=2, groups=groups)
    subset = t.begin_epoch(0)
    assert subset.numel() == 50 and bool((groups[subset] == 1).all())


@pytest.mark.parametrize("slow", [0, 1])
def test_gradnorm_upweights_the_slowly_learning_group(slow):
    groups = imbalanced_groups([300, 300], seed=4)
    n = groups.numel()
    fast = 1 - slow

    def losses_fn(epoch):  # both groups start at loss 2; `slow` falls 10%/epoch, `fast` 50%
        rate = torch.where(groups == slow, 0.9, 0.5)
        return 2.0 * rate.pow(epoch) * (1 + 0.01 * torch.rand(n, generator=gen(epoch)))

    cfg = SelectionConfig(method="gradnorm", ratio={"kind": "fixed", "start": 0.3})
    epochs = 7
    t = new_selector(n, cfg, epochs=epochs, seed=0, groups=groups)
    assert t.needs_scoring(0)
    weights, counts = [], []
    for epoch in range(epochs):  # scoring pass at 0 (nothing scored yet), then the recorded losses
        subset = drive(t, [epoch], losses_fn)[0][0]
        weights.append(t._method.weights.clone())  # the GradNorm unit keeps its group weights
        counts.append(torch.bincount(groups[subset], minlength=2))
    # the selection at epoch e sees the losses of epoch e - 1: reference losses until epoch 1
    assert torch.allclose(weights[1], torch.ones(2, dtype=torch.float64), atol=1e-2)
    for e in range(2, epochs):
        assert weights[e][slow] > weights[e - 1][slow]  # keeps rising while the gap grows
        assert weights[e].sum() == pytest.approx(2.0)
    assert weights[-1][slow] > 1.5 * weights[-1][fast]
    late = sum(counts[-3:])
    assert late[slow] > 1.3 * late[fast]
    # at epoch 0 (the reference losses) the groups were still balanced
    assert abs(int(counts[0][0]) - int(counts[0][1])) < 0.25 * int(counts[0].sum())
