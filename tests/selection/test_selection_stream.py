"""Selection from a stream (``attent.StreamSelector``): from each pool of ceil(B / r) items the
model scores, Hard trains on the B of highest loss; pool sizes follow the ratio schedule by
progress (warm-up and anneal shares unscored); a run resumed mid-stream draws the uninterrupted
run's pools and picks; two ranks draw pools of one size and stop together; what cannot stream is
refused in one line."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attent.selection.config import SelectionConfig
from attent.selection.stream import STREAM_STATE_FORMAT, StreamSelector, pool_size

from tests.helpers.ranks import start_method

B = 8


class Stream(torch.utils.data.IterableDataset):
    """Items {"index": i, "x": x_i} with no length, as a streamed corpus gives them."""

    def __init__(self, count: int, offset: int = 0):
        self.count, self.offset = count, offset

    def __iter__(self):
        for i in range(self.offset, self.offset + self.count):
            yield {"index": torch.tensor(i), "x": torch.tensor([math.sin(i * 1.7), math.cos(i * 0.3)])}


class Learner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        torch.nn.init.constant_(self.layer.weight, 1.0)
        torch.nn.init.constant_(self.layer.bias, 0.0)


def per_sample_loss(model, batch):
    return (model.layer(batch["x"]).squeeze(1) - 0.2) ** 2


def selector(selection, batches=12, stream=None, **kwargs):
    return StreamSelector(
        stream if stream is not None else Stream(1000),
        selection=selection,
        batch_size=B,
        batches=batches,
        model=Learner(),
        loss_fn=per_sample_loss,
        **kwargs,
    )


def test_hard_trains_on_the_highest_loss_b_of_every_pool():
    pools = selector(SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.25}))
    items = list(Stream(1000))
    drawn = 0
    for batch in pools:
        pool = items[drawn : drawn + 32]  # ceil(8 / 0.25)
        drawn += 32
        losses = per_sample_loss(pools.model, {"x": torch.stack([item["x"] for item in pool])})
        highest = sorted(losses.topk(B).indices.tolist())
        assert batch["index"].tolist() == [pool[i]["index"].item() for i in highest]
    assert pools.step == 12 and pools.drawn == 12 * 32 and pools.samples_scored == 12 * 32 and pools.last_ratio == 0.25


def test_pool_sizes_follow_the_ratio_by_progress_with_unscored_warm_up_and_anneal():
    selection = SelectionConfig(
        strategy="hard", ratio={"kind": "incremental", "start": 0.2, "end": 0.8}, warmup_epochs=1, anneal=0.25
    )
    sizes = [pool_size(selection, B, step / 20, epochs=4) for step in range(20)]
    assert sizes[:5] == [B] * 5 and sizes[15:] == [B] * 5  # the first of 4 epochs; the final quarter
    assert sizes[5:15] == [math.ceil(B / (0.2 + 0.6 * step / 20)) for step in range(5, 15)]
    assert sizes[5] > sizes[14]  # the ratio grows: smaller pools
    pools = selector(selection, batches=20, epochs=4)
    assert sum(1 for _ in pools) == 20 and pools.drawn == sum(sizes)
    assert pools.samples_scored == sum(sizes[5:15])  # warm-up and anneal pools are not scored


@pytest.mark.parametrize("strategy", ["hard", "soft", "random"])
def test_a_run_resumed_mid_stream_trains_the_uninterrupted_runs_picks(strategy):
    selection = SelectionConfig(strategy=strategy, ratio={"kind": "incremental", "start": 0.3, "end": 0.9})
    straight = [batch["index"].tolist() for batch in selector(selection, seed=4)]
    first = selector(selection, seed=4)
    head = [batch["index"].tolist() for _, batch in zip(range(5), first)]
    resumed = selector(selection, seed=99)  # the state carries the generator, not the seed
    resumed.load_state_dict(first.state_dict())
    assert head + [batch["index"].tolist() for batch in resumed] == straight
    assert len(straight) == 12 and len({i for b in straight for i in b}) == 12 * B  # no item twice


def test_full_data_trains_every_item_in_order_without_scoring():
    pools = StreamSelector(Stream(100), selection=SelectionConfig(method="full"), batch_size=B, batches=5)
    assert [b["index"].tolist() for b in pools] == [list(range(i * B, (i + 1) * B)) for i in range(5)]
    assert pools.samples_scored == 0


def test_a_short_stream_ends_the_run():
    pools = selector(SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5}), stream=Stream(70))
    assert sum(1 for _ in pools) == 4  # 70 items: four pools of 16, the fifth short


def _rank_run(rank: int, world: int, store_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:  # rank 1's shard holds fewer items: both ranks stop at the pool it cannot fill
        stream = Stream(100 if rank == 0 else 40, offset=1000 * rank)
        pools = selector(
            SelectionConfig(strategy="soft", ratio={"kind": "fixed", "start": 0.5}), batches=10, stream=stream
        )
        batches = [batch["index"].tolist() for batch in pools]
        out = {"batches": len(batches), "scored": pools.samples_scored, "first": batches[0]}
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_ranks_draw_pools_of_one_size_and_stop_together(tmp_path):
    mp.start_processes(
        _rank_run, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True, start_method=start_method()
    )
    results = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert [r["batches"] for r in results] == [2, 2]  # rank 1: 40 items, two pools of 16
    assert [r["scored"] for r in results] == [32, 32]  # equal forwards on every rank
    assert [i % 1000 for i in results[0]["first"]] != [i % 1000 for i in results[1]["first"]]  # own draws


def test_what_a_stream_cannot_follow_is_refused_in_one_line():
    with pytest.raises(ValueError, match="method infobatch needs a training set"):
        selector(SelectionConfig(method="infobatch"))
    with pytest.raises(ValueError, match="stratify needs the whole training set"):
        selector(SelectionConfig(strategy="hard", ratio={"start": 0.5}, stratify=True))
    with pytest.raises(ValueError, match="pass model= and loss_fn="):
        StreamSelector(Stream(10), selection=SelectionConfig(preset="llm"), batch_size=B, batches=2)
    with pytest.raises(ValueError, match=f"format {STREAM_STATE_FORMAT}"):
        selector(SelectionConfig(preset="llm")).load_state_dict({"step": 3})
    with pytest.raises(ValueError, match="start the run afresh"):  # format 1 held no passes ended
        selector(SelectionConfig(preset="llm")).load_state_dict({"format": 1, "step": 3, "drawn": 24})


def test_a_nan_in_a_pool_stops_the_run_or_is_ranked_last():
    def nan_at(model, batch):
        losses = per_sample_loss(model, batch)
        return torch.where(batch["index"] == 6, torch.tensor(math.nan), losses)  # 6: picked when finite

    selection = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5})
    pools = StreamSelector(Stream(100), selection=selection, batch_size=B, batches=3, model=Learner(), loss_fn=nan_at)
    with pytest.raises(ValueError, match=r"non-finite loss in the pool of batch 1 for its items \[6\]"):
        next(iter(pools))
    skip = selection.model_copy(update={"nonfinite": "skip"})
    pools = StreamSelector(Stream(100), selection=skip, batch_size=B, batches=3, model=Learner(), loss_fn=nan_at)
    first = next(iter(pools))["index"].tolist()
    assert 6 not in first and len(first) == B


@pytest.mark.parametrize("nonfinite", ["raise", "skip"])
def test_a_nonfinite_training_loss_stops_the_step_or_skips_it(nonfinite):
    """The training losses recorded since the last check (an optimiser step's, accumulated batches included)."""
    pools = selector(SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5}, nonfinite=nonfinite))
    batches = iter(pools)
    next(batches)
    pools.record_loss(torch.tensor(0.5))
    assert pools.step_finite() and pools.step_finite()  # nothing recorded since: finite
    next(batches)
    pools.record_loss(torch.tensor(math.nan))
    pools.record_loss(torch.tensor(0.5))
    if nonfinite == "skip":
        assert not pools.step_finite()
    else:
        with pytest.raises(ValueError, match="^non-finite loss at the optimiser step after training batch 2 of the"):
            pools.step_finite()
    pools.record_loss(torch.tensor([0.5, 0.25]))
    assert pools.step_finite()  # the next step's own losses


def test_random_draws_its_pools_picks_without_scoring_them():
    selection = SelectionConfig(method="attent", strategy="random", ratio={"start": 0.25})
    scored = []
    pools = StreamSelector(
        Stream(100), selection=selection, batch_size=B, batches=3, model=Learner(),
        loss_fn=lambda model, batch: scored.append(1) or torch.zeros(len(batch["x"])),
    )  # fmt: skip
    batches = list(pools)
    assert len(batches) == 3 and all(len(batch["x"]) == B for batch in batches)
    assert scored == [] and pools.samples_scored == 0 and pools.drawn == 3 * 4 * B
