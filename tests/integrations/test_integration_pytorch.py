"""The plain-PyTorch wrapper (attent.Selector): it chooses what a Selector driven by hand chooses, ranks agree,
a resumed loop draws the same subsets, ``full`` is plain training, and planned_steps is what the
loader yields (``import attent`` itself: tests/test_attent_import.py). Items are synthetic: sample i
holds the number i, and its loss is a fixed table's entry i, so a wrong index in update() would
show in the Selector's score table (the loop and its data: tests/helpers/selector_loop.py)."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attent.selection.config import SelectionConfig
from attent.selection.strategies import subset_checksum
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.examples import assert_example_follows_the_vit_preset
from tests.helpers.ranks import start_method
from tests.helpers.selector_loop import (
    CONFIGS,
    EPOCHS,
    N,
    Selector,
    TableModel,
    dataset,
    loss_fn,
    losses_at,
    run_selector,
)


def run_reference_loop(config: SelectionConfig, seed: int) -> dict:
    """The README's hand-wired loop on a bare Selector (no model, no loader: a scoring function
    and explicit indices, the subset's batches in its own order), on the same losses."""
    selector = Selector(range(N), selection=config, epochs=EPOCHS, seed=seed)
    subsets = []
    for epoch in range(EPOCHS):

        def score_fn(indices, epoch=epoch):
            for idx in indices.split(16):
                yield idx, losses_at(epoch)[idx]

        subsets.append(selector.begin_epoch(epoch, score_fn).clone())
        for idx in selector.subset.split(8):
            selector.update(losses_at(epoch)[idx], idx)
        selector.end_epoch()
    return {"subsets": subsets, "table": selector.scores.clone()}


# --- (a) the wrapper chooses what the reference loop chooses -------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_selector_chooses_what_the_reference_loop_chooses(name):
    config = SelectionConfig(**CONFIGS[name])
    model = TableModel()
    got = run_selector(
        Selector(dataset(), selection=config, epochs=EPOCHS, seed=4, model=model, loss_fn=loss_fn), model, range(EPOCHS)
    )
    want = run_reference_loop(config, seed=4)
    assert got["checksums"] == [subset_checksum(s) for s in want["subsets"]]
    for a, b in zip(got["subsets"], want["subsets"]):
        assert torch.equal(a, b)
    # the scores landed on the right samples: update() knew which samples each batch held
    assert torch.equal(got["table"].nan_to_num(-1), want["table"].nan_to_num(-1))
    for subset, trained in zip(got["subsets"], got["trained"]):
        assert sorted(trained.tolist()) == subset.tolist()
    assert len({tuple(s.tolist()) for s in got["subsets"]}) > 1  # not vacuous


def test_scoring_pass_runs_without_grad_in_eval_mode_and_restores_train_mode():
    model = TableModel()
    selector = Selector(
        dataset(),
        selection=SelectionConfig(preset="vit"),
        epochs=EPOCHS,
        model=model,
        loss_fn=loss_fn,
        score_batch_size=50,
    )
    model.train()
    selector.begin_epoch(0)
    assert model.calls == [(False, False)] * 3  # 103 samples in batches of 50
    assert model.training
    assert selector.metrics()["samples_scored"] == N


def test_the_scoring_pass_reads_score_dataset_where_given():
    """E.g. the training set without augmentation: item i of both is sample i."""
    model = TableModel()
    score_set = TensorDataset(torch.arange(N) * 0)  # every item reads as sample 0
    selector = Selector(
        dataset(),
        selection=SelectionConfig(preset="vit"),
        epochs=EPOCHS,
        model=model,
        loss_fn=loss_fn,
        score_dataset=score_set,
    )
    selector.begin_epoch(0)
    assert torch.equal(selector.scores, losses_at(0)[torch.zeros(N, dtype=torch.long)])
    with pytest.raises(ValueError, match="score_dataset has 3 items"):
        Selector(
            dataset(),
            selection=SelectionConfig(preset="vit"),
            epochs=EPOCHS,
            score_dataset=TensorDataset(torch.arange(3)),
        )


def test_a_scoring_preset_without_model_is_refused_in_one_line():
    selector = Selector(dataset(), selection=SelectionConfig(preset="vit"), epochs=EPOCHS)
    with pytest.raises(ValueError, match="pass model= and loss_fn="):
        selector.begin_epoch(0)


def test_update_outside_an_epoch_is_refused():
    selector = Selector(dataset(), selection=SelectionConfig(preset="llm"), epochs=EPOCHS)
    with pytest.raises(RuntimeError, match="begin_epoch"):
        selector.update(torch.ones(4))


def test_update_without_the_selectors_sampler_is_refused():
    model = TableModel()
    selector = Selector(dataset(), selection=SelectionConfig(preset="llm"), epochs=EPOCHS)
    selector.begin_epoch(0)
    batch = next(iter(DataLoader(dataset(), batch_size=8)))
    with pytest.raises(RuntimeError, match="sampler=selector.sampler"):
        selector.update(loss_fn(model, batch))


def test_explicit_indices_and_any_collate_fn():
    """A collate_fn that keeps no trace of the items' positions: the sampler's order still says
    which samples a batch holds; explicit indices give the same table."""
    config = SelectionConfig(preset="llm")
    tables = []
    for explicit in (False, True):
        model = TableModel()
        selector = Selector(dataset(), selection=config, epochs=EPOCHS)
        loader = DataLoader(
            dataset(),
            batch_size=10,
            sampler=selector.sampler,
            collate_fn=lambda items: {"x": torch.stack([item[0] for item in items])},
        )
        for epoch in range(3):
            model.epoch = epoch
            selector.begin_epoch(epoch)
            for batch in loader:
                losses = model(batch["x"])
                selector.update(losses, batch["x"] if explicit else None)
            selector.end_epoch()
        tables.append(selector.scores.clone())
    assert torch.equal(tables[0].nan_to_num(-1), tables[1].nan_to_num(-1))
    assert not torch.isnan(tables[0]).all()


def test_batches_from_worker_processes_arrive_in_the_samplers_order():
    """DataLoader workers (in_order, its default): update() still pairs losses and samples."""
    config = SelectionConfig(preset="llm")
    model = TableModel()
    selector = Selector(dataset(), selection=config, epochs=EPOCHS, seed=4)
    loader = selector.loader(batch_size=8, num_workers=2)
    for epoch in range(EPOCHS):
        model.epoch = epoch
        selector.begin_epoch(epoch)
        for batch in loader:
            selector.update(loss_fn(model, batch))
        selector.end_epoch()
    assert torch.equal(selector.scores, run_reference_loop(config, seed=4)["table"])


# --- (c) resume -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["vit", "random"])
def test_a_resumed_loop_draws_the_same_subsets(name):
    config, epochs = SelectionConfig(**CONFIGS[name]), 4
    model = TableModel()
    whole = Selector(dataset(), selection=config, epochs=epochs, seed=2, model=model, loss_fn=loss_fn)
    uninterrupted = run_selector(whole, model, range(epochs))

    model = TableModel()
    first = Selector(dataset(), selection=config, epochs=epochs, seed=2, model=model, loss_fn=loss_fn)
    run_selector(first, model, range(2))
    state = first.state_dict()
    resumed = Selector(dataset(), selection=config, epochs=epochs, seed=2, model=model, loss_fn=loss_fn)
    resumed.load_state_dict(state)
    assert resumed.next_epoch == 2
    rest = run_selector(resumed, model, range(resumed.next_epoch, epochs))
    assert rest["checksums"] == uninterrupted["checksums"][2:]
    for a, b in zip(rest["subsets"], uninterrupted["subsets"][2:]):
        assert torch.equal(a, b)
    assert rest["metrics"][-1]["samples_backpropagated"] == uninterrupted["metrics"][-1]["samples_backpropagated"]


# --- (d) full data is plain training --------------------------------------------------------------------
def test_full_returns_the_plain_mean_and_every_index_once_per_epoch():
    model = TableModel()
    selector = Selector(dataset(), selection=SelectionConfig(method="full"), epochs=3, model=model, loss_fn=loss_fn)
    loader = DataLoader(dataset(), batch_size=16, sampler=selector.sampler)
    for epoch in range(3):
        model.epoch = epoch
        selector.begin_epoch(epoch)
        seen = []
        for batch in loader:
            losses = loss_fn(model, batch)
            loss = selector.update(losses)
            assert torch.equal(loss, losses)  # every weight is 1
            seen += batch[0].tolist()
        selector.end_epoch()
        assert sorted(seen) == list(range(N))
        assert selector.metrics()["selected_ratio"] == 1.0
    assert model.calls and all(grad for grad, _ in model.calls)  # no scoring pass for full


# --- (e) planned_steps is what the loader yields -------------------------------------------------------
@pytest.mark.parametrize(
    "name,batch_size,drop_last,accumulation,world_size",
    [
        ("vit", 8, False, 1, 1),
        ("vit", 7, True, 3, 1),
        ("llm", 16, False, 2, 1),
        ("full", 10, False, 1, 1),
        ("vit", 8, False, 2, 2),
        ("anneal", 8, False, 1, 1),
    ],
)
def test_planned_steps_is_the_number_of_steps_taken(name, batch_size, drop_last, accumulation, world_size):
    config = SelectionConfig(
        **{**CONFIGS, "full": dict(method="full"), "anneal": dict(preset="vit", anneal=0.25)}[name]
    )
    model = TableModel()
    selector = Selector(
        dataset(), selection=config, epochs=EPOCHS, model=model, loss_fn=loss_fn, rank=0, world_size=world_size
    )
    planned = selector.planned_steps(batch_size, drop_last=drop_last, accumulation=accumulation)
    loader = DataLoader(dataset(), batch_size=batch_size, sampler=selector.sampler, drop_last=drop_last)
    steps = 0
    for epoch in range(EPOCHS):
        model.epoch = epoch
        selector.begin_epoch(epoch)
        batches = 0
        for batch in loader:
            selector.update(loss_fn(model, batch))
            batches += 1
        selector.end_epoch()
        steps += math.ceil(batches / accumulation)
    assert planned == steps > 0


def test_planned_steps_refuses_infobatch():
    with pytest.raises(ValueError, match="InfoBatch"):
        Selector(dataset(), selection=SelectionConfig(method="infobatch"), epochs=EPOCHS).planned_steps(8)


# --- (b) two gloo ranks ---------------------------------------------------------------------------------
def _rank_worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        model = TableModel()
        selector = Selector(
            dataset(), selection=SelectionConfig(preset="vit"), epochs=4, seed=5, model=model, loss_fn=loss_fn
        )
        assert (selector.rank, selector.world_size) == (rank, world)
        run = run_selector(selector, model, range(4), batch_size=6)
        torch.save(run, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_ranks_share_the_subset_and_split_it(tmp_path):
    mp.start_processes(
        _rank_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True, start_method=start_method()
    )
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    model = TableModel()
    single = run_selector(
        Selector(dataset(), selection=SelectionConfig(preset="vit"), epochs=4, seed=5, model=model, loss_fn=loss_fn),
        model,
        range(4),
    )
    assert r0["checksums"] == r1["checksums"] == single["checksums"]
    for a, b, s, t0, t1 in zip(r0["subsets"], r1["subsets"], single["subsets"], r0["trained"], r1["trained"]):
        assert torch.equal(a, b) and torch.equal(a, s)
        assert len(t0) == len(t1) == math.ceil(len(a) / 2)  # equal shards (padded)
        assert set(t0.tolist()) | set(t1.tolist()) == set(a.tolist())  # covering the subset
        assert len(set(t0.tolist()) & set(t1.tolist())) == 2 * len(t0) - len(a)  # disjoint but the padding
    # both ranks merged each other's scores: their tables equal the one-process table
    assert torch.equal(r0["table"].nan_to_num(-1), single["table"].nan_to_num(-1))
    assert torch.equal(r1["table"].nan_to_num(-1), single["table"].nan_to_num(-1))


# --- the example ----------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_plain_pytorch_example_runs_and_follows_the_ratio_schedule():
    assert_example_follows_the_vit_preset("plain_pytorch.py", "--batch-size", "32")
