"""The run's length and seed in AtteNTTrainer as Trainer reads them: ``max_steps`` runs whole epochs of the planned
subsets until that many optimiser steps, the last epoch cut short, with the LR schedule sized by it (and resumes to
the same plan); a fractional ``num_train_epochs`` trains its share of the last epoch; the selection's seed is
``args.seed`` as train() starts.

The plans are counted by hand on the tiny Llama's 40 samples in batches of 4 (an epoch on all data: 10 steps):
  llm  all data, then the hardest 70% (28 samples, 7 steps) every epoch
  vit  over E epochs: 20% at epoch 0 (8 samples, 2 steps), then 0.2 + 0.6 e/E at each re-selection e, kept for
       round(1 + 3 e/E) epochs. E = 3 holds 2 + 4 + 4 = 10 steps (16 samples at e = 1, kept to the end); E = 4
       holds 2 + 4 + 4 + 7 = 17 (14 samples at e = 1, kept 2 epochs, then 26 at e = 3)."""

from __future__ import annotations

import pytest
from attent.integrations.huggingface import AtteNTTrainer
from attent.selection.config import SelectionConfig

from tests.helpers.hf_tiny import (
    RecordingTrainer,
    collate,
    losses_of,
    samples,
    selection_rows,
    tiny_llama,
    training_args,
)

PLANS = {
    # (preset, run length): (trained per epoch, subset per epoch, optimiser steps, the last step's rate's
    # divisor: its epoch's steps x the epochs the run spans, as the linear schedule reads the epoch clock)
    ("llm", "max_steps=20"): ([40, 28, 12], [40, 28, 28], 20, 7 * (2 + 3 / 7)),
    ("vit", "max_steps=12"): ([8, 14, 14, 8], [8, 14, 14, 26], 12, 7 * (3 + 2 / 7)),
    ("llm", "num_train_epochs=2.5"): (
        [40, 28, 16],
        [40, 28, 28],
        21,
        7 * (2 + 4 / 7),
    ),  # 10 + 7 + (ceil(2.5 * 7) - 2 * 7)
    ("vit", "num_train_epochs=0.5"): ([4], [8], 1, 2 * 0.5),  # ceil(0.5 * 2) of epoch 0's 2 steps
}


def length(text: str) -> dict:
    name, value = text.split("=")
    return {name: float(value) if "." in value else int(value)}


@pytest.mark.parametrize("preset,run", PLANS)
def test_the_run_follows_the_hand_counted_plan(preset, run, tmp_path):
    trained, subsets, steps, divisor = PLANS[(preset, run)]
    trainer = RecordingTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path, lr_scheduler_type="linear", **{"num_train_epochs": 3, **length(run)}),
        train_dataset=samples(),
        data_collator=collate,
        selection=SelectionConfig(preset=preset),
    )
    trainer.train()
    assert [len(trainer.trained[epoch]) for epoch in sorted(trainer.trained)] == trained
    rows = selection_rows(trainer)
    assert [row["selected"] for row in rows] == subsets
    assert trainer.state.global_step == trainer.state.max_steps == steps
    # the stopped epoch counts only the samples it trained on
    assert rows[-1]["samples_backpropagated"] == sum(trained)
    rates = [row["learning_rate"] for row in trainer.state.log_history if "learning_rate" in row]
    assert rates[-1] == pytest.approx(1e-2 / divisor) and set(trainer.lr_scheduler.get_last_lr()) == {0.0}


@pytest.mark.parametrize("preset,steps,resume_at", [("llm", 20, 12), ("llm", 20, 18), ("vit", 12, 7), ("vit", 12, 11)])
def test_a_resumed_max_steps_run_continues_the_same_plan(preset, steps, resume_at, tmp_path):
    """From a checkpoint inside an epoch, or inside the last, cut-short one: the same subsets and losses."""

    def trainer(output_dir, **overrides):
        return AtteNTTrainer(
            model=tiny_llama(),
            args=training_args(output_dir, max_steps=steps, lr_scheduler_type="linear", **overrides),
            train_dataset=samples(),
            data_collator=collate,
            selection=SelectionConfig(preset=preset),
            seed=1,
        )

    whole = trainer(tmp_path / "whole", save_strategy="steps", save_steps=1)
    whole.train()
    ends = [row["step"] for row in selection_rows(whole)]
    assert resume_at not in ends and ends[-1] == steps
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{resume_at}"))
    after = selection_rows(whole, after=resume_at)
    assert [(r["subset_checksum"], r["samples_backpropagated"]) for r in selection_rows(resumed, after=resume_at)] == [
        (r["subset_checksum"], r["samples_backpropagated"]) for r in after
    ]
    assert losses_of(resumed, after=resume_at) == losses_of(whole, after=resume_at)
    assert resumed.state.global_step == steps


def checksums(tmp_path, name: str, args_seed: int, change_to: int | None = None, seed: int | None = None) -> list:
    trainer = AtteNTTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path / name, num_train_epochs=3, seed=args_seed),
        train_dataset=samples(),
        data_collator=collate,
        selection=SelectionConfig(preset="vit"),
        seed=seed,
    )
    if change_to is not None:
        trainer.args.seed = change_to  # as model_init and hyper-parameter searches set it, after construction
    trainer.train()
    want = seed if seed is not None else change_to if change_to is not None else args_seed
    assert trainer.selector.seed == trainer.selection_seed == want
    return [row["subset_checksum"] for row in selection_rows(trainer)]


def test_the_selection_seed_is_read_when_train_starts(tmp_path):
    changed = checksums(tmp_path, "changed", args_seed=0, change_to=7)
    assert changed == checksums(tmp_path, "built", args_seed=7)
    assert changed != checksums(tmp_path, "kept", args_seed=0)
    # an explicit seed= stays the selection's whatever args.seed becomes
    assert checksums(tmp_path, "explicit", args_seed=0, change_to=7, seed=0) == checksums(tmp_path, "again", 0)


@pytest.mark.parametrize("strategy", ["soft", "hard", "random"])
def test_a_cycles_run_resumed_inside_a_subset_epoch_makes_no_extra_pick(strategy, tmp_path):
    """The released code's reading (a warm-up epoch, 2 cycles of 3 epochs opening with 2 subset epochs, ratio
    0.2 -> 0.8) on 40 samples in batches of 4: step 11 lies inside the first subset epoch (epoch 1, 8 samples,
    steps 11-12). Resumed from checkpoint-11, the run makes the uninterrupted run's re-selections, not one more
    (on 9171ffd it re-selected at the epoch it resumed in), and trains the same samples to the same losses."""
    selection = SelectionConfig(
        strategy=strategy,
        ratio={"kind": "incremental", "start": 0.2, "end": 0.8},
        interval={"kind": "cycles", "cycles": 2, "start": 2, "end": 2},
        rescore=strategy != "random",
    )

    def trainer(output_dir, **overrides):
        return RecordingTrainer(
            model=tiny_llama(),
            args=training_args(output_dir, num_train_epochs=7, **overrides),
            train_dataset=samples(),
            data_collator=collate,
            selection=selection,
            seed=1,
        )

    whole = trainer(tmp_path / "whole", save_strategy="steps", save_steps=1)
    whole.train()
    assert [len(whole.trained[epoch]) for epoch in range(3)] == [40, 8, 8]  # step 11: the first subset epoch
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-11"))
    assert len(resumed.selector.history) == len(whole.selector.history)
    assert [(r.epoch, r.indices.tolist()) for r in resumed.selector.history] == [
        (r.epoch, r.indices.tolist()) for r in whole.selector.history
    ]
    after = selection_rows(whole, after=11)
    assert [r["subset_checksum"] for r in selection_rows(resumed, after=11)] == [r["subset_checksum"] for r in after]
    assert resumed.trained[1] == whole.trained[1][4:]  # the epoch's second step, after the checkpoint's first
    assert all(resumed.trained[e] == whole.trained[e] for e in range(2, 7))
    assert losses_of(resumed, after=11) == losses_of(whole, after=11)
