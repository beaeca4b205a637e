"""The options beyond the paper (issue 20): cheaper scoring passes (a fraction of the samples due,
the agreement of training and scoring losses), an unbiased gradient (draws with known inclusion
probabilities, weighted k / (N pi)), annealing to all data, and picks within each class."""

from __future__ import annotations

import math

import pytest
import torch
from attent.selection.config import SelectionConfig
from attent.selection.methods import AtteNT, Pool, class_quotas
from attent.selection.plan import build_plan
from attent.selection.selector import Selector
from attent.selection.strategies import (
    inclusion_probabilities,
    rank_correlation,
    soft_logits,
    soft_weights,
    systematic_sample,
)

HALF = {"kind": "fixed", "start": 0.5}  # the pick tests give k themselves: any ratio


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- inclusion probabilities and the systematic draw ------------------------------------------------
def test_inclusion_probabilities_are_proportional_capped_at_one_and_sum_to_k():
    weights = torch.tensor([50.0, 1, 1, 1, 0.5, 0.25, 3, 0])
    pi = inclusion_probabilities(weights, 3)
    assert pi.sum().item() == pytest.approx(3.0)
    assert pi[0] == 1 and pi[-1] == 0 and (pi <= 1).all()
    free = (pi > 0) & (pi < 1)
    ratios = pi[free] / weights[free].double()
    assert torch.allclose(ratios, ratios[0].expand_as(ratios))  # one scale c for the uncapped
    with pytest.raises(ValueError, match="positive weights"):
        inclusion_probabilities(weights, 8)  # only 7 positive


def test_systematic_sample_draws_k_distinct_with_the_given_inclusion_probabilities():
    pi = inclusion_probabilities(torch.tensor([5.0, 1, 1, 1, 0.5, 0.25, 3]), 3)
    g, draws = gen(0), 20000
    counts = torch.zeros(pi.numel(), dtype=torch.float64)
    for _ in range(draws):
        subset = systematic_sample(pi, g)
        assert subset.numel() == 3 and subset.unique().numel() == 3
        assert torch.equal(subset, subset.sort().values)
        counts[subset] += 1
    standard_error = (pi * (1 - pi) / draws).sqrt().clamp_min(1e-12)
    assert ((counts / draws - pi).abs() <= 4 * standard_error + 1e-12).all()


# --- the unbiased gradient ----------------------------------------------------------------------
def reweighted_pick(config: SelectionConfig, losses: torch.Tensor, k: int, generator, groups=None):
    method = AtteNT(config, num_samples=losses.numel(), epochs=10, groups=groups, components=0)
    pool = Pool(losses, losses.unsqueeze(1), generator)
    return method.pick(pool, 0, k)


@pytest.mark.parametrize("stratify", [False, True])
def test_a_reweighted_soft_pick_gives_the_full_data_mean_in_expectation(stratify):
    """Monte Carlo on a fixed loss vector: the subset's weighted mean of any per-sample quantity
    (here a stand-in for per-sample gradients, correlated with the loss) is unbiased for the mean
    over all samples, although the pick strongly favours high losses."""
    n, k, draws = 60, 15, 6000
    losses = torch.rand(n, generator=gen(1)) * 4
    gradients = losses * 2 + torch.randn(n, generator=gen(2))
    groups = torch.arange(n) % 3
    cfg = SelectionConfig(
        strategy="soft", soft_logits="standardized", temperature=0.5, reweight=True, stratify=stratify, ratio=HALF
    )
    g = gen(3)
    estimates, picked_mean = [], []
    for _ in range(draws):
        pick = reweighted_pick(cfg, losses, k, g, groups)
        assert pick.subset.numel() == k
        estimates.append(float((pick.loss_weights[pick.subset] * gradients[pick.subset]).sum() / k))
        picked_mean.append(float(gradients[pick.subset].mean()))
    estimates = torch.tensor(estimates, dtype=torch.float64)
    error = estimates.std() / math.sqrt(draws)
    assert abs(estimates.mean() - gradients.mean()) < 4 * error
    # without the weights the same picks are biased towards the high-loss samples
    assert sum(picked_mean) / draws > gradients.mean() + 10 * error


def test_reweighting_random_subsets_changes_nothing_and_hard_is_refused():
    n, k = 40, 10
    pick = reweighted_pick(SelectionConfig(strategy="random", reweight=True, ratio=HALF), torch.rand(n), k, gen(0))
    assert torch.allclose(pick.loss_weights, torch.ones(n))  # k / (N * k/N)
    with pytest.raises(ValueError, match="reweight needs"):
        SelectionConfig(strategy="hard", reweight=True, ratio=HALF)


def test_reweighted_inclusion_follows_the_soft_weights():
    n, k = 30, 6
    losses = torch.linspace(0, 3, n)
    cfg = SelectionConfig(strategy="soft", soft_logits="standardized", temperature=1.0, reweight=True, ratio=HALF)
    pi = inclusion_probabilities(soft_weights(soft_logits(losses, "standardized"), 1.0), k)
    pick = reweighted_pick(cfg, losses, k, gen(5))
    assert torch.allclose(pick.loss_weights[pick.subset].double(), (k / (n * pi[pick.subset])).float().double())
    # a lower loss is drawn less often and so weighs more when drawn
    weights = pick.loss_weights[pick.subset]  # subset ascending = losses ascending here
    assert (weights[1:] <= weights[:-1]).all() and weights[0] > weights[-1]


# --- picks within each class --------------------------------------------------------------------
def test_quotas_share_k_by_class_size_and_sum_to_k():
    groups = torch.tensor([0] * 50 + [1] * 30 + [2] * 20)
    for k in (1, 7, 33, 100):
        quotas = class_quotas(groups, k)
        assert sum(q for _, q in quotas) == k
        for members, quota in quotas:
            assert abs(quota - k * members.numel() / 100) < 1


def test_a_stratified_hard_pick_takes_each_class_top_within_it():
    # class 0 holds every high loss: a plain hard pick takes only class 0; per class, each class
    # gets its share, the highest losses within it
    n = 30
    groups = torch.arange(n) % 3
    losses = torch.where(groups == 0, 10.0, 0.0) + torch.arange(n) / n
    plain = reweighted_pick(SelectionConfig(strategy="hard", ratio=HALF), losses, 9, gen(0))
    assert set(groups[plain.subset].tolist()) == {0}
    per_class = reweighted_pick(SelectionConfig(strategy="hard", stratify=True, ratio=HALF), losses, 9, gen(0), groups)
    for c in range(3):
        mine = per_class.subset[groups[per_class.subset] == c]
        members = (groups == c).nonzero().squeeze(1)
        assert torch.equal(mine, members[losses[members].argsort(descending=True)[:3]].sort().values)
    with pytest.raises(ValueError, match="one group label"):
        reweighted_pick(SelectionConfig(strategy="hard", stratify=True, ratio=HALF), losses, 9, gen(0))


# --- annealing ----------------------------------------------------------------------------------
def test_annealing_trains_the_final_share_on_all_data_without_scoring():
    n, epochs = 50, 16
    cfg = SelectionConfig(preset="vit", anneal=0.125)
    selector = Selector(range(n), selection=cfg, epochs=epochs, seed=0)
    scored = []

    def score_fn(epoch):
        def fn(indices):
            scored.append(epoch)
            yield indices, torch.rand(indices.numel(), generator=gen(epoch))

        return fn

    sizes = []
    for epoch in range(epochs):
        sizes.append(selector.begin_epoch(epoch, score_fn(epoch)).numel())
        selector.end_epoch()
    assert [p.all_data for p in build_plan(cfg, epochs)][13:] == [
        False,
        True,
        True,
    ]  # floor(0.875 * 16) = 14, InfoBatch's count
    assert sizes[14:] == [n, n] and all(size < n for size in sizes[:14])
    assert max(scored) < 14  # no scoring pass once annealing began
    assert torch.equal(selector.loss_weights, torch.ones(n))
    plain = SelectionConfig(preset="vit")
    assert build_plan(cfg, epochs).mean_ratio() > build_plan(plain, epochs).mean_ratio()
    assert [e for e, _ in build_plan(cfg, epochs).ratios()] == [
        e for e, _ in build_plan(plain, epochs).ratios() if e < 14
    ]


# --- cheaper scoring passes ---------------------------------------------------------------------
def test_a_rescore_fraction_scores_that_share_of_the_known_samples_and_every_new_one():
    n = 200
    cfg = SelectionConfig(preset="vit", rescore_fraction=0.25)
    selector = Selector(range(n), selection=cfg, epochs=10, seed=0)

    def due() -> torch.Tensor:  # the samples the next scoring pass would ask for
        return selector._policy.pass_indices(selector.scores, selector._trained, selector._generator)

    asked = []

    def partial_pass(indices):  # scores only the first 150
        asked.append(indices.numel())
        yield indices[:150], torch.rand(150, generator=gen(1))

    selector.begin_epoch(0, partial_pass)
    selector.end_epoch()
    assert asked == [n]  # nothing scored yet: all of them
    due_now = due()
    assert (due_now >= 150).sum() == 50  # the 50 never scored, always
    assert (due_now < 150).sum() == round(0.25 * 150)
    # resumable: the same generator state gives the same share
    state = selector.state_dict()
    again = Selector(range(n), selection=cfg, epochs=10, seed=0)
    again.load_state_dict(state)
    assert torch.equal(due(), again._policy.pass_indices(again.scores, again._trained, again._generator))


def test_score_agreement_compares_training_and_scoring_losses_of_the_samples_trained_on():
    n = 300
    truth = torch.rand(n, generator=gen(0))

    def run(training_losses: torch.Tensor) -> float:
        selector = Selector(range(n), selection=SelectionConfig(preset="vit"), epochs=6, seed=0)
        selector.begin_epoch(0, lambda idx: iter([(idx, truth[idx])]))
        selector.update(training_losses[selector.subset], selector.subset)  # the epoch's training forwards
        selector.end_epoch()
        selector.begin_epoch(1, lambda idx: iter([(idx, truth[idx])]))
        return selector.history[-1].score_agreement

    assert run(truth + 0.01 * torch.randn(n, generator=gen(1))) > 0.95
    assert abs(run(torch.rand(n, generator=gen(2)))) < 0.3
    assert math.isnan(rank_correlation(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.0])))
