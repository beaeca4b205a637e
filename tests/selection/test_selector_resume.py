"""The Selector's selection state across checkpoint/resume: a resumed run reproduces the uninterrupted one; what
load_state_dict refuses."""

from __future__ import annotations

import math

import pytest
import torch
from attent.selection.config import SelectionConfig
from attent.selection.selector import Selector

from tests.helpers.selector_learner import Learner

HARD_HALF = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5})
# the same after a warm-up epoch on all data: epoch 0 records training losses with no scoring pass due
WARM_HALF = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5}, warmup_epochs=1)


def new_selector(n: int, cfg: SelectionConfig, epochs: int, seed: int = 0) -> Selector:
    return Selector(range(n), selection=cfg, epochs=epochs, seed=seed)


# --- resume ------------------------------------------------------------------------------------------
RESUME_CONFIGS = {
    "hard": dict(strategy="hard", ratio={"kind": "fixed", "start": 0.5}),
    "soft": dict(
        strategy="soft",
        ratio={"kind": "cosine"},
        temperature=0.5,
        interval={"kind": "incremental", "start": 1, "end": 3},
    ),
    "random": dict(strategy="random", ratio={"kind": "incremental"}),
    "infobatch": dict(method="infobatch", infobatch_prune=0.6),
    "vit": dict(preset="vit"),
    "llm": dict(preset="llm"),
}


def comparable(history) -> list[dict]:
    """Record summaries without wall-clock time, NaN made comparable."""
    return [
        {
            key: ("nan" if isinstance(v, float) and math.isnan(v) else v)
            for key, v in r.summary().items()
            if key != "seconds"
        }
        for r in history
    ]


def run(selector: Selector, epochs: range) -> tuple[list, list]:
    learner = Learner(selector)
    out = [learner.epoch(e) for e in epochs]
    return [s for s, _ in out], [w for _, w in out]


@pytest.mark.parametrize("cut", [2, 5])
@pytest.mark.parametrize("name", RESUME_CONFIGS)
def test_resume_reproduces_uninterrupted_run(name, cut, tmp_path):
    n, epochs = 200, 9
    cfg = SelectionConfig(**RESUME_CONFIGS[name])
    straight = new_selector(n, cfg, epochs=epochs, seed=11)
    subsets, weights = run(straight, range(epochs))

    first = new_selector(n, cfg, epochs=epochs, seed=11)
    head_subsets, _ = run(first, range(cut))
    path = tmp_path / "selector.pt"
    torch.save(first.state_dict(), path)
    del first

    # a different constructor seed: everything must come from the checkpoint
    resumed = new_selector(n, cfg, epochs=epochs, seed=999)
    resumed.load_state_dict(torch.load(path))
    tail_subsets, tail_weights = run(resumed, range(cut, epochs))

    for a, b in zip(head_subsets + tail_subsets, subsets):
        assert torch.equal(a, b)
    for a, b in zip(tail_weights, weights[cut:]):
        assert torch.equal(a, b)
    torch.testing.assert_close(resumed.scores, straight.scores, rtol=0, atol=0, equal_nan=True)  # NaN: never seen
    assert comparable(resumed.history) == comparable(straight.history)
    assert all(torch.equal(a.indices, b.indices) for a, b in zip(resumed.history, straight.history))
    assert resumed.epoch == straight.epoch
    # the run really re-selected after the cut, with the generator in play
    assert any(r.epoch >= cut for r in straight.history)


def test_resume_without_generator_state_would_differ(tmp_path):
    """Guards the resume test itself: dropping the generator state changes a soft run."""
    n, epochs, cut = 200, 6, 2
    cfg = SelectionConfig(**RESUME_CONFIGS["soft"])
    subsets, _ = run(new_selector(n, cfg, epochs=epochs, seed=11), range(epochs))
    first = new_selector(n, cfg, epochs=epochs, seed=11)
    run(first, range(cut))
    state = first.state_dict()
    state["generator"] = torch.Generator().manual_seed(999).get_state()
    resumed = new_selector(n, cfg, epochs=epochs, seed=11)
    resumed.load_state_dict(state)
    tail, _ = run(resumed, range(cut, epochs))
    assert any(not torch.equal(a, b) for a, b in zip(tail, subsets[cut:]))


def test_a_state_inside_an_epoch_keeps_its_unmerged_observations():
    """A rank's state inside an epoch carries its losses not merged yet; the selector loaded from
    it merges them at the epoch's end as the uninterrupted one does."""
    s = new_selector(10, WARM_HALF, epochs=3)
    s.begin_epoch(0)
    s.update(torch.tensor([2.5]), torch.tensor([3]))
    loaded = new_selector(10, WARM_HALF, epochs=3)
    loaded.load_state_dict(s.state_dict())
    assert loaded.in_epoch and torch.isnan(loaded.scores).all()  # not merged yet
    s.end_epoch()
    loaded.end_epoch()
    assert torch.equal(s.scores.nan_to_num(-1), loaded.scores.nan_to_num(-1)) and loaded.scores[3] == 2.5
    state = s.state_dict()
    assert state["scores"][3] == 2.5
    fresh = new_selector(10, WARM_HALF, epochs=3)
    fresh.load_state_dict(state)
    assert fresh.scores[3] == 2.5 and torch.isnan(fresh.scores[:3]).all()


def test_load_state_dict_rejects_other_dataset():
    state = new_selector(10, HARD_HALF, epochs=3).state_dict()
    with pytest.raises(ValueError, match="samples"):
        new_selector(11, HARD_HALF, epochs=3).load_state_dict(state)
