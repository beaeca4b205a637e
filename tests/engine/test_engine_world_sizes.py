"""A checkpoint written by two ranks resumes on one and on three: the same subsets as the
uninterrupted two-rank run (the subsets are global, the generator and the table in the state), the
global batch kept by recomputing the accumulation for the new number of ranks, and the learning rate
on the same curve (training progress in epochs). Real gloo ranks and the engine's own recipe on the
digits; Random's picks read no loss, so they are the same whatever the batching did to the weights."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import build_experiment
from torch.nn.parallel import DistributedDataParallel

from tests.helpers.ranks import start_method

EPOCHS, RESUME_AT, GLOBAL_BATCH = 4, 2, 96


def experiment():
    return build_experiment(
        {
            "name": "world-sizes",
            "seed": 3,
            "task": {
                "name": "vision",
                "dataset": "digits",
                "img_size": 8,
                "train_limit": 300,
                "model": {"preset": "vit_tiny_cpu", "patch_size": 2},
            },
            "train": {"epochs": EPOCHS, "batch_size": 16, "global_batch_size": GLOBAL_BATCH},
            "selection": {"strategy": "random", "ratio": {"kind": "incremental", "start": 0.3, "end": 0.9}},
        }
    )


def _rank(rank: int, world: int, store: str, out: str, epochs: list[int], resume: str | None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        recipe = TrainingRecipe(experiment(), WorkerContext(rank, world))
        recipe.setup(wrap_model=DistributedDataParallel)
        if resume:
            recipe.restore(torch.load(resume, weights_only=False))
        rates = []  # the learning rate of each epoch's last optimiser step
        for epoch in epochs:
            recipe.run_epoch(epoch)
            rates.append(recipe.optimizer.param_groups[0]["lr"])
        if rank == 0:
            torch.save(recipe.state_dict(), os.path.join(out, "state.pt"))
        subsets = [(r.epoch, r.indices.tolist()) for r in recipe.selector.history]
        torch.save(
            {"subsets": subsets, "accumulation": recipe.accumulation, "rates": rates},
            os.path.join(out, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def run(tmp_path, name: str, world: int, epochs: list[int], resume: str | None = None) -> dict:
    folder = tmp_path / name
    folder.mkdir()
    args = (world, str(folder / "store"), str(folder), epochs, resume)
    mp.start_processes(_rank, args=args, nprocs=world, start_method=start_method())
    return {"state": str(folder / "state.pt"), **torch.load(folder / "rank0.pt")}


@pytest.mark.timeout(300)
def test_a_two_rank_checkpoint_resumes_on_one_rank_and_on_three(tmp_path):
    whole = run(tmp_path, "whole", 2, list(range(EPOCHS)))
    first = run(tmp_path, "first", 2, list(range(RESUME_AT)))
    for world in (1, 3):
        resumed = run(tmp_path, f"on-{world}", world, list(range(RESUME_AT, EPOCHS)), first["state"])
        assert resumed["subsets"] == whole["subsets"]  # every pick, the checkpoint's and the later ones
        accumulation = -(-GLOBAL_BATCH // (16 * world))  # the global batch, whatever the ranks
        assert resumed["accumulation"] == accumulation and accumulation * 16 * world == GLOBAL_BATCH
        # the same learning-rate curve over the epochs resumed: progress in epochs, not in steps, so
        # each epoch ends at the rate of its progress (e + 1) / E whatever its steps on these ranks
        assert resumed["rates"] == whole["rates"][RESUME_AT:]
