"""AtteNTTrainer and AtteNTSFTTrainer on an IterableDataset (issue 77): each training batch is the B
highest-loss items of its pool under the model of its step, the run takes max_steps steps and logs the
stream's selection, a run resumed from a checkpoint trains the uninterrupted run's batches, and what a
stream cannot follow is refused in one line.

The tiny Llama and its token data are the Hugging Face tests' (``tests/helpers/hf_tiny``): sample i's
first token is 50 + i, so a test reads from a batch which items it holds."""

from __future__ import annotations

import copy
import math
import os

import datasets
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from attent.integrations.huggingface import AtteNTTrainer
from attent.integrations.huggingface_stream import STREAM_STATE_FILE
from attent.selection.config import SelectionConfig
from torch.utils.data import IterableDataset

from tests.helpers.hf_tiny import FIRST_TOKEN, collate, losses_of, samples, tiny_llama, training_args
from tests.helpers.processes import free_port
from tests.helpers.ranks import start_method

ITEMS = samples(150)
HARD_HALF = dict(strategy="hard", ratio={"kind": "fixed", "start": 0.5})


class Stream(IterableDataset):
    """The items in order, with no length."""

    def __iter__(self):
        return iter(ITEMS)


def stream(source: str):
    return Stream() if source == "torch" else datasets.Dataset.from_list(ITEMS).to_iterable_dataset()


def ids(batch) -> list[int]:
    return (batch["input_ids"][:, 0] - FIRST_TOKEN).tolist()


def item_losses(model, items: list[dict]) -> torch.Tensor:
    """Each item's mean response-token loss, one unpadded item at a time, in eval mode."""
    was_training, losses = model.training, []
    model.eval()
    with torch.no_grad():
        for item in items:
            logits = model(input_ids=torch.tensor([item["input_ids"]])).logits[0]
            losses.append(F.cross_entropy(logits[:-1], torch.tensor(item["labels"][1:]), ignore_index=-100))
    model.train(was_training)
    return torch.stack(losses)


class StreamRecorder(AtteNTTrainer):
    """Notes each training batch's items, and (``check``: one batch per step) the items of the pool it
    was picked from (the stream's items drawn since the last batch) with their losses under the model
    as it stands at the batch's step and as it stood a step before."""

    def __init__(self, *args, check: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.check, self.trained, self.pools, self._drawn, self._before = check, [], [], 0, None

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.trained.append(ids(inputs))
        if self.check:
            drawn = self.stream_selector.drawn
            pool = list(range(self._drawn, drawn))
            before = None if self._before is None else item_losses(self._before, [ITEMS[i] for i in pool])
            self.pools.append((pool, item_losses(self.model, [ITEMS[i] for i in pool]), before))
            self._drawn, self._before = drawn, copy.deepcopy(self.model)
        return super().training_step(model, inputs, num_items_in_batch)


def highest(pool: list[int], losses: torch.Tensor, count: int) -> list[int]:
    return sorted(pool[i] for i in losses.topk(count).indices.tolist())


# --- (a) each batch: the B highest-loss items of its pool, under the model of its step ----------------------
@pytest.mark.parametrize("source", ["torch", "hf"])
def test_each_batch_is_the_highest_loss_half_of_its_pool(source, tmp_path):
    trainer = StreamRecorder(
        model=tiny_llama(),
        args=training_args(tmp_path, max_steps=8, learning_rate=3e-2),
        train_dataset=stream(source),
        data_collator=collate,
        selection=SelectionConfig(**HARD_HALF),
        check=True,
    )
    trainer.train()
    assert trainer.state.global_step == 8 and len(trainer.trained) == 8
    stale = 0
    for batch, (pool, losses, before) in zip(trainer.trained, trainer.pools):
        assert len(pool) == 8 and len(batch) == 4
        # the trainer's batched, padded scores vs one unpadded item at a time here: a few ulp apart, and
        # the 4th and 5th highest losses of a pool at least 1.1e-2 apart (measured), so the picks agree exactly
        assert sorted(batch) == highest(pool, losses, 4)
        stale += before is not None and sorted(batch) != highest(pool, before, 4)
    assert stale > 0  # scored a step late, some batch would differ: the check tells the steps apart
    assert trainer.pools[0][0] == list(range(8)) and trainer.pools[-1][0][-1] == 63  # pools follow the stream
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert [row["selected_ratio"] for row in rows] == [0.5] * 8
    assert [row["samples_scored"] for row in rows] == [8 * (step + 1) for step in range(8)]
    assert [row["epoch"] for row in rows] == [(step + 1) / 8 for step in range(8)]


# --- (a) two ranks: each draws its pools from its own share of the stream ----------------------------------
def _rank_worker(rank: int, world: int, port: int, out_dir: str, source: str) -> None:
    from accelerate.state import AcceleratorState

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    AcceleratorState._reset_state(reset_partial_state=True)  # a forked child: the parent's one-process state
    trainer = StreamRecorder(
        model=tiny_llama(),
        args=training_args(out_dir, max_steps=4),
        train_dataset=stream(source),
        data_collator=collate,
        selection=SelectionConfig(**HARD_HALF),
    )
    trainer.train()
    weights = trainer.model.model.layers[0].mlp.up_proj.weight.detach().clone()
    out = {"trained": trainer.trained, "steps": trainer.state.global_step, "weights": weights}
    torch.save({**out, "scored": trainer.stream_selector.samples_scored}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("source", ["torch", "hf"])
def test_two_ranks_draw_from_their_own_shares(source, tmp_path):
    mp.start_processes(
        _rank_worker, args=(2, free_port(), str(tmp_path), source), nprocs=2, join=True, start_method=start_method()
    )
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    for rank, result in enumerate(ranks):
        assert result["steps"] == 4 and result["scored"] == 4 * 8 and len(result["trained"]) == 4
        # every other item of the stream, pools of 8 of them: the first pool holds items rank, rank + 2, ... rank + 14
        assert all(i % 2 == rank for batch in result["trained"] for i in batch)
        assert all(
            rank + 16 * step <= min(batch) and max(batch) < rank + 16 * (step + 1)
            for step, batch in enumerate(result["trained"])
        )
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])  # DDP kept the replicas equal


# --- (b) a run resumed from a checkpoint trains the uninterrupted run's batches -----------------------------
@pytest.mark.parametrize("strategy,source", [("hard", "torch"), ("soft", "hf")])
def test_a_resumed_stream_run_trains_the_uninterrupted_runs_batches(strategy, source, tmp_path):
    """Trainer skips no batch itself (its skip of the epoch's first batches would draw and drop
    pools after the StreamSelector's own skip); model, optimiser and RNG restored by Trainer, the
    losses are equal to the last bit."""
    selection = SelectionConfig(strategy=strategy, ratio={"kind": "incremental", "start": 0.3, "end": 0.9})

    def trainer(output_dir, **overrides):
        args = training_args(
            output_dir, max_steps=6, gradient_accumulation_steps=2, per_device_train_batch_size=3, **overrides
        )
        return StreamRecorder(
            model=tiny_llama(), args=args, train_dataset=stream(source), data_collator=collate, selection=selection
        )

    whole = trainer(tmp_path / "whole", save_strategy="steps", save_steps=1)
    whole.train()
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-3"))
    assert resumed.state.global_step == whole.state.global_step == 6
    assert resumed.trained == whole.trained[6:]  # 3 steps of 2 batches each
    assert losses_of(resumed, after=3) == losses_of(whole, after=3) and len(losses_of(whole, after=3)) == 3
    rows = [
        [
            {k: row[k] for k in ("step", "epoch", "selected_ratio", "samples_scored")}
            for row in t.state.log_history
            if "loss" in row
        ]
        for t in (whole, resumed)
    ]
    assert rows[1] == rows[0]  # the checkpoint's rows, then the same ones: epoch and selection included
    assert len({row["selected_ratio"] for row in rows[0]}) > 1  # pools shrink as the ratio grows


# --- (c) AtteNTSFTTrainer on a streamed prompt-completion set -----------------------------------------------
@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from attent.tasks.llm.model import resolve_checkpoint
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_checkpoint("smollm2-135m-instruct"))


@pytest.mark.parametrize("padding_free", [False, True])
def test_sft_trainer_selects_from_a_streamed_prompt_completion_set(padding_free, tmp_path, smollm2_tokenizer):
    """Under the llm preset the first of num_train_epochs=3 is warm-up (pools of B), then 70 %:
    pools of ceil(4 / 0.7) = 6."""
    from attent.integrations.huggingface_trl import AtteNTSFTTrainer
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig

    from tests.helpers.hf_tiny import TINY_LLAMA, training_settings

    items = [
        {"prompt": f"Question {i}: what is {i} plus {i}?", "completion": f" {i} plus {i} is {2 * i}."}
        for i in range(60)
    ]
    config = SFTConfig(**training_settings(tmp_path, max_steps=6), bf16=False, max_length=64, padding_free=padding_free)
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=len(smollm2_tokenizer), **{**TINY_LLAMA, "max_position_embeddings": 128})
    )
    trainer = AtteNTSFTTrainer(
        model=model,
        args=config,
        train_dataset=datasets.Dataset.from_list(items).to_iterable_dataset(),
        processing_class=smollm2_tokenizer,
        selection=SelectionConfig(preset="llm"),
    )
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert trainer.state.global_step == 6 and len(rows) == 6
    assert [row["selected_ratio"] for row in rows] == [1.0, 1.0] + [4 / 6] * 4
    assert rows[-1]["samples_scored"] == 4 * 6 and all(math.isfinite(row["loss"]) for row in rows)
    assert "mean_token_accuracy" in rows[-1]  # TRL's own training step and metrics


# --- (d) refused in one line ---------------------------------------------------------------------------------
def stream_trainer(tmp_path, selection=None, **overrides):
    return AtteNTTrainer(
        model=tiny_llama(),
        args=training_args(tmp_path, **{"max_steps": 2, **overrides}),
        train_dataset=Stream(),
        data_collator=collate,
        selection=selection or SelectionConfig(**HARD_HALF),
    )


def test_what_a_stream_run_cannot_follow_is_refused_in_one_line(tmp_path):
    refusals = []
    with pytest.raises(ValueError, match="max_steps has to be specified") as error:  # Trainer's own, at construction
        stream_trainer(tmp_path, max_steps=-1)
    refusals.append(error)
    trainer = stream_trainer(tmp_path)
    trainer.args.max_steps = -1  # changed after construction: refused as train() starts
    with pytest.raises(ValueError, match="AtteNTTrainer: an IterableDataset has no length.*set max_steps") as error:
        trainer.train()
    refusals.append(error)
    with pytest.raises(
        ValueError, match="AtteNTTrainer: selection method infobatch needs a training set it can index"
    ) as error:
        stream_trainer(tmp_path, SelectionConfig(method="infobatch"))
    refusals.append(error)
    stream_trainer(tmp_path / "a", save_strategy="steps", save_steps=2).train()
    (tmp_path / "a" / "checkpoint-2" / STREAM_STATE_FILE.format(rank=0)).unlink()
    with pytest.raises(ValueError, match="holds no AtteNT stream state") as error:
        stream_trainer(tmp_path / "b").train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    refusals.append(error)
    assert all("\n" not in str(error.value) for error in refusals)
