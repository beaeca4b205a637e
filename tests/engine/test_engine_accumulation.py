"""Gradient accumulation accumulates: on two gloo ranks under accumulation 4, the engine's recipe
all-reduces the gradients once per optimiser step (counted with a DDP communication hook), not once
per micro-batch: the forward of every micro-batch but a window's last runs inside ``no_sync()`` with
its backward (on 9171ffd only the backward did, and DDP synchronised all four)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attent.engine.recipe import TrainingRecipe, WorkerContext
from torch.nn.parallel import DistributedDataParallel

from tests.engine.test_engine_recipe import digits
from tests.helpers.ranks import start_method


def _rank(rank: int, world: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        calls = []

        def counting(state, bucket):  # the default all-reduce, counted
            calls.append(1)
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0] / world)

        def wrap(model):
            ddp = DistributedDataParallel(model, bucket_cap_mb=1024)  # one bucket: one call per sync
            ddp.register_comm_hook(None, counting)
            return ddp

        # 300 digits over 2 ranks in micro-batches of 16 under a global batch of 128: accumulation 4
        recipe = TrainingRecipe(digits(300, batch_size=16, global_batch_size=128), WorkerContext(rank, world))
        recipe.setup(wrap_model=wrap)
        recipe.select(0)
        steps = recipe.train_one_epoch(0)
        torch.save({"calls": len(calls), "steps": steps, "micro": len(recipe.loader)}, os.path.join(out, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_one_gradient_all_reduce_per_optimiser_step_under_accumulation(tmp_path):
    mp.start_processes(_rank, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method=start_method())
    for rank in range(2):
        got = torch.load(tmp_path / f"{rank}.pt")
        assert got["micro"] == 10 and got["steps"] == 3  # 150 samples a rank: windows of 4, 4 and 2
        assert got["calls"] == got["steps"]  # one all-reduce per step (10, one per micro-batch, before)
