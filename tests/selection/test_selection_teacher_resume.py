"""The Teacher's checkpoint/resume: a resumed run reproduces the uninterrupted one; what state_dict refuses."""

from __future__ import annotations

import math

import pytest
import torch
from attent.selection.config import SelectionConfig
from attent.selection.teacher import Teacher

from tests.helpers.teacher_learner import Learner

HARD_HALF = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5})

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


def run(teacher: Teacher, epochs: range) -> tuple[list, list]:
    learner = Learner(teacher)
    out = [learner.epoch(e) for e in epochs]
    return [s for s, _ in out], [w for _, w in out]


@pytest.mark.parametrize("cut", [2, 5])
@pytest.mark.parametrize("name", RESUME_CONFIGS)
def test_resume_reproduces_uninterrupted_run(name, cut, tmp_path):
    n, epochs = 200, 9
    cfg = SelectionConfig(**RESUME_CONFIGS[name])
    straight = Teacher(n, cfg, epochs=epochs, seed=11)
    subsets, weights = run(straight, range(epochs))

    first = Teacher(n, cfg, epochs=epochs, seed=11)
    head_subsets, _ = run(first, range(cut))
    path = tmp_path / "teacher.pt"
    torch.save(first.state_dict(), path)
    del first

    # a different constructor seed: everything must come from the checkpoint
    resumed = Teacher(n, cfg, epochs=epochs, seed=999)
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
    subsets, _ = run(Teacher(n, cfg, epochs=epochs, seed=11), range(epochs))
    first = Teacher(n, cfg, epochs=epochs, seed=11)
    run(first, range(cut))
    state = first.state_dict()
    state["generator"] = torch.Generator().manual_seed(999).get_state()
    resumed = Teacher(n, cfg, epochs=epochs, seed=11)
    resumed.load_state_dict(state)
    tail, _ = run(resumed, range(cut, epochs))
    assert any(not torch.equal(a, b) for a, b in zip(tail, subsets[cut:]))


def test_a_state_inside_an_epoch_keeps_its_unmerged_observations():
    """A rank's state inside an epoch carries its losses not merged yet; the teacher loaded from
    it merges them at the epoch's end as the uninterrupted one does."""
    t = Teacher(10, HARD_HALF, epochs=3)
    t.observe(torch.tensor([3]), torch.tensor([2.5]))
    loaded = Teacher(10, HARD_HALF, epochs=3)
    loaded.load_state_dict(t.state_dict())
    t.sync()
    loaded.sync()
    assert torch.equal(t.scores.nan_to_num(-1), loaded.scores.nan_to_num(-1)) and loaded.scores[3] == 2.5
    state = t.state_dict()
    assert state["scores"][3] == 2.5
    fresh = Teacher(10, HARD_HALF, epochs=3)
    fresh.load_state_dict(state)
    assert fresh.scores[3] == 2.5 and torch.isnan(fresh.scores[:3]).all()


def test_load_state_dict_rejects_other_dataset():
    state = Teacher(10, HARD_HALF, epochs=3).state_dict()
    with pytest.raises(ValueError, match="samples"):
        Teacher(11, HARD_HALF, epochs=3).load_state_dict(state)
