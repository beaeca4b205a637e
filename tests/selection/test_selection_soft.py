"""Soft selection's logits, the hardness of a pick, independent random streams, and InfoBatch's
pruning rule (issue 19)."""

import math

import pytest
import torch
from attent.selection.baselines import infobatch_prune_for_budget
from attent.selection.config import SelectionConfig
from attent.selection.methods import InfoBatch, Pool, stream_seed
from attent.selection.plan import build_plan
from attent.selection.schedules import budget
from attent.selection.selector import Selector
from attent.selection.strategies import hardness, overlap, select, soft_logits


def losses(n=400, seed=0):
    return torch.rand(n, generator=torch.Generator().manual_seed(seed)) * 0.3 + 2.0


def soft_pick(scores, kind, temperature, seed=1, k=100):
    return select(
        soft_logits(scores, kind), k, "soft", temperature=temperature, generator=torch.Generator().manual_seed(seed)
    )


def test_standardized_logits_ignore_an_affine_rescaling_of_the_losses():
    scores = losses()
    for kind_scale, shift in ((10.0, -3.0), (0.01, 5.0)):
        assert torch.equal(
            soft_pick(scores, "standardized", 0.5), soft_pick(scores * kind_scale + shift, "standardized", 0.5)
        )
    # raw logits do depend on the scale: T is in the losses' own units
    assert not torch.equal(soft_pick(scores, "raw", 0.5), soft_pick(scores * 100, "raw", 0.5))


@pytest.mark.parametrize("kind", ["raw", "standardized", "log"])
def test_tiny_temperature_gives_hard_and_huge_gives_random(kind):
    scores = losses()
    k = 100
    hard = select(scores, k, "hard")
    assert torch.equal(soft_pick(scores, kind, 1e-9, k=k), hard)
    assert hardness(soft_pick(scores, kind, 1e-9, k=k), scores) == 1.0
    # T -> inf: the draw no longer depends on the scores, hardness about 0 like uniform picks
    draws = [hardness(soft_pick(scores, kind, 1e9, seed=s, k=k), scores) for s in range(40)]
    assert abs(sum(draws) / len(draws)) < 0.05


def test_log_logits_draw_proportionally_to_a_power_of_the_loss():
    # two samples, losses 1 and 3, T = 1: the first single draw picks the larger with p = 3/4
    scores = torch.tensor([1.0, 3.0])
    picks = [int(soft_pick(scores, "log", 1.0, seed=s, k=1)) for s in range(4000)]
    assert abs(sum(picks) / len(picks) - 0.75) < 0.03
    with pytest.raises(ValueError, match="non-negative"):
        soft_logits(torch.tensor([-1.0, 2.0]), "log")


def test_hardness_spans_uniform_to_hard_with_temperature():
    scores = losses()
    values = [
        sum(hardness(soft_pick(scores, "standardized", t, seed=s), scores) for s in range(10)) / 10
        for t in (0.05, 0.5, 5.0)
    ]
    assert values[0] > values[1] > values[2]
    assert values[0] > 0.8 and values[2] < 0.2
    assert math.isnan(hardness(torch.arange(400), scores))


def test_overlap_of_consecutive_picks():
    assert overlap(torch.tensor([0, 1, 2, 3]), torch.tensor([2, 3, 4]), 10) == 0.5
    assert math.isnan(overlap(torch.tensor([0]), None, 10))


def picked(strategy, seed=3, n=400, **extra) -> Selector:
    """A Selector after its first pick, from the scores ``losses(n)`` (a scoring pass's where one is due)."""
    cfg = SelectionConfig(
        method="attent", strategy=strategy, ratio={"kind": "fixed", "start": 0.3}, temperature=1.0, **extra
    )
    s = Selector(range(n), selection=cfg, epochs=4, seed=seed)
    s.begin_epoch(0, score_fn=lambda idx: iter([(idx, losses(n)[idx])]))
    return s


def test_soft_and_random_of_one_seed_draw_from_independent_streams():
    # with near-equal raw losses Soft is close to uniform; a shared stream made it ~90 % Random's pick
    soft, random = picked("soft").subset, picked("random").subset
    assert overlap(soft, random, 400) < 0.5
    assert stream_seed(3, "attent", "soft") != stream_seed(3, "attent", "random")
    assert torch.equal(picked("soft").subset, soft)  # still reproducible


def test_the_selector_records_hardness_and_overlap_per_reselection():
    t = picked("hard")
    assert torch.equal(t.scores, losses(400))
    assert t.history[-1].hardness == 1.0 and math.isnan(t.history[-1].overlap)
    t.end_epoch()
    t.begin_epoch(1, score_fn=lambda idx: iter(()))
    assert t.history[-1].overlap == 1.0  # same scores, same top-k
    assert "hardness" in t.history[-1].summary()


@pytest.mark.parametrize("epochs, final, pruned", [(10, 0.125, 8), (8, 0.125, 7), (40, 0.125, 35), (10, 0.0, 10)])
def test_infobatch_prunes_for_floor_of_delta_times_epochs(epochs, final, pruned):
    plan = build_plan(SelectionConfig(method="infobatch", infobatch_final=final), epochs)
    assert sum(p.selects for p in plan) == pruned
    method = InfoBatch(
        SelectionConfig(method="infobatch", infobatch_final=final),
        num_samples=50,
        epochs=epochs,
        groups=None,
        components=0,
    )
    pool = Pool(losses(50), torch.zeros(50, 1), torch.Generator().manual_seed(0))
    kept = [method.pick(pool, e, None).subset.numel() if p.selects else 50 for e, p in enumerate(plan)]
    assert all(k < 50 for k in kept[:pruned]) and all(k == 50 for k in kept[pruned:])
    assert [p.selects for p in plan] == [e < pruned for e in range(epochs)]


def test_infobatch_prune_for_a_budget_reproduces_that_budget():
    epochs, final, prune = 20, 0.125, 0.5
    below = 0.6  # share of below-mean samples in each pruning epoch
    plan = build_plan(SelectionConfig(method="infobatch", infobatch_final=final), epochs)
    pruning = sum(p.selects for p in plan)
    assert pruning == 17  # floor(0.875 * 20)
    kept = [1.0] + [1 - prune * below] * (pruning - 1) + [1.0] * (epochs - pruning)
    wanted = infobatch_prune_for_budget(0.8, kept, prune, plan)
    mean_kept = (1 + (pruning - 1) * (1 - wanted * below) + (epochs - pruning)) / epochs
    assert mean_kept == pytest.approx(0.8)
    assert infobatch_prune_for_budget(0.1, kept, prune, plan) == 0.99  # below its floor: capped
    assert budget(100, 0.3) == 30


def test_llm_variant_can_rescore_the_left_out_pool_before_each_reselection():
    """selection.rescore + rescore_stale on the LLM variant: the samples left out of the 70 % are
    scored afresh (forward only) before each re-selection; the trained ones keep their training loss."""
    n = 20
    cfg = SelectionConfig(preset="llm", rescore=True, rescore_stale=True)
    t = Selector(range(n), selection=cfg, epochs=4, seed=0)
    asked = []

    def score_fn(indices):
        asked.append(indices.tolist())
        yield indices, torch.full((indices.numel(),), 9.0)  # fresh losses, higher than all

    t.begin_epoch(0, score_fn)  # warm-up epoch on all data: nothing to score
    t.update(losses(n), torch.arange(n))
    t.end_epoch()
    t.begin_epoch(1, score_fn)  # first re-selection: every sample was just trained on
    assert asked == [[]] and t.subset.numel() == 14
    left_out = sorted(set(range(n)) - set(t.subset.tolist()))
    t.update(losses(14, seed=1), t.subset)
    t.end_epoch()
    t.begin_epoch(2, score_fn)
    assert asked[-1] == left_out  # only the 6 left out are re-scored
    assert set(left_out) <= set(t.subset.tolist())  # and, scored higher, they are picked
