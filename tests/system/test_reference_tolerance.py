"""The reference runs' tolerance off the recording's CPU kernels (``shared_runs``) rejects a real change: digits-full
trained at 1.1x its learning rate (the drifts it accepts: tests/engine/test_reference_tolerance.py)."""

from __future__ import annotations

import pytest

from tests.helpers import shared_runs

LR_SCALE = 1.1


def test_the_tolerance_rejects_a_real_change(ray_cluster, tmp_path):
    """digits-full at 1.1x the learning rate: its subsets (none: full data) and counts are the
    record's, its losses are not, by more than the tolerance (the comparison forced to the
    off-machine one, so that it is tested on the recording's kernels too)."""
    from attent.tasks.registry import build_task

    cfg = shared_runs.reference_experiment("digits-full", tmp_path)
    assert cfg.train.lr is None  # the task's default
    lr = build_task(cfg.task, seed=cfg.seed).optimizer_spec().lr
    changed = shared_runs.reference_experiment(
        "digits-full", tmp_path, overrides={"name": "digits-full-lr", "train": {"lr": lr * LR_SCALE}}
    )
    run = shared_runs.train_run(changed, tmp_path / "read")
    assert run.subsets == shared_runs.recorded("digits-full")["subsets"]
    with pytest.raises(AssertionError, match="off-machine tolerance") as rejected:
        shared_runs.assert_reproduces("digits-full", run.epochs, run.subsets, exact=False)
    # rejected on a number that moved, not on the run's shape
    assert any(key in str(rejected.value) for key in ("train_loss", "eval_test_loss", "eval_test_accuracy"))
    print(f"lr x{LR_SCALE} rejected: {rejected.value}")
