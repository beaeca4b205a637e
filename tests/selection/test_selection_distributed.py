"""Multi-rank behaviour: the all-gathered score table (two real gloo processes), sharding of the
selected subset across ranks, and the SubsetSampler."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attent.selection.config import SelectionConfig
from attent.selection.distributed import all_gather_observations, is_distributed
from attent.selection.sampler import SubsetSampler, shard_indices
from attent.selection.selector import Selector
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from tests.helpers.ranks import start_method

N, EPOCHS = 101, 5


def losses_at(epoch: int) -> torch.Tensor:
    return torch.rand(N, generator=torch.Generator().manual_seed(500 + epoch)) * 3.0


CONFIGS = {
    "vit": dict(preset="vit"),
    "hard": dict(strategy="hard", ratio={"kind": "fixed", "start": 0.5}),
    "random": dict(strategy="random", ratio={"kind": "cosine"}),
    "infobatch": dict(method="infobatch"),
}


def new_selector(cfg: SelectionConfig, epochs: int, seed: int) -> Selector:
    """A Selector over N samples: rank and world size the process group's (rank 0 of 1 without one)."""
    return Selector(range(N), selection=cfg, epochs=epochs, seed=seed)


def train(selector: Selector) -> dict:
    """The engine's loop: each rank scores and trains on its own shard and records only it."""
    subsets, tables = [], []
    rank, world = selector.rank, selector.world_size
    for epoch in range(EPOCHS):

        def score_fn(indices, epoch=epoch):
            mine = shard_indices(indices, rank, world, shuffle=False)
            losses = losses_at(epoch)
            for idx in mine.split(8):
                yield idx, losses[idx]

        subsets.append(selector.begin_epoch(epoch, score_fn).clone())
        tables.append(selector.scores.clone())
        losses = losses_at(epoch)
        mine = torch.tensor(list(selector.sampler), dtype=torch.long)  # this rank's shard
        for idx in mine.split(5):
            selector.update(losses[idx])
        selector.end_epoch()
    return {
        "subsets": subsets,
        "tables": tables,
        "final": selector.scores.clone(),
        "loss_weights": selector.loss_weights.clone(),
    }


def _worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        assert is_distributed()
        # uneven halves: in a warm-up epoch on all data rank 0 records 60 samples, rank 1 the other 41
        mine = torch.arange(0, 60) if rank == 0 else torch.arange(60, N)
        cfg = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.3}, warmup_epochs=1)
        halved = new_selector(cfg, epochs=3, seed=0)
        losses = losses_at(0)
        halved.begin_epoch(0)
        halved.update(losses[mine], mine)
        halved.end_epoch()
        halves = {"table": halved.scores.clone(), "subset": halved.begin_epoch(1).clone()}
        # one rank with nothing to report
        idx, loss = all_gather_observations(
            torch.arange(3) if rank == 0 else torch.empty(0, dtype=torch.long),
            torch.ones(3) if rank == 0 else torch.empty(0),
        )
        halves["empty_gather"] = (idx, loss)
        runs = {
            name: train(new_selector(SelectionConfig(**cfg), epochs=EPOCHS, seed=3)) for name, cfg in CONFIGS.items()
        }
        torch.save({"halves": halves, "runs": runs}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gloo")
    mp.start_processes(
        _worker, args=(2, str(tmp / "store"), str(tmp)), nprocs=2, join=True, start_method=start_method()
    )
    return [torch.load(tmp / f"rank{r}.pt") for r in range(2)]


@pytest.mark.timeout(120)
def test_all_gather_gives_every_rank_the_full_table(two_ranks):
    r0, r1 = (r["halves"] for r in two_ranks)
    assert torch.equal(r0["table"], losses_at(0))  # both halves merged, no NaN left
    assert torch.equal(r1["table"], losses_at(0))
    expected = torch.sort(losses_at(0), descending=True, stable=True).indices[:30].sort().values
    assert torch.equal(r0["subset"], expected) and torch.equal(r1["subset"], expected)
    for idx, loss in (r0["empty_gather"], r1["empty_gather"]):
        assert idx.tolist() == [0, 1, 2] and loss.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CONFIGS)
def test_ranks_agree_and_match_a_single_process(two_ranks, name):
    a, b = (r["runs"][name] for r in two_ranks)
    single = train(new_selector(SelectionConfig(**CONFIGS[name]), epochs=EPOCHS, seed=3))
    for run in (a, b):
        for x, y in zip(run["subsets"], single["subsets"]):
            assert torch.equal(x, y)
        for x, y in zip(run["tables"], single["tables"]):
            assert torch.equal(x.nan_to_num(-1.0), y.nan_to_num(-1.0))
        assert torch.equal(run["loss_weights"], single["loss_weights"])
    # the subsets actually changed over the run (the comparison is not vacuous)
    assert len({tuple(s.tolist()) for s in a["subsets"]}) > 1


def _uneven_components_worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    """The llm preset with two loss components; rank 1's loop stops after one batch (as a loop
    stopped early, ``limit_train_batches`` or skipped non-finite losses leave ranks with different
    counts)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        import attent

        data = torch.utils.data.TensorDataset(torch.arange(20))
        selector = attent.Selector(data, selection=SelectionConfig(preset="llm"), epochs=3, components=("a", "b"))
        selector.begin_epoch(0)
        for number, (items,) in enumerate(selector.loader(batch_size=4)):
            if rank == 1 and number == 1:
                break
            losses = torch.stack([items.float(), 100 + items.float()], dim=1)  # [B, 2]
            selector.update(losses).mean()
        selector.end_epoch()
        torch.save(
            {"scores": selector.component_scores, "trained": selector.metrics()["samples_backpropagated"]},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_component_losses_of_uneven_ranks_are_gathered_by_rows(tmp_path):
    """Losses [n, C] of ranks holding different counts (rank 0: 10 samples, rank 1: 4) reach
    every rank's table: the padding is sliced by rows, not by elements (on 9171ffd: 'The expanded
    size of the tensor (4) must match the existing size (2)'), and what was trained is counted."""
    mp.start_processes(
        _uneven_components_worker,
        args=(2, str(tmp_path / "store"), str(tmp_path)),
        nprocs=2,
        join=True,
        start_method=start_method(),
    )
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert torch.equal(r0["scores"].nan_to_num(-1), r1["scores"].nan_to_num(-1))
    scored = (~torch.isnan(r0["scores"][:, 0])).nonzero().squeeze(1)
    assert scored.numel() == 14  # all 10 of rank 0's shard, the first batch of rank 1's
    assert torch.equal(r0["scores"][scored], torch.stack([scored.float(), 100 + scored.float()], dim=1))
    assert r0["trained"] == r1["trained"] == 14


def test_not_distributed_gather_is_identity():
    assert not is_distributed()
    idx, loss = all_gather_observations(torch.tensor([4, 2]), torch.tensor([0.5, 1.5]))
    assert idx.tolist() == [4, 2] and loss.tolist() == [0.5, 1.5]


# --- shard_indices -------------------------------------------------------------------------------------
@settings(deadline=None, max_examples=60)
@given(n=st.integers(1, 60), world=st.integers(1, 6), drop_last=st.booleans(), data=st.data())
def test_shards_match_distributed_sampler(n, world, drop_last, data):
    """Unshuffled, shard_indices maps DistributedSampler's positions onto the subset: same
    padding (wrap around) and the same trimming."""
    subset = torch.tensor(sorted(data.draw(st.sets(st.integers(0, 10_000), min_size=n, max_size=n))))
    for rank in range(world):
        ref = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last))
        got = shard_indices(subset, rank, world, shuffle=False, drop_last=drop_last)
        assert got.tolist() == subset[ref].tolist()


@settings(deadline=None, max_examples=60)
@given(
    n=st.integers(0, 60),
    world=st.integers(1, 6),
    epoch=st.integers(0, 50),
    seed=st.integers(0, 10),
    drop_last=st.booleans(),
)
def test_shards_are_disjoint_and_cover(n, world, epoch, seed, drop_last):
    subset = torch.arange(n) * 3 + 1
    shards = [shard_indices(subset, r, world, epoch=epoch, seed=seed, drop_last=drop_last) for r in range(world)]
    sizes = {s.numel() for s in shards}
    assert len(sizes) == 1  # equal counts per rank
    per_rank = sizes.pop()
    assert per_rank == (n // world if drop_last else math.ceil(n / world))
    everything = torch.cat(shards)
    assert set(everything.tolist()) <= set(subset.tolist())
    if drop_last:
        assert everything.unique().numel() == everything.numel()  # disjoint
    else:
        assert set(everything.tolist()) == set(subset.tolist())  # covers
        # only the padding repeats: exactly world * per_rank - n duplicates
        assert everything.numel() - everything.unique().numel() == world * per_rank - n
        if n % world == 0:
            assert everything.unique().numel() == everything.numel()


def test_shuffle_depends_on_epoch_and_seed_only():
    subset = torch.arange(200)
    a = shard_indices(subset, 0, 2, epoch=1, seed=0)
    assert torch.equal(a, shard_indices(subset, 0, 2, epoch=1, seed=0))
    assert not torch.equal(a, shard_indices(subset, 0, 2, epoch=2, seed=0))
    assert not torch.equal(a, shard_indices(subset, 0, 2, epoch=1, seed=1))
    assert not torch.equal(a, subset[0::2])  # actually shuffled
    assert torch.equal(shard_indices(subset, 0, 2, shuffle=False), subset[0::2])


@pytest.mark.parametrize("rank,world", [(2, 2), (-1, 2), (0, 0)])
def test_shard_rejects_bad_rank(rank, world):
    with pytest.raises(ValueError):
        shard_indices(torch.arange(10), rank, world)


# --- SubsetSampler --------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_len_matches_iteration(world, drop_last):
    source = SimpleNamespace(subset=torch.arange(0, 75, 3), epoch=0)  # 25 items: uneven shards
    samplers = [SubsetSampler(source, r, world, drop_last=drop_last) for r in range(world)]
    for s in samplers:
        assert len(s) == len(list(s))
    union = set().union(*(set(s) for s in samplers))
    if drop_last:
        assert union <= set(source.subset.tolist())
    else:
        assert union == set(source.subset.tolist())


def test_sampler_rereads_subset_and_shuffles_by_epoch():
    source = SimpleNamespace(subset=torch.arange(100), epoch=0)
    sampler = SubsetSampler(source, seed=5)
    first = list(sampler)
    assert sorted(first) == list(range(100)) and first != list(range(100))
    assert list(sampler) == first  # same epoch, same order
    source.epoch = 1
    second = list(sampler)
    assert sorted(second) == sorted(first) and second != first
    source.subset = torch.tensor([3, 7, 11])  # the selector re-selected
    assert sorted(sampler) == [3, 7, 11] and len(sampler) == 3
    assert list(SubsetSampler(source, shuffle=False)) == [3, 7, 11]


def test_sampler_follows_a_selector_through_a_dataloader():
    n = 64
    dataset = [{"index": i, "x": float(i)} for i in range(n)]
    selector = Selector(dataset, selection=SelectionConfig(preset="llm"), epochs=3)
    loader = DataLoader(dataset, batch_size=8, sampler=SubsetSampler(selector))
    for epoch in range(3):
        subset = selector.begin_epoch(epoch)
        seen = []
        for batch in loader:
            seen += batch["index"].tolist()
            selector.update(batch["x"] * (epoch + 1), batch["index"])
        selector.end_epoch()
        assert sorted(seen) == subset.tolist()
        assert len(seen) == (n if epoch == 0 else round(0.7 * n))
