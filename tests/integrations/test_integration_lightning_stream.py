"""The Lightning stream callback (attent.AtteNTStreamCallback), with real Lightning and real torch:
each trained batch is the B highest-loss items of its pool under the model of its step (Lightning's
fetcher draws a pool a step ahead; the callback scores it at the step that trains it), the
selection is logged, a run resumed from a mid-run checkpoint trains the uninterrupted run's
batches, two DDP ranks draw from their own shares, and what it cannot use is refused in one line.

Item i of the stream carries ``index`` i, so a test reads from a batch which items it holds."""

from __future__ import annotations

import copy
import csv
import math
import os

import pytest
import torch

L = pytest.importorskip("lightning")

import attent  # noqa: E402
from attent.integrations.lightning_stream import AtteNTStreamCallback, keep_rows  # noqa: E402
from attent.selection import metric_names as names  # noqa: E402
from attent.selection.config import SelectionConfig  # noqa: E402
from attent.selection.stream import StreamSelector  # noqa: E402

from tests.helpers.lightning_sample import TRAINER, ddp_strategy  # noqa: E402

B = 4
HARD_HALF = dict(strategy="hard", ratio={"kind": "fixed", "start": 0.5})
FEATURES = torch.randn(400, 3, generator=torch.Generator().manual_seed(3))
TARGETS = torch.randn(400, generator=torch.Generator().manual_seed(4))
QUIET = {key: value for key, value in TRAINER.items() if key != "reload_dataloaders_every_n_epochs"}


class Stream(torch.utils.data.IterableDataset):
    """Items {"index", "x", "y"} in order, with no length."""

    def __init__(self, count: int = 400):
        self.count = count

    def __iter__(self):
        for i in range(self.count):
            yield {"index": torch.tensor(i), "x": FEATURES[i], "y": TARGETS[i]}


def per_sample_loss(module, batch) -> torch.Tensor:
    return (module.net(batch["x"]).squeeze(1) - batch["y"]) ** 2


class StreamModule(L.LightningModule):
    """A small MLP; notes each training step's items and loss, as training_step receives them."""

    def __init__(self, selection: AtteNTStreamCallback, lr: float = 0.3):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.selection, self.lr, self.trained, self.losses = selection, lr, [], []

    def train_dataloader(self):
        return self.selection.loader()

    def training_step(self, batch, batch_idx):
        loss = per_sample_loss(self, batch).mean()
        self.trained.append(batch["index"].tolist())
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class Weights(L.Callback):
    """The module's weights before each step."""

    def __init__(self):
        self.weights = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.weights.append(copy.deepcopy(module.net.state_dict()))


class Pools(Weights):
    """And each step's pool: the stream's items the callback chose from at it."""

    def __init__(self, selection: AtteNTStreamCallback):
        super().__init__()
        self.selection, self.pools, self._drawn = selection, [], 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        drawn = self.selection.selector.drawn
        self.pools.append(list(range(self._drawn, drawn)))
        self._drawn = drawn


def fit(
    selection: SelectionConfig, max_steps: int, *, callbacks=(), ckpt_path=None, epochs=1.0, collate_fn=None, **kwargs
):
    stream = AtteNTStreamCallback(
        Stream(),
        selection=selection,
        batch_size=B,
        epochs=epochs,
        seed=1,
        loss_fn=per_sample_loss,
        collate_fn=collate_fn,
    )
    module, pools = StreamModule(stream), Pools(stream)
    trainer = L.Trainer(**{**QUIET, **kwargs}, max_steps=max_steps, callbacks=[stream, pools, *callbacks])
    trainer.fit(module, ckpt_path=ckpt_path)
    return module, pools, trainer


def item_losses(module: StreamModule, weights: dict, items: list[int]) -> torch.Tensor:
    """Each item's loss under ``weights``, one item at a time."""
    net = copy.deepcopy(module.net)
    net.load_state_dict(weights)
    with torch.no_grad():
        return torch.stack([(net(FEATURES[i : i + 1]).squeeze() - TARGETS[i]) ** 2 for i in items])


def highest(pool: list[int], losses: torch.Tensor, count: int) -> list[int]:
    return sorted(pool[i] for i in losses.topk(count).indices.tolist())


# --- (a) each batch: the B highest-loss items of its pool, under the model of its step -----------------
def test_each_batch_is_the_highest_loss_half_of_its_pool_under_its_steps_model(tmp_path):
    module, pools, trainer = fit(
        SelectionConfig(**HARD_HALF), 8, logger=L.pytorch.loggers.CSVLogger(tmp_path), log_every_n_steps=1
    )
    assert trainer.global_step == 8 and len(module.trained) == len(pools.pools) == 8
    assert [pool[0] for pool in pools.pools] == [8 * step for step in range(8)]  # pools follow the stream
    stale = 0
    for step, (batch, pool) in enumerate(zip(module.trained, pools.pools)):
        assert len(pool) == 8 and len(batch) == B
        # batched vs one item at a time: a few ulp apart; the 4th and 5th highest losses of a pool at least
        # 0.1 apart (measured), so the picks agree exactly
        assert batch == highest(pool, item_losses(module, pools.weights[step], pool), B)
        if step:  # the weights a step before: what a loader that scored its pools would have used
            stale += batch != highest(pool, item_losses(module, pools.weights[step - 1], pool), B)
    assert stale > 0  # scored a step late, some batch would differ: the check tells the steps apart
    with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as f:
        rows = [row for row in csv.DictReader(f) if row.get(names.SELECTED_RATIO)]
    assert [float(row[names.SELECTED_RATIO]) for row in rows] == [0.5] * 8
    assert [float(row[names.SAMPLES_SCORED]) for row in rows] == [8.0 * (step + 1) for step in range(8)]


class LoaderScoredModule(StreamModule):
    """A StreamSelector itself as the train loader: it scores each pool as Lightning fetches it."""

    def train_dataloader(self):
        return self.selector


def test_a_stream_selector_as_the_train_loader_scores_each_pool_a_step_late():
    """Why the callback scores at on_train_batch_start: Lightning's fetcher reads a batch ahead."""
    module = LoaderScoredModule(None)
    module.selector = StreamSelector(
        Stream(), selection=SelectionConfig(**HARD_HALF), batch_size=B, batches=8, model=module, loss_fn=per_sample_loss
    )
    weights = Weights()
    L.Trainer(**QUIET, max_steps=8, callbacks=[weights]).fit(module)
    pools = [list(range(8 * step, 8 * (step + 1))) for step in range(8)]
    late = [
        batch == highest(pool, item_losses(module, weights.weights[step - 1], pool), B)
        for step, (batch, pool) in enumerate(zip(module.trained, pools))
        if step
    ]
    current = [
        batch == highest(pool, item_losses(module, weights.weights[step], pool), B)
        for step, (batch, pool) in enumerate(zip(module.trained, pools))
    ]
    assert all(late) and not all(current)  # measured: 7 of 7 the previous weights' picks, 2 of 8 the current's


def test_warm_up_pools_are_trained_as_they_come():
    """The llm preset over 3 epochs: the first third of the batches on pools of B, unscored, then 70 %."""
    module, pools, _ = fit(SelectionConfig(preset="llm"), 6, epochs=3, accumulate_grad_batches=2)
    assert [len(pool) for pool in pools.pools] == [B] * 4 + [math.ceil(B / 0.7)] * 8
    assert module.trained[:4] == [list(range(B * i, B * (i + 1))) for i in range(4)]
    assert all(len(batch) == B for batch in module.trained)


# --- (b) a run resumed from a mid-run checkpoint trains the uninterrupted run's batches -----------------
@pytest.mark.parametrize("strategy", ["hard", "soft"])
def test_a_resumed_run_trains_the_uninterrupted_runs_batches(strategy, tmp_path):
    """Lightning had drawn the pool of step 4 when it saved step 3's checkpoint: the state holds the
    three trained pools, not the one fetched ahead."""
    selection = SelectionConfig(strategy=strategy, ratio={"kind": "incremental", "start": 0.3, "end": 0.9})
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(tmp_path, "{step}", save_top_k=-1, every_n_train_steps=1)
    whole, pools, _ = fit(selection, 8, callbacks=[checkpoints], enable_checkpointing=True, default_root_dir=tmp_path)
    saved = torch.load(tmp_path / "step=3.ckpt", weights_only=False)["callbacks"]["AtteNTStreamCallback"]["ranks"]
    assert saved[0]["step"] == 3 and saved[0]["drawn"] == sum(len(pool) for pool in pools.pools[:3])
    resumed, _, trainer = fit(selection, 8, ckpt_path=tmp_path / "step=3.ckpt", default_root_dir=tmp_path)
    assert trainer.global_step == 8
    assert resumed.trained == whole.trained[3:]
    assert resumed.losses == whole.losses[3:]  # weights, optimiser and picks restored: the same, to the bit
    assert len({len(pool) for pool in pools.pools}) > 1  # pools shrink as the ratio grows


def test_a_stream_that_runs_dry_ends_the_run():
    stream = AtteNTStreamCallback(
        Stream(44), selection=SelectionConfig(**HARD_HALF), batch_size=B, loss_fn=per_sample_loss
    )
    module = StreamModule(stream)
    trainer = L.Trainer(**QUIET, max_steps=20, callbacks=[stream])
    trainer.fit(module)
    assert trainer.global_step == 5 and len(module.trained) == 5  # 44 items: five pools of 8


# --- two DDP ranks: each draws its pools from its own share, a checkpoint holds both places ----------------
class RankResult(L.Callback):
    def __init__(self, path: str):
        self.path = path

    def on_train_end(self, trainer, module):
        weights = [p.detach().clone() for p in module.net.parameters()]
        result = {"trained": module.trained, "weights": weights, "scored": module.selection.selector.samples_scored}
        torch.save(result, os.path.join(self.path, f"rank{trainer.global_rank}.pt"))


@pytest.mark.timeout(240)
def test_two_ddp_ranks_draw_from_their_own_shares(tmp_path):
    stream = AtteNTStreamCallback(
        Stream(), selection=SelectionConfig(**HARD_HALF), batch_size=B, loss_fn=per_sample_loss
    )
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(tmp_path, "{step}", save_top_k=-1, every_n_train_steps=2)
    trainer = L.Trainer(
        **{**QUIET, "devices": 2, "enable_checkpointing": True},
        strategy=ddp_strategy(),
        max_steps=4,
        callbacks=[stream, RankResult(str(tmp_path)), checkpoints],
    )
    trainer.fit(StreamModule(stream))
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    for rank, result in enumerate(ranks):
        assert len(result["trained"]) == 4 and result["scored"] == 4 * 8
        # every other item of the stream, pools of 8 of them: the first holds items rank, rank + 2, ... rank + 14
        assert all(i % 2 == rank for batch in result["trained"] for i in batch)
        assert all(16 * step <= min(b) and max(b) < 16 * (step + 1) for step, b in enumerate(result["trained"]))
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["weights"], ranks[1]["weights"], strict=True))
    saved = torch.load(tmp_path / "step=2.ckpt", weights_only=False)["callbacks"]["AtteNTStreamCallback"]["ranks"]
    assert [(state["step"], state["drawn"]) for state in saved] == [(2, 16), (2, 16)]  # each rank's own place


# --- (c) refused in one line -------------------------------------------------------------------------------
def as_tuple(items):
    return tuple(torch.utils.data.default_collate(items).values())


def test_what_the_callback_cannot_use_is_refused_in_one_line(tmp_path):
    refusals = []
    with pytest.raises(ValueError, match=r"a tuple cannot be changed in place: return a dict \(or list\) batch") as e:
        fit(SelectionConfig(**HARD_HALF), 2, collate_fn=as_tuple)
    refusals.append(e)
    with pytest.raises(ValueError, match=r"needs Trainer\(max_steps=S\)") as e:
        fit(SelectionConfig(**HARD_HALF), -1, max_epochs=1)
    refusals.append(e)
    with pytest.raises(ValueError, match="pass AtteNTStreamCallback\\(loss_fn=...\\)") as e:
        AtteNTStreamCallback(Stream(), selection=SelectionConfig(**HARD_HALF), batch_size=B)
    refusals.append(e)
    with pytest.raises(ValueError, match="method infobatch needs a training set it can index") as e:
        AtteNTStreamCallback(Stream(), selection=SelectionConfig(method="infobatch"), batch_size=B)
    refusals.append(e)
    fit(SelectionConfig(**HARD_HALF), 2, enable_checkpointing=True, default_root_dir=tmp_path / "a")
    (checkpoint,) = (tmp_path / "a").rglob("*.ckpt")
    state = torch.load(checkpoint, weights_only=False)
    del state["callbacks"]["AtteNTStreamCallback"]
    torch.save(state, tmp_path / "stateless.ckpt")
    with pytest.raises(RuntimeError, match="resume from a checkpoint saved with this AtteNTStreamCallback") as e:
        fit(SelectionConfig(**HARD_HALF), 4, ckpt_path=tmp_path / "stateless.ckpt")
    refusals.append(e)
    assert all("\n" not in str(error.value) for error in refusals)


def test_a_batch_keeps_the_picked_rows_of_each_field_in_place():
    listed = [torch.arange(6), {"ids": torch.arange(6) * 10, "text": list("abcdef")}, "shared"]
    same = listed
    keep_rows(listed, torch.tensor([1, 4]), 6)
    assert listed is same and listed[0].tolist() == [1, 4] and listed[1]["ids"].tolist() == [10, 40]
    assert listed[1]["text"] == ["b", "e"] and listed[2] == "shared"
    with pytest.raises(ValueError, match=r"field cu_seq_lens has shape \(3,\), the pool 6 items: .*no packing"):
        keep_rows({"cu_seq_lens": torch.tensor([0, 5, 9])}, torch.tensor([1, 4]), 6)


def test_the_callback_is_a_public_name():
    assert attent.AtteNTStreamCallback is AtteNTStreamCallback
    assert issubclass(AtteNTStreamCallback, L.pytorch.Callback)
