"""The Selector's selection: presets, re-selection timing, scoring passes, bad input, non-finite losses, stale
re-scoring."""

from __future__ import annotations

import pytest
import torch
from attent.selection.config import SelectionConfig
from attent.selection.schedules import budget
from attent.selection.selector import Selector
from attent.selection.strategies import hardness

from tests.helpers.selector_learner import Learner, gen, losses_at

HARD_HALF = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5})
# the same after a warm-up epoch on all data: epoch 0 records training losses with no scoring pass due
WARM_HALF = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5}, warmup_epochs=1)


def new_selector(n: int, cfg: SelectionConfig, epochs: int, **kwargs) -> Selector:
    """A Selector over n samples (their items: the indices themselves)."""
    return Selector(range(n), selection=cfg, epochs=epochs, **kwargs)


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(scores, descending=True, stable=True).indices[:k].sort().values


# --- the llm preset ------------------------------------------------------------------------------
def test_llm_preset_first_epoch_all_data_then_top_70_percent():
    n = 100
    s = new_selector(n, SelectionConfig(preset="llm"), epochs=5, seed=0)
    assert not s.needs_scoring(0) and not s.plan[0].selects
    assert torch.equal(s.begin_epoch(0, None), torch.arange(n))  # no score_fn needed
    assert s.history == []
    l0 = losses_at(0, n)
    for idx in torch.randperm(n, generator=gen(1)).split(7):  # the epoch's own forward passes
        s.update(l0[idx], idx)
    s.end_epoch()
    assert torch.equal(s.scores, l0)

    assert s.plan[1].selects and not s.needs_scoring(1)
    subset = s.begin_epoch(1, None)  # still no scoring pass
    assert subset.numel() == 70
    assert torch.equal(subset, top_k(l0, 70))
    assert s.scores[subset].min() >= s.scores[~torch.isin(torch.arange(n), subset)].max()
    assert torch.equal(s.loss_weights, torch.ones(n))
    assert len(s.history) == 1 and s.history[0].epoch == 1 and s.history[0].ratio == 0.7
    assert s.history[0].selected == 70 and torch.equal(s.history[0].indices, subset)

    # epoch 1 trains on the subset only; epoch 2 selects from the merged table (fresh for the
    # subset, epoch-0 losses for the rest)
    l1 = losses_at(1, n)
    s.update(l1[subset], subset)
    s.end_epoch()
    expected_table = l0.clone()
    expected_table[subset] = l1[subset]
    assert torch.equal(s.scores, expected_table)
    assert torch.equal(s.begin_epoch(2, None), top_k(expected_table, 70))
    assert s.seconds["scoring"] == 0.0


def test_llm_preset_selects_every_epoch():
    s = new_selector(60, SelectionConfig(preset="llm"), epochs=6)
    learner = Learner(s)
    for epoch in range(6):
        learner.epoch(epoch, with_score_fn=False)
    assert [r.epoch for r in s.history] == [1, 2, 3, 4, 5]
    assert all(r.selected == 42 for r in s.history)
    assert learner.scored_at == []


def test_unscored_samples_force_a_scoring_pass():
    """A sample never observed (e.g. dropped by drop_last) triggers a scoring pass when a
    loss-driven selection is due, even for the llm preset."""
    n = 50
    s = new_selector(n, SelectionConfig(preset="llm"), epochs=3)
    s.begin_epoch(0)
    s.update(losses_at(0, n)[: n - 1], torch.arange(n - 1))
    s.end_epoch()
    assert s.needs_scoring(1)
    with pytest.raises(ValueError, match="scoring pass"):
        s.begin_epoch(1, None)


def test_never_scored_samples_rank_as_the_highest_loss():
    """A scoring pass that misses samples (e.g. a sharded pass with drop_last): the unscored
    ones count as the highest observed loss, so they are seen rather than starved."""
    n = 10
    s = new_selector(n, SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.3}), epochs=2)
    losses = torch.tensor([0.1, 0.9, 0.3, 0.2, 0.5, 0.4, 0.6, 0.0])

    def partial_pass(indices):
        yield torch.arange(8), losses

    subset = s.begin_epoch(0, partial_pass)
    assert torch.isnan(s.scores[8:]).all()
    assert subset.tolist() == [1, 8, 9]  # the top scored (0.9) ties with 8 and 9 at the max


# --- the vit preset --------------------------------------------------------------------------------
def test_vit_preset_schedule_and_scoring():
    n, epochs = 500, 11
    s = new_selector(n, SelectionConfig(preset="vit"), epochs=epochs, seed=1)
    assert s.needs_scoring(0)
    with pytest.raises(ValueError, match="scoring pass"):
        s.begin_epoch(0, None)

    s = new_selector(n, SelectionConfig(preset="vit"), epochs=epochs, seed=1)
    learner = Learner(s)
    subsets = [learner.epoch(e)[0] for e in range(epochs)]
    # interval I(p) = round(1 + 3p), p = e / 11: selections at 0, 1, 2 (I=2), 4 (I=2), 6 (I=3), 9
    expected_epochs = [0, 1, 2, 4, 6, 9]
    assert [r.epoch for r in s.history] == expected_epochs
    assert learner.scored_at == expected_epochs  # one scoring pass per re-selection
    assert s.history[0].ratio == pytest.approx(0.2)  # 20% at the first selection
    assert subsets[0].numel() == 100
    for r in s.history:
        assert r.ratio == pytest.approx(0.2 + 0.6 * r.epoch / epochs)  # progress = e / E
        assert r.selected == budget(n, r.ratio) == subsets[r.epoch].numel()
        assert r.strategy == "soft"
    for e in range(epochs):  # between re-selections the subset is kept
        if e not in expected_epochs:
            assert torch.equal(subsets[e], subsets[e - 1])


def test_vit_preset_is_soft_not_hard():
    # The preset draws from standardized losses at T = 4: a mild preference for high losses,
    # far from the top-k and measurably away from a uniform pick (measured hardness 0.04-0.10)
    n = 2000
    s = new_selector(n, SelectionConfig(preset="vit"), epochs=10, seed=2)
    subset = Learner(s).epoch(0)[0]
    losses = losses_at(0, n)  # uniform on [0, 5]
    assert 0.02 < hardness(subset, losses) < 0.3
    # a uniform pick of 400 has a mean within about +-0.2 of the whole set's (3 standard errors)
    assert losses[subset].mean() > losses.mean() + 0.15


def test_rescoring_uses_the_fresh_scoring_pass():
    """With T -> 0 the soft pick is the top-k of *this* epoch's scoring pass, not stale losses."""
    n = 300
    cfg = SelectionConfig(preset="vit", temperature=1e-6)
    s = new_selector(n, cfg, epochs=5, seed=0)
    learner = Learner(s)
    reselected = 0
    for epoch in range(5):
        subset, _ = learner.epoch(epoch)
        if epoch in [r.epoch for r in s.history]:
            assert torch.equal(subset, top_k(losses_at(epoch, n), subset.numel()))
            reselected += 1
    assert reselected >= 2


def test_warmup_and_fixed_interval():
    cfg = SelectionConfig(
        strategy="hard", ratio={"kind": "fixed", "start": 0.5}, interval={"kind": "fixed", "start": 3}, warmup_epochs=2
    )
    s = new_selector(40, cfg, epochs=10)
    learner = Learner(s)
    subsets = [learner.epoch(e)[0] for e in range(10)]
    assert [r.epoch for r in s.history] == [2, 5, 8]
    assert all(torch.equal(sub, torch.arange(40)) for sub in subsets[:2])
    assert learner.scored_at == []  # all samples observed during warm-up: no extra pass


def test_full_never_selects():
    s = new_selector(30, SelectionConfig(method="full"), epochs=5)
    learner = Learner(s)
    for e in range(5):
        assert not s.plan[e].selects and not s.needs_scoring(e)
        subset, weights = learner.epoch(e, with_score_fn=False)
        assert torch.equal(subset, torch.arange(30)) and torch.equal(weights, torch.ones(30))
    assert s.history == [] and s.subset.numel() / s.num_samples == 1.0
    assert s.metrics()["selected_ratio"] == 1.0


def test_random_strategy_needs_no_scores():
    cfg = SelectionConfig(strategy="random", ratio={"kind": "fixed", "start": 0.25})
    s = new_selector(80, cfg, epochs=3, seed=4)
    assert not s.needs_scoring(0)
    subsets = [Learner(s).epoch(e, with_score_fn=False)[0] for e in range(3)]
    assert all(sub.numel() == 20 for sub in subsets)
    assert not torch.equal(subsets[0], subsets[1])


def test_selection_record_summary():
    s = new_selector(100, SelectionConfig(preset="vit"), epochs=4)
    Learner(s).epoch(0)
    r = s.history[0]
    summary = r.summary()
    assert "indices" not in summary and summary["epoch"] == 0 and summary["selected"] == 20
    losses = losses_at(0, 100)
    assert summary["score_mean"] == pytest.approx(float(losses.mean()))
    assert summary["score_max"] == pytest.approx(float(losses.max()))
    assert summary["selected_score_mean"] == pytest.approx(float(losses[r.indices].mean()))
    assert summary["seconds"] >= 0 and s.seconds["scoring"] > 0


# --- bad input ---------------------------------------------------------------------------------------
def test_the_selector_rejects_bad_construction():
    with pytest.raises(ValueError, match="empty"):
        new_selector(0, HARD_HALF, epochs=3)
    with pytest.raises(ValueError):
        new_selector(10, HARD_HALF, epochs=0)
    with pytest.raises(ValueError, match="group label"):
        new_selector(10, SelectionConfig(method="class_weight", ratio={"start": 0.5}), epochs=3)
    with pytest.raises(ValueError, match="group label"):
        new_selector(10, SelectionConfig(method="gradnorm"), epochs=3, groups=torch.zeros(9, dtype=torch.long))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_loss_is_refused_at_the_merge(bad):
    """A loop that never calls step_finite: the epoch's merge, where the losses reach the CPU,
    refuses it (nothing in update waits on a GPU)."""
    s = new_selector(10, WARM_HALF, epochs=3)
    s.begin_epoch(0)
    losses = torch.ones(4)
    losses[2] = bad
    s.update(losses, torch.tensor([5, 6, 7, 8]))
    with pytest.raises(ValueError, match=r"non-finite .*\[7\]"):
        s.end_epoch()
    assert torch.isnan(s.scores).all()  # nothing recorded


def test_a_non_finite_loss_is_skipped_and_counted_with_nonfinite_skip():
    cfg = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5}, warmup_epochs=1, nonfinite="skip")
    s = new_selector(10, cfg, epochs=3)
    s.begin_epoch(0)
    s.update(torch.tensor([1.0, 2.0, float("nan"), float("inf")]), torch.tensor([5, 6, 7, 8]))
    s.end_epoch()
    assert s.scores[5:7].tolist() == [1.0, 2.0] and torch.isnan(s.scores[7:9]).all()
    assert s.metrics()["samples_nonfinite"] == 2
    with pytest.raises(ValueError, match="'raise' or 'skip'"):
        SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5}, nonfinite="ignore")


def test_step_finite_raises_at_the_step_of_a_nan_loss_under_the_default():
    s = new_selector(10, WARM_HALF, epochs=3)
    assert s.selection.nonfinite == "raise"
    s.begin_epoch(0)
    s.update(torch.ones(2), torch.tensor([0, 1]))
    assert s.step_finite() is True
    s.update(torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([2, 3, 4]))
    with pytest.raises(ValueError, match=r"optimiser step 2 of epoch 1 for samples \[3\]"):
        s.step_finite()
    with pytest.raises(ValueError, match=r"non-finite .*\[3\]"):  # the merge refuses it too
        s.end_epoch()


def test_step_finite_skips_the_step_of_a_nan_loss_with_nonfinite_skip():
    cfg = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5}, warmup_epochs=1, nonfinite="skip")
    s = new_selector(10, cfg, epochs=3)
    s.begin_epoch(0)
    s.update(torch.tensor([0.5, 1.5]), torch.tensor([0, 1]))
    assert s.step_finite() is True
    s.update(torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([2, 3, 4]))
    assert s.step_finite() is False  # the caller skips optimizer.step()
    s.update(torch.tensor([3.0]), torch.tensor([5]))
    assert s.step_finite() is True  # the flag is per step: the next finite step goes on
    s.end_epoch()
    assert s.scores[:3].tolist() == [0.5, 1.5, 1.0] and s.scores[4:6].tolist() == [2.0, 3.0]
    assert torch.isnan(s.scores[3]) and torch.isnan(s.scores[6:]).all()  # left out of the scores
    assert s.metrics()["samples_nonfinite"] == 1


def test_update_rejects_mismatched_lengths():
    s = new_selector(10, WARM_HALF, epochs=3)
    s.begin_epoch(0)
    with pytest.raises(ValueError):
        s.update(torch.ones(2), torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("bad_index", [-1, 10, 1000])
def test_update_rejects_indices_outside_the_dataset(bad_index):
    """Refused before the score table: a negative index at the epoch's merge, one past the end
    already in update (where it reads the sample's loss weight)."""
    s = new_selector(10, WARM_HALF, epochs=3)
    s.begin_epoch(0)
    with pytest.raises((ValueError, IndexError), match="indices|out of bounds"):
        s.update(torch.ones(2), torch.tensor([0, bad_index]))
        s.end_epoch()
    assert torch.isnan(s.scores).all()


def test_update_accepts_an_empty_batch():
    s = new_selector(10, WARM_HALF, epochs=3)
    s.begin_epoch(0)
    assert s.update(torch.empty(0), torch.empty(0, dtype=torch.long)).numel() == 0
    s.end_epoch()
    assert torch.isnan(s.scores).all()


def test_update_accepts_grad_tensors():
    s = new_selector(10, WARM_HALF, epochs=3)
    s.begin_epoch(0)
    losses = torch.arange(4.0, requires_grad=True) * 1.5
    trained = s.update(losses, torch.tensor([0, 1, 2, 3]))
    assert trained.requires_grad  # the graph goes on to the backward
    s.end_epoch()
    assert s.scores[:4].tolist() == [0.0, 1.5, 3.0, 4.5] and torch.isnan(s.scores[4:]).all()


# --- stale-only re-scoring (beyond the paper) -----------------------------------------------------
def test_stale_rescoring_scores_only_samples_not_trained_on_since_the_last_selection():
    """With rescore_stale, a scoring pass asks for the samples whose latest loss predates the
    current interval; the subset just trained on keeps its training-forward losses. The first
    pass scores everything (nothing is scored yet), and the selection then reads a table that is
    fresh for every sample, as a full pass would leave it."""
    n = 40
    config = SelectionConfig(preset="vit", interval={"kind": "fixed", "start": 2}, rescore_stale=True)
    s = new_selector(n, config, epochs=6, seed=0)
    asked: list[torch.Tensor] = []

    def score_fn(epoch):
        def fn(indices):
            asked.append(indices.clone())
            losses = losses_at(epoch, n)
            for idx in indices.split(16):
                yield idx, losses[idx]

        return fn

    trained = []
    for epoch in range(6):
        subset = s.begin_epoch(epoch, score_fn(epoch)).clone()
        losses = losses_at(epoch, n)
        s.update(losses[subset], subset)  # the epoch's training forwards
        s.end_epoch()
        trained.append(subset)
    assert len(asked) == 3  # selections at epochs 0, 2, 4
    assert torch.equal(asked[0], torch.arange(n))
    for pass_number, selection_epoch in ((1, 2), (2, 4)):
        since_selection = torch.cat(trained[selection_epoch - 2 : selection_epoch]).unique()
        stale = torch.ones(n, dtype=torch.bool)
        stale[since_selection] = False
        assert torch.equal(asked[pass_number], stale.nonzero().squeeze(1))
        assert 0 < asked[pass_number].numel() < n
    state = s.state_dict()  # a resumed selector asks for the same samples
    again = new_selector(n, config, epochs=6, seed=0)
    again.load_state_dict(state)
    assert torch.equal(
        again._policy.pass_indices(again.scores, again._trained, again._generator),
        s._policy.pass_indices(s.scores, s._trained, s._generator),
    )


def test_full_rescoring_asks_for_every_sample():
    s = new_selector(30, SelectionConfig(preset="vit"), epochs=4, seed=0)
    asked = []
    for epoch in range(4):

        def fn(indices, epoch=epoch):
            asked.append(indices.numel())
            yield indices, losses_at(epoch, 30)[indices]

        s.begin_epoch(epoch, fn)
        s.end_epoch()
    assert asked and set(asked) == {30}
