"""The library's side of a changed number of ranks: a Selector's state taken between epochs on two
gloo ranks resumes on one and on three with the uninterrupted run's subsets (the subsets are global,
each rank's shard is cut anew from the current world size), the vit preset's scoring passes included."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attent.selection.config import SelectionConfig

from tests.helpers.ranks import start_method
from tests.helpers.selector_loop import Selector, TableModel, dataset, loss_fn, run_selector

EPOCHS, RESUME_AT = 5, 2
VIT = SelectionConfig(preset="vit")


def _rank(rank: int, world: int, store: str, out: str, epochs: list[int], resume: str | None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        model = TableModel()
        selector = Selector(dataset(), selection=VIT, epochs=EPOCHS, seed=4, model=model, loss_fn=loss_fn)
        if resume:
            selector.load_state_dict(torch.load(resume))
        got = run_selector(selector, model, epochs)
        if rank == 0:
            torch.save(selector.state_dict(), os.path.join(out, "state.pt"))
        torch.save(
            {"checksums": got["checksums"], "trained": [len(t) for t in got["trained"]]},
            os.path.join(out, f"{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def run(tmp_path, name: str, world: int, epochs: list[int], resume: str | None = None) -> list[dict]:
    folder = tmp_path / name
    folder.mkdir()
    mp.start_processes(
        _rank,
        args=(world, str(folder / "store"), str(folder), epochs, resume),
        nprocs=world,
        start_method=start_method(),
    )
    return [torch.load(folder / f"{rank}.pt") for rank in range(world)]


@pytest.mark.timeout(300)
def test_a_two_rank_state_resumes_on_one_rank_and_on_three(tmp_path):
    whole = run(tmp_path, "whole", 2, list(range(EPOCHS)))
    run(tmp_path, "first", 2, list(range(RESUME_AT)))
    state = str(tmp_path / "first" / "state.pt")
    for world in (1, 3):
        ranks = run(tmp_path, f"on-{world}", world, list(range(RESUME_AT, EPOCHS)), state)
        for got in ranks:
            assert got["checksums"] == whole[0]["checksums"][RESUME_AT:]
        # each rank trains an equal shard of the subset, cut for this world size
        assert all(len({r["trained"][i] for r in ranks}) == 1 for i in range(EPOCHS - RESUME_AT))
